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
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  echo "installing torch"
  "${PIP[@]}" install "${SWARM_NODE_TORCH:-torch==2.13.0}"
fi
stamp="$VENV/.swarm-node-installed$EXTRAS"
if [ ! -f "$stamp" ] || [ "$ROOT/pyproject.toml" -nt "$stamp" ]; then
  echo "installing swarm-node$EXTRAS"
  "${PIP[@]}" install -e "$ROOT$EXTRAS"
  touch "$stamp"
fi
