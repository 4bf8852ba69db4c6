"""What TensorBoard and Weights & Biases tracking cost a training step, measured side by side in one run.

One silo node (``configs/tiny-silo.yaml`` unless ``-c``) trains in rounds; in each round every arm
(``none``, ``tensorboard``, ``wandb`` in offline mode, ``both``) runs ``--steps`` steps, in an order that
rotates from round to round, so drift in the machine's load hits every arm alike. A step is timed from
the start of ``train_step`` to its return (the tracker's ``log`` included; W&B's writer is a separate
process, whose CPU competes with training on the same cores). Prints each arm's median step time, its
ratio to ``none`` (the median of the per-round ratios, and the ratio of medians), the time spent in the
trackers' ``log`` a step on the training thread and its share of a step, the CPU time W&B's writer
process used a step, the CPU time of a step (this process and its children) against the untracked arm of
the same round, and the load average before and after. On a loaded machine the step-time ratios carry
that machine's noise; CPU time a step depends far less on it.

    python scripts/bench/bench_tracking.py --rounds 8 --steps 10
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

ARMS = ("none", "tensorboard", "wandb", "both")


def _own_cpu() -> float:
    """CPU seconds (user + system) this process has used, all its threads."""
    t = os.times()
    return t.user + t.system


def _children_cpu() -> float:
    """CPU seconds (user + system) used so far by this process's child processes (W&B's service)."""
    import psutil

    total = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            times = child.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-c", "--config", default=str(ROOT / "configs" / "tiny-silo.yaml"))
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10, help="steps of each arm in a round")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    os.environ.setdefault("WANDB_SILENT", "true")

    import torch

    from node.config import load_config
    from node.run.node import Node
    from node.run.tracking import TensorBoardTracker, Trackers, WandbTracker

    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-tracking-") as tmp:
        run_dir = Path(tmp) / "run"
        cfg = load_config(args.config, [f"run_dir={run_dir}", "train.steps=1000000", "train.checkpoint_every=1000000",
                                        "tracking.wandb.mode=offline", "tracking.wandb.project=bench-tracking",
                                        *args.overrides])
        node = Node(cfg, show_progress=False)
        node.setup()
        tb, wb = TensorBoardTracker(run_dir, 0), WandbTracker(cfg, run_dir)
        every = cfg.tracking.histogram_every
        arms = {"none": [], "tensorboard": [tb], "wandb": [wb], "both": [tb, wb]}
        log_seconds: dict[str, list[float]] = {arm: [] for arm in ARMS}
        times: dict[str, list[float]] = {arm: [] for arm in ARMS}
        per_round: dict[str, list[float]] = {arm: [] for arm in ARMS}
        helper_cpu: dict[str, list[float]] = {arm: [] for arm in ARMS}
        cpu_ratio: dict[str, list[float]] = {arm: [] for arm in ARMS}
        cpu_step: dict[str, float] = {}
        log_cpu: dict[str, list[float]] = {arm: [] for arm in ARMS}
        cpu_none: list[float] = []
        try:
            for _ in range(args.warmup):
                node.train_step()
            for r in range(args.rounds):
                order = ARMS[r % len(ARMS):] + ARMS[: r % len(ARMS)]
                medians = {}
                for arm in order:
                    trackers = Trackers(list(arms[arm]), every)
                    spent = [0.0, 0.0]  # wall, CPU of the training thread
                    real_log = trackers.log

                    def timed_log(step, row, histograms=None, real_log=real_log, spent=spent):
                        t, c = time.perf_counter(), time.thread_time()
                        real_log(step, row, histograms)
                        spent[0] += time.perf_counter() - t
                        spent[1] += time.thread_time() - c

                    trackers.log = timed_log  # type: ignore[method-assign]
                    node.tracking = trackers
                    mine = []
                    cpu0, own0 = _children_cpu(), _own_cpu()
                    for _ in range(args.steps):
                        t0 = time.perf_counter()
                        node.train_step()
                        mine.append(time.perf_counter() - t0)
                    helper_cpu[arm].append((_children_cpu() - cpu0) / args.steps)
                    cpu_step[arm] = (_own_cpu() - own0 + _children_cpu() - cpu0) / args.steps
                    times[arm] += mine
                    medians[arm] = statistics.median(mine)
                    log_seconds[arm].append(spent[0] / args.steps)
                    log_cpu[arm].append(spent[1] / args.steps)
                cpu_none.append(cpu_step["none"])
                for arm in ARMS:
                    per_round[arm].append(medians[arm] / medians["none"])
                    cpu_ratio[arm].append(cpu_step[arm] / cpu_step["none"])
                print(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{a} {medians[a] * 1000:.1f} ms" for a in ARMS),
                      flush=True)
        finally:
            node.tracking = Trackers([tb, wb], every)
            node.close()
    load_after = os.getloadavg()
    base = statistics.median(times["none"])
    print(f"\n{args.rounds} rounds x {args.steps} steps per arm, torch threads {torch.get_num_threads()}, "
          f"histograms every {every} steps")
    print(f"{'arm':<12} {'median step':>12} {'ratio of medians':>17} {'per-round ratio (median, range)':>34} "
          f"{'log() a step':>13} {'share':>6} {'helper CPU a step':>18}")
    for arm in ARMS:
        rounds = per_round[arm]
        log_ms = statistics.mean(log_seconds[arm]) * 1000
        print(f"{arm:<12} {statistics.median(times[arm]) * 1000:>9.1f} ms {statistics.median(times[arm]) / base:>17.3f} "
              f"{statistics.median(rounds):>14.3f} ({min(rounds):.3f} to {max(rounds):.3f}) "
              f"{log_ms:>10.2f} ms {log_ms / (base * 1000):>6.2%} {statistics.mean(helper_cpu[arm]) * 1000:>15.2f} ms")
    print("log() a step: time in the trackers' log() on the training thread; share: of the median step without "
          "tracking; helper CPU: CPU time of child processes (W&B's writer) a step")
    print("CPU a step (this process, all its threads, plus its child processes), against the arm without tracking "
          "in the same round:")
    for arm in ARMS[1:]:
        ratios = cpu_ratio[arm]
        print(f"  {arm:<12} median {statistics.median(ratios):.3f} (range {min(ratios):.3f} to {max(ratios):.3f}); "
              f"log() CPU on the training thread {statistics.mean(log_cpu[arm]) * 1000:.2f} ms a step")
    print(f"CPU a step without tracking: {statistics.median(cpu_none) * 1000:.1f} ms (median over rounds)")
    print("load average before " + "/".join(f"{x:.2f}" for x in load_before) + ", after "
          + "/".join(f"{x:.2f}" for x in load_after))
    return 0


if __name__ == "__main__":
    sys.exit(main())
