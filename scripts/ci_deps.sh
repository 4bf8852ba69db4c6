#!/usr/bin/env bash
# System packages the test suite uses beyond Python: Chromium, for the dashboard's browser tests
# (tests/node/test_api.py, tests/node/test_api_swarm.py), from Debian's `chromium` package. Idempotent;
# called by .ci/run, which then sets SWARM_NODE_REQUIRE_CHROMIUM=1 so a missing browser fails the run
# instead of skipping the tests. Exits non-zero when Chromium is missing and cannot be installed (needs
# root, or password-less sudo, and apt-get).
set -euo pipefail
have_chromium() {
  local name
  for name in chromium chromium-browser; do
    command -v "$name" >/dev/null 2>&1 && return 0
  done
  return 1
}
if have_chromium; then exit 0; fi
if [ "$(id -u)" = 0 ]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  as_root=(sudo -n)
else
  echo "ci_deps: no Chromium, and no root or password-less sudo to install it (apt-get install chromium)" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "ci_deps: no Chromium and no apt-get; install Chromium with this system's package manager" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
echo "ci_deps: installing chromium (Debian package)"
# A clean image has no package lists yet: update first when the plain install cannot find the package.
"${as_root[@]}" apt-get install -y -q chromium >/dev/null 2>&1 || {
  "${as_root[@]}" apt-get update -q >/dev/null
  "${as_root[@]}" apt-get install -y -q chromium >/dev/null
}
have_chromium || { echo "ci_deps: apt-get installed chromium but it is not on PATH" >&2; exit 1; }
echo "ci_deps: $(chromium --version 2>/dev/null || echo chromium installed)"
