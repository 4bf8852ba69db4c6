#!/usr/bin/env bash
# System packages the test suite uses beyond Python, from Debian: Chromium for the dashboard's browser
# tests (tests/node/test_api*.py), iproute2 and nftables for the network-namespace tests (NAT, partition),
# and the lint of scripts/gpu_check.sh by shellcheck (tests/test_gpu_check.py).
# Installs only what is missing; needs root (or password-less sudo) and apt-get. Called by .ci/run, which
# then sets SWARM_NODE_REQUIRE_CHROMIUM=1, SWARM_NODE_NETNS=require and SWARM_NODE_REQUIRE_SHELLCHECK=1 so
# those tests fail, never skip.
# Exits non-zero when something is missing and cannot be installed.
set -euo pipefail
have_chromium() {
  local name
  for name in chromium chromium-browser; do
    command -v "$name" >/dev/null 2>&1 && return 0
  done
  return 1
}
want=()
have_chromium || want+=(chromium)
command -v ip >/dev/null 2>&1 || want+=(iproute2)
command -v nft >/dev/null 2>&1 || want+=(nftables)
command -v shellcheck >/dev/null 2>&1 || want+=(shellcheck)
[ ${#want[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  as_root=(sudo -n)
else
  echo "ci_deps: missing ${want[*]}, and no root or password-less sudo to install them (apt-get install ${want[*]})" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "ci_deps: missing ${want[*]} and no apt-get; install them with this system's package manager" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
echo "ci_deps: installing ${want[*]} (Debian packages)"
# A clean image has no package lists yet: update first when the plain install cannot find the packages.
"${as_root[@]}" apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends "${want[@]}" >/dev/null 2>&1 || {
  "${as_root[@]}" apt-get -o DPkg::Lock::Timeout=600 update -q >/dev/null
  "${as_root[@]}" apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends "${want[@]}" >/dev/null
}
have_chromium || { echo "ci_deps: apt-get installed chromium but it is not on PATH" >&2; exit 1; }
command -v ip >/dev/null 2>&1 && command -v nft >/dev/null 2>&1 || { echo "ci_deps: ip or nft still missing" >&2; exit 1; }
command -v shellcheck >/dev/null 2>&1 || { echo "ci_deps: shellcheck still missing" >&2; exit 1; }
echo "ci_deps: $(chromium --version 2>/dev/null || echo chromium installed)"
