# Sourced by demo.sh and test.sh: create .venv if missing and install the project into it.
# torch is installed first from a pinned CPU-friendly version, so the range in pyproject.toml is already
# satisfied and pip does not pull a multi-GB CUDA build; set SWARM_NODE_TORCH to choose another.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${SWARM_NODE_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
EXTRAS="${1:-}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "creating virtualenv $VENV"
  "$PY" -m venv "$VENV"
fi
source "$ROOT/scripts/dev/pip_progress.sh"
INSTALL=("$VENV/bin/python" -m pip --disable-pip-version-check install --progress-bar off)
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  pip_progress "torch (${SWARM_NODE_TORCH:-torch==2.13.0})" "${INSTALL[@]}" "${SWARM_NODE_TORCH:-torch==2.13.0}"
fi
stamp="$VENV/.swarm-node-installed$EXTRAS"
if [ ! -f "$stamp" ] || [ "$ROOT/pyproject.toml" -nt "$stamp" ]; then
  pip_progress "swarm-node$EXTRAS and its dependencies" "${INSTALL[@]}" -e "$ROOT$EXTRAS"
  touch "$stamp"
fi
