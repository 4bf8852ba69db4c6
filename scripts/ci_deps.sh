#!/usr/bin/env bash
# System packages the test suite needs beyond Python: iproute2 and nftables for the network-namespace
# tests (NAT, partition). Installs only what is missing, from Debian; needs root (CI runs as root).
# Without root or apt-get it changes nothing and says so: those tests then skip with a reason, or, where
# SWARM_NODE_NETNS=require (set by .ci/run), this script fails, as those tests would.
set -euo pipefail
want=()
command -v ip >/dev/null 2>&1 || want+=(iproute2)
command -v nft >/dev/null 2>&1 || want+=(nftables)
[ ${#want[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  if [ "${SWARM_NODE_NETNS:-}" = require ]; then
    echo "ci_deps: cannot install ${want[*]} (needs root and apt-get), and SWARM_NODE_NETNS=require" >&2
    exit 1
  fi
  echo "ci_deps: cannot install ${want[*]} (needs root and apt-get); the namespace tests will skip" >&2
  exit 0
fi
echo "ci_deps: installing ${want[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get -o DPkg::Lock::Timeout=600 update -qq >/dev/null
apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${want[@]}" >/dev/null
