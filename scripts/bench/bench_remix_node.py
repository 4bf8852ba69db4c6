"""A ReMix node's step against a LoRA node's: CPU seconds by phase and operators.

Usage: python scripts/bench/bench_remix_node.py -c CONFIG [--warmup 1] [--steps 3] [--threads 1]
                                              [--remix KEY=VALUE ...] [--arm lora|remix] [--json OUT] [KEY=VALUE ...]
       python scripts/bench/bench_remix_node.py --ratio LORA_JSON REMIX_JSON

Builds silo nodes from CONFIG and the overrides (a temporary run dir each, no evaluations): ``lora``, the
config's adapter, and ``remix``, the same with ``adapter.kind=remix`` and the ``--remix`` overrides (e.g.
``adapter.rank=8`` for the same active rank as a rank-16 LoRA with k = 2). After ``--warmup`` steps each,
they take ``--steps`` steps in turns (the order rotating), so that the machine's load falls on both alike;
each phase is timed in wall and in CPU seconds of the process (CPU time moves far less than wall time with
the load of a shared machine). Then one more step of each runs under ``torch.profiler`` to count its
operators by phase (``aten::`` calls, nested ones included: on a GPU each is a launch or part of one).
Prints the medians and the ratios remix / lora: step, sampling (generation and scoring), training (also a
trained sequence), and generation CPU seconds a generated token (the inverse of tokens/s). Both nodes sample
the same tasks with the same seed.

``--arm`` builds one node only, so that each arm has a process of its own: two such runs started together
(``--json`` each) share the machine's load, and ``--ratio`` prints their table. Two smollm2 nodes in one
process have slowed the ReMix node's training 3 to 4 fold on some steps against its own process (on this
project's 2-core machine, shared and short of memory; the cause was not found), so on a real model the
separate processes are the figure to trust; the tiny models fit in one.
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


def run_arms(args: argparse.Namespace, arms: tuple[str, ...]) -> dict[str, Any]:
    """Builds ``arms``' nodes, times their steps in turns after the warmup, then counts each one's operators."""
    rows: dict[str, list[dict[str, float]]] = {arm: [] for arm in arms}
    ops: dict[str, dict[str, int]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        nodes: dict[str, Node] = {}
        timers: dict[str, tuple[Timed, Timed]] = {}
        total = args.warmup + args.steps + 2
        for arm in arms:
            extra = ["adapter.kind=remix", *args.remix] if arm == "remix" else []
            cfg = load_config(args.config, [*args.overrides, *extra, f"run_dir={tmp}/{arm}", f"train.steps={total}",
                                            "train.eval_every=0", f"train.checkpoint_every={total}"])
            nodes[arm] = Node(cfg, show_progress=False)
            nodes[arm].setup()
            timers[arm] = (Timed(nodes[arm].generator, "generate"), Timed(nodes[arm].trainer, "step"))
        try:
            for arm in arms:
                for _ in range(args.warmup):
                    nodes[arm].train_step()
                for t in timers[arm]:
                    t.take()
            for rep in range(args.steps):
                for arm in (arms if rep % 2 == 0 else arms[::-1]):
                    w, c = time.perf_counter(), time.process_time()
                    record = nodes[arm].train_step()
                    step_wall, step_cpu = time.perf_counter() - w, time.process_time() - c
                    (gen_wall, gen_cpu), (train_wall, train_cpu) = (t.take() for t in timers[arm])
                    tokens = record["gen_tokens_per_s"] * record["gen_seconds"]
                    rows[arm].append({"step_cpu": step_cpu, "gen_cpu": gen_cpu, "train_cpu": train_cpu,
                                      "gen_cpu_per_token": gen_cpu / max(tokens, 1.0),
                                      "train_cpu_per_sequence": train_cpu / max(record.get("train/n_sequences", 1.0), 1.0),
                                      "step_wall": step_wall, "gen_wall": gen_wall, "train_wall": train_wall,
                                      "gen_tokens": tokens, "train_sequences": record.get("train/n_sequences", 0.0)})
            for arm in arms:
                ops[arm] = count_ops(nodes[arm])
        finally:
            for node in nodes.values():
                node.close()
    medians = {arm: {k: statistics.median(r[k] for r in rows[arm]) for k in rows[arm][0]} for arm in arms}
    return {"medians": medians, "rows": rows, "ops": ops, "args": vars(args),
            "torch_threads": torch.get_num_threads()}


def print_ratios(result: dict[str, Any]) -> None:
    medians, ops = result["medians"], result["ops"]
    print(f"{'median':<23}" + "".join(f"{arm:>12}" for arm in ARMS) + f"{'remix/lora':>12}")
    for key in medians["lora"]:
        lora, remix = medians["lora"][key], medians["remix"][key]
        print(f"{key:<23}{lora:>12.4g}{remix:>12.4g}{remix / lora if lora else float('nan'):>12.3f}")
    for phase in ("generate", "train", "other", "all"):
        lora, remix = ops["lora"][phase], ops["remix"][phase]
        print(f"{'ops ' + phase:<23}{lora:>12}{remix:>12}{remix / lora if lora else float('nan'):>12.3f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-c", "--config")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (both nodes)")
    parser.add_argument("--remix", nargs="*", default=[], help="overrides of the remix node only (KEY=VALUE)")
    parser.add_argument("--arm", choices=ARMS, default=None, help="build and time this arm's node only")
    parser.add_argument("--ratio", nargs=2, type=Path, metavar=("LORA_JSON", "REMIX_JSON"), default=None,
                        help="print the table of two --arm runs' --json files and exit")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    if args.ratio is not None:
        parts = [json.loads(path.read_text()) for path in args.ratio]
        print_ratios({key: {**parts[0][key], **parts[1][key]} for key in ("medians", "ops")})
        return 0
    if args.config is None:
        parser.error("-c/--config is required (but with --ratio)")
    torch.set_num_threads(args.threads)
    arms = ARMS if args.arm is None else (args.arm,)
    result = run_arms(args, arms)
    print(f"bench_remix_node: {args.config} {' '.join(args.overrides)}; remix: {' '.join(args.remix)}; "
          f"{args.steps} steps each in turns after {args.warmup} warmup, torch threads {torch.get_num_threads()}")
    if args.arm is None:
        print_ratios(result)
    else:
        for key, value in result["medians"][args.arm].items():
            print(f"{key:<23}{value:>12.4g}")
        for phase, count in result["ops"][args.arm].items():
            print(f"{'ops ' + phase:<23}{count:>12}")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
