#!/usr/bin/env bash
# Create the venv if missing, install, and run a silo node on the embedded tiny model.
# Extra arguments are config overrides, e.g.: scripts/demo.sh train.steps=50
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/dev/venv.sh" ""
cd "$ROOT"
RUN_DIR="${RUN_DIR:-runs/demo}"
"$VENV/bin/swarm-node" silo --config configs/tiny-silo.yaml --run-dir "$RUN_DIR" "$@"
"$VENV/bin/python" scripts/summarize_run.py "$RUN_DIR"
V="${VENV#"$ROOT"/}"  # relative to the repository root when the venv is the default .venv
echo
echo "swarm-node is installed in $V, not on your PATH. For the README's commands, from $ROOT either"
echo "  source $V/bin/activate        # then: swarm-node silo -c configs/tiny-silo.yaml ..."
echo "or call it by its path:"
echo "  $V/bin/swarm-node start -c configs/tiny-swarm.yaml --run-dir runs/n0"
