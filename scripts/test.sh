#!/usr/bin/env bash
# Create the venv if missing, install with the dev extra, then lint, type-check and test.
# Extra arguments go to pytest, e.g.: scripts/test.sh -m slow   or   scripts/test.sh tests/protocol
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh" "[dev]"
cd "$ROOT"
echo "== ruff"
"$VENV/bin/ruff" check .
echo "== mypy (strict on protocol/ and swarm/)"
"$VENV/bin/mypy" protocol swarm node
echo "== pytest"
"$VENV/bin/pytest" "$@"
