#!/usr/bin/env bash
# System packages the test suite uses beyond Python: Chromium, for the dashboard's browser test
# (tests/node/test_api.py). Installs it with apt-get when it is missing and we are root; otherwise says
# that the browser test will be skipped. Idempotent; called by .ci/run.
set -euo pipefail
for name in chromium chromium-browser; do
  if command -v "$name" >/dev/null 2>&1; then exit 0; fi
done
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "ci_deps: no Chromium and no root apt-get to install it; the browser test will be skipped" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
echo "ci_deps: installing chromium"
apt-get install -y -q chromium >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; }
