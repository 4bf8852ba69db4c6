"""A silo run with the base's own evaluation first, for ``scripts/gpu_check.sh``: what the GPU goals read.

Usage: python scripts/dev/gpu_silo.py -c configs/smollm2-silo.yaml [--json OUT] [KEY=VALUE ...]

Builds the node of the config (overrides as ``swarm-node silo`` takes them), evaluates the held-out tasks
greedily before any update (the LoRA's B starts at zero: the policy is the base), then trains. Prints one
line of figures and, with ``--json``, writes them: the base's greedy reward, the greedy reward at each
evaluation, seconds from the first step to each evaluated step (evaluations excluded), the median step,
the median seconds of a step's sampling and of its training (where a step's time goes), the generation
tokens/s, and the engine/trainer log-prob gap.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from node.api.metrics import read_metrics  # noqa: E402
from node.config import load_config  # noqa: E402
from node.run.node import Node  # noqa: E402


def figures(rows: list[dict[str, Any]], base: float, base_seconds: float) -> dict[str, Any]:
    steps = [r for r in rows if isinstance(r.get("step_seconds"), (int, float))]
    evals = {int(r["step"]): float(r["eval_accuracy"]) for r in rows if isinstance(r.get("eval_accuracy"), float)}
    elapsed, clock = {}, 0.0
    for r in steps:
        clock += float(r["step_seconds"])
        elapsed[int(r["step"])] = clock

    def median(key: str) -> float | None:
        values = [float(r[key]) for r in steps if isinstance(r.get(key), (int, float))]
        return statistics.median(values) if values else None

    gen = [float(r["gen_tokens_per_s"]) for r in rows if isinstance(r.get("gen_tokens_per_s"), (int, float))]
    gaps = [float(r["train/logprob_gap_abs"]) for r in rows if isinstance(r.get("train/logprob_gap_abs"), float)]
    return {"base_greedy": base, "base_eval_seconds": base_seconds, "greedy": evals,
            "gain_points": {s: 100 * (v - base) for s, v in evals.items()},
            "seconds_to_step": {s: elapsed.get(s) for s in evals},
            "median_step_seconds": median("step_seconds"), "median_gen_seconds": median("gen_seconds"),
            "median_train_seconds": median("train_seconds"),
            "gen_tokens_per_s": statistics.median(gen) if gen else None,
            "logprob_gap_abs": statistics.median(gaps) if gaps else None, "steps": len(steps)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-c", "--config", required=True)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    cfg = load_config(args.config, args.overrides)
    node = Node(cfg, show_progress=False)
    try:
        node.setup()
        t0 = time.perf_counter()
        base = node.evaluate()
        base_seconds = time.perf_counter() - t0
        print(f"gpu_silo: base greedy reward {base:.3f} ({base_seconds:.1f} s)", flush=True)
        node.run()
    finally:
        node.close()
    out = figures(read_metrics(Path(cfg.run_dir) / "metrics.jsonl"), base, base_seconds)
    print("gpu_silo: " + json.dumps(out), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
