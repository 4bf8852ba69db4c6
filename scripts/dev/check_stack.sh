#!/usr/bin/env bash
# The lowest versions of transformers, peft and tokenizers that pyproject.toml admits (a stock CUDA image's:
# transformers 5.17, peft 0.21, tokenizers 0.23.2), in a venv of their own (.venv-lowest): smollm2-135m
# converted from an empty cache by that transformers and checked against its GGUF and golden record,
# `swarm-node doctor`, and the tests of conversion, loading, doctor and one smollm2 silo step, and the fused
# training pass against that transformers' and peft's modules on each family (its arithmetic copies theirs), and
# the family matrix (tests/node/test_families.py: the GGUFs 5.17 cannot convert are refused in one line).
# .ci/run runs it beside scripts/test.sh; SWARM_NODE_STACK=skip leaves it out.
# torch: SWARM_NODE_STACK_TORCH (default torch==2.13.0, the CPU build scripts/dev/venv.sh installs; the
# lowest admitted, torch==2.11.0, is PyPI's CUDA build with 3.4 GB of CUDA libraries: set it to run that).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
if [ "${SWARM_NODE_STACK:-}" = "skip" ]; then
  echo "SWARM_NODE_STACK=skip: not checking the lowest admitted versions"
  exit 0
fi
VENV="${SWARM_NODE_STACK_VENV:-$ROOT/.venv-lowest}"
PY="${PYTHON:-python3}"
TORCH="${SWARM_NODE_STACK_TORCH:-torch==2.13.0}"
# "name>=X" of each library in pyproject.toml becomes "name==X"
PINS=$("$PY" - "$ROOT/pyproject.toml" <<'PYEOF'
import re, sys
text = open(sys.argv[1]).read()
for name in ("transformers", "peft", "tokenizers"):
    match = re.search(r'"%s>=([0-9][^,"]*)' % name, text)
    if match is None:
        sys.exit(f"pyproject.toml states no lower bound for {name}")
    print(f"{name}=={match.group(1)}")
PYEOF
)
if [ ! -x "$VENV/bin/python" ]; then
  echo "creating virtualenv $VENV"
  "$PY" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
stamp="$VENV/.swarm-node-stack-$(echo "$TORCH $PINS" | tr -c 'a-zA-Z0-9.=\n' '_' | tr '\n' '_')"
if [ ! -f "$stamp" ] || [ "$ROOT/pyproject.toml" -nt "$stamp" ]; then
  echo "installing $TORCH $(echo $PINS) and swarm-node[dev] into $VENV"
  constraints="$VENV/stack-constraints.txt"
  printf '%s\n' "$TORCH" $PINS > "$constraints"
  "${PIP[@]}" install "$TORCH"
  "${PIP[@]}" install -c "$constraints" $PINS -e "${ROOT}[dev]"
  rm -f "$VENV"/.swarm-node-stack-*
  touch "$stamp"
fi
"$VENV/bin/python" -c "import torch, transformers, peft, tokenizers; print('stack: torch', torch.__version__, \
'transformers', transformers.__version__, 'peft', peft.__version__, 'tokenizers', tokenizers.__version__)"
cache=$(mktemp -d "${TMPDIR:-/tmp}/swarm-node-stack-cache.XXXXXX")
trap 'rm -rf "$cache"' EXIT
export SWARM_NODE_CACHE="$cache"  # converted here by this transformers, not reused from the main cache
cd "$ROOT"
"$VENV/bin/swarm-node" fetch smollm2-135m
"$VENV/bin/swarm-node" doctor --no-vllm
"$VENV/bin/pytest" -q -p no:cacheprovider tests/node/test_model_check.py tests/node/test_doctor.py \
  tests/node/test_gguf.py tests/node/test_smollm2.py tests/node/test_fused_families.py tests/node/test_fused_pass.py \
  tests/node/test_families.py tests/node/test_family_ingest.py
