#!/usr/bin/env bash
# Soak a local swarm: N real node processes on 127.0.0.1 for MINUTES, then per-node steps, batches,
# RSS (start/mid/end) and p2pd RSS, and a check that no process is left behind (see scripts/lab/soak.py).
# Usage: scripts/soak.sh N MINUTES [key=value ...]      e.g. scripts/soak.sh 16 30
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: scripts/soak.sh N MINUTES [key=value ...]" >&2; exit 2; }
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/dev/venv.sh" "[dev]"
cd "$ROOT"
exec "$VENV/bin/python" scripts/lab/soak.py "$@"
