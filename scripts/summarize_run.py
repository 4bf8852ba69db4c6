"""Print a short summary of a run directory: reward over the first and last steps, eval accuracy."""

from __future__ import annotations

import argparse
from pathlib import Path

from node.metrics import read_metrics


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("run_dir")
    ap.add_argument("--window", type=int, default=25)
    args = ap.parse_args()
    rows = read_metrics(Path(args.run_dir) / "metrics.jsonl")
    if not rows:
        print(f"no metrics in {args.run_dir}")
        return
    w = min(args.window, max(len(rows) // 2, 1))
    first = sum(r["reward_mean"] for r in rows[:w]) / w
    last = sum(r["reward_mean"] for r in rows[-w:]) / w
    evals = [(r["step"], r["eval_accuracy"]) for r in rows if r.get("eval_accuracy") is not None]
    print(f"steps: {rows[-1]['step']}  sampled reward: first {w} steps {first:.3f} -> last {w} steps {last:.3f} "
          f"({100 * (last - first):+.1f} points)")
    if evals:
        print("greedy eval accuracy: " + ", ".join(f"step {s}: {a:.3f}" for s, a in evals))
    print(f"metrics: {Path(args.run_dir) / 'metrics.jsonl'}  checkpoints: {Path(args.run_dir) / 'checkpoints'}")


if __name__ == "__main__":
    main()
