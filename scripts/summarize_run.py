"""Print a short summary of a run directory: reward over the first and last steps, eval accuracy, the median
step time and peak memory, and the sampler/trainer log-prob gap when the metrics have them."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from node.api.metrics import read_metrics


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("run_dir")
    ap.add_argument("--window", type=int, default=25)
    args = ap.parse_args(argv)
    path = Path(args.run_dir) / "metrics.jsonl"
    if not path.is_file():
        what = "no run dir" if not Path(args.run_dir).is_dir() else "no metrics.jsonl in"
        print(f"summarize_run: error: {what} {args.run_dir!r}; pass the --run-dir of a node that has run "
              "(e.g. runs/demo)", file=sys.stderr)
        return 2
    rows = read_metrics(path)
    if not rows:
        print(f"no metrics in {args.run_dir}")
        return 0
    w = min(args.window, max(len(rows) // 2, 1))
    first = sum(r["reward_mean"] for r in rows[:w]) / w
    last = sum(r["reward_mean"] for r in rows[-w:]) / w
    evals = [(r["step"], r["eval_accuracy"]) for r in rows if r.get("eval_accuracy") is not None]
    print(f"steps: {rows[-1]['step']}  sampled reward: first {w} steps {first:.3f} -> last {w} steps {last:.3f} "
          f"({100 * (last - first):+.1f} points)")
    if evals:
        print("greedy eval accuracy: " + ", ".join(f"step {s}: {a:.3f}" for s, a in evals))
    steps = sorted(float(r["step_seconds"]) for r in rows if isinstance(r.get("step_seconds"), (int, float)))
    gaps = [float(r["train/logprob_gap_abs"]) for r in rows if isinstance(r.get("train/logprob_gap_abs"), float)]
    kls = [float(r["train/logprob_gap_kl"]) for r in rows if isinstance(r.get("train/logprob_gap_kl"), float)]
    peak = max((int(r["peak_rss_mb"]) for r in rows if isinstance(r.get("peak_rss_mb"), int)), default=None)
    if steps:
        print(f"step time: median {steps[len(steps) // 2]:.1f} s" + (f"; peak resident memory {peak} MB" if peak else ""))
    if gaps:
        print(f"sampler/trainer log-prob gap: mean {sum(gaps) / len(gaps):.2e} a token (k3 KL {sum(kls) / len(kls):.2e})")
    print(f"metrics: {path}  checkpoints: {Path(args.run_dir) / 'checkpoints'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
