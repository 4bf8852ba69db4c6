"""A ReMix node's step against a LoRA node's, side by side in one process: CPU seconds and operators.

Usage: python scripts/bench/bench_remix_node.py -c CONFIG [--warmup 1] [--steps 3] [--threads 1]
                                              [--remix KEY=VALUE ...] [--json OUT] [KEY=VALUE ...]

Builds two silo nodes from CONFIG and the overrides (a temporary run dir each, no evaluations): ``lora``,
the config's adapter, and ``remix``, the same with ``adapter.kind=remix`` and the ``--remix`` overrides
(e.g. ``adapter.rank=8`` for the same active rank as a rank-16 LoRA with k = 2). After ``--warmup`` steps
each, they take ``--steps`` steps in turns (the order rotating), so that the machine's load falls on both
alike; each phase is timed in wall and in CPU seconds of the process (CPU time moves far less than wall
time with the load of a shared machine). Then one more step of each runs under ``torch.profiler`` to count
its operators by phase (``aten::`` calls, nested ones included: on a GPU each is a launch or part of one).
Prints the medians and the ratios remix / lora: step, sampling (generation and scoring), training, and
generation CPU seconds a generated token (the inverse of tokens/s). Both nodes sample the same tasks with
the same seed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from node.config import load_config
from node.run.node import Node

ARMS = ("lora", "remix")


class Timed:
    """Wraps ``obj.attr``: wall and process CPU seconds of each call since the last ``take()``."""

    def __init__(self, obj: Any, attr: str) -> None:
        self.wall = self.cpu = 0.0
        inner: Callable[..., Any] = getattr(obj, attr)

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            w, c = time.perf_counter(), time.process_time()
            try:
                with torch.profiler.record_function(f"phase:{attr}"):
                    return inner(*args, **kwargs)
            finally:
                self.wall += time.perf_counter() - w
                self.cpu += time.process_time() - c

        setattr(obj, attr, wrapped)

    def take(self) -> tuple[float, float]:
        out = (self.wall, self.cpu)
        self.wall = self.cpu = 0.0
        return out


def count_ops(node: Node) -> dict[str, int]:
    """Operators of one step by phase (generate, train, other), under the profiler."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        node.train_step()
    events = prof.events()
    ranges = [(e.name.split(":", 1)[1], e.time_range.start, e.time_range.end) for e in events
              if e.name.startswith("phase:")]
    out = {"generate": 0, "step": 0, "other": 0}
    for e in events:
        if not e.name.startswith("aten::"):
            continue
        phase = next((label for label, s, t in ranges if s <= e.time_range.start <= t), "other")
        out[phase] += 1
    return {"generate": out["generate"], "train": out["step"], "other": out["other"], "all": sum(out.values())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-c", "--config", required=True)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (both nodes)")
    parser.add_argument("--remix", nargs="*", default=[], help="overrides of the remix node only (KEY=VALUE)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows: dict[str, list[dict[str, float]]] = {arm: [] for arm in ARMS}
    ops: dict[str, dict[str, int]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        nodes: dict[str, Node] = {}
        timers: dict[str, tuple[Timed, Timed]] = {}
        total = args.warmup + args.steps + 2
        for arm in ARMS:
            extra = ["adapter.kind=remix", *args.remix] if arm == "remix" else []
            cfg = load_config(args.config, [*args.overrides, *extra, f"run_dir={tmp}/{arm}", f"train.steps={total}",
                                            "train.eval_every=0", f"train.checkpoint_every={total}"])
            nodes[arm] = Node(cfg, show_progress=False)
            nodes[arm].setup()
            timers[arm] = (Timed(nodes[arm].generator, "generate"), Timed(nodes[arm].trainer, "step"))
        try:
            for arm in ARMS:
                for _ in range(args.warmup):
                    nodes[arm].train_step()
                for t in timers[arm]:
                    t.take()
            for rep in range(args.steps):
                for arm in (ARMS if rep % 2 == 0 else ARMS[::-1]):
                    w, c = time.perf_counter(), time.process_time()
                    record = nodes[arm].train_step()
                    step_wall, step_cpu = time.perf_counter() - w, time.process_time() - c
                    (gen_wall, gen_cpu), (train_wall, train_cpu) = (t.take() for t in timers[arm])
                    tokens = record["gen_tokens_per_s"] * record["gen_seconds"]
                    rows[arm].append({"step_wall": step_wall, "step_cpu": step_cpu, "gen_wall": gen_wall,
                                      "gen_cpu": gen_cpu, "train_wall": train_wall, "train_cpu": train_cpu,
                                      "gen_tokens": tokens, "gen_cpu_per_token": gen_cpu / max(tokens, 1.0),
                                      "train_sequences": record.get("train/n_sequences", 0.0)})
            for arm in ARMS:
                ops[arm] = count_ops(nodes[arm])
        finally:
            for node in nodes.values():
                node.close()
    medians = {arm: {k: statistics.median(r[k] for r in rows[arm]) for k in rows[arm][0]} for arm in ARMS}
    print(f"bench_remix_node: {args.config} {' '.join(args.overrides)}; remix: {' '.join(args.remix)}; "
          f"{args.steps} steps each in turns after {args.warmup} warmup, torch threads {torch.get_num_threads()}")
    keys = ("step_cpu", "gen_cpu", "train_cpu", "gen_cpu_per_token", "step_wall", "gen_wall", "train_wall",
            "gen_tokens", "train_sequences")
    print(f"{'median':<18}" + "".join(f"{arm:>12}" for arm in ARMS) + f"{'remix/lora':>12}")
    for key in keys:
        lora, remix = medians["lora"][key], medians["remix"][key]
        print(f"{key:<18}{lora:>12.4g}{remix:>12.4g}{remix / lora if lora else float('nan'):>12.3f}")
    for phase in ("generate", "train", "other", "all"):
        lora, remix = ops["lora"][phase], ops["remix"][phase]
        print(f"{'ops ' + phase:<18}{lora:>12}{remix:>12}{remix / lora if lora else float('nan'):>12.3f}")
    if args.json is not None:
        args.json.write_text(json.dumps({"medians": medians, "rows": rows, "ops": ops, "args": vars(args)},
                                        indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
