# Sourced by venv.sh: `pip_progress WHAT COMMAND...` runs a pip install and shows where it stands without
# printing pip's hundred lines. On a terminal one status line is rewritten in place (the package being
# collected or downloaded, then the unpacking); elsewhere (CI logs) one line every tenth package. pip's
# warnings and errors (its stderr) pass through as they are, and its exit status is returned.
pip_progress() {
  local what=$1 started=$SECONDS statuses
  shift
  echo "installing $what: this takes minutes on a fresh machine (pip downloads and unpacks each package)"
  "$@" | _pip_progress_lines && statuses=("${PIPESTATUS[@]}") || statuses=("${PIPESTATUS[@]}")
  if [ "${statuses[0]}" -eq 0 ]; then
    echo "installed $what in $((SECONDS - started)) s"
  fi
  return "${statuses[0]}"
}

# Reads pip's output (stdout) and prints the status lines described above.
_pip_progress_lines() {
  local line status="" shown=0 n=0 tty=0 width=${COLUMNS:-100}
  if [ -t 1 ]; then tty=1; fi
  while IFS= read -r line; do
    case "$line" in
      Collecting*|Processing*|Obtaining*)  # a package from the index, a local wheel, the project itself
        n=$((n + 1)); status="  [$n] ${line,}"; shown=$((n % 10 == 1));;
      *Downloading*) status="  [$n] downloading ${line##*Downloading }"; shown=0;;
      "Installing collected packages:"*)
        status="  unpacking and installing $(($(tr -cd ',' <<<"$line" | wc -c) + 1)) packages"; shown=1;;
      "Successfully installed"*) status="  done: $(($(wc -w <<<"$line") - 2)) packages installed"; shown=1;;
      *) continue;;
    esac
    if [ "$tty" -eq 1 ]; then
      printf '\r\033[K%s' "${status:0:$((width - 1))}"
    elif [ "$shown" -eq 1 ]; then
      echo "$status"
    fi
  done
  if [ "$tty" -eq 1 ] && [ -n "$status" ]; then printf '\r\033[K%s\n' "${status:0:$((width - 1))}"; fi
  return 0
}
