"""Where does a training step's time go? One node step under torch.profiler, split into its phases.

Usage: python scripts/bench/profile_step.py -c CONFIG [--warmup N] [--steps N] [--top K] [--json OUT] [KEY=VALUE ...]

Builds the node of the config (overrides as ``swarm-node silo`` takes them; a temporary run dir, no
evaluations), runs ``--warmup`` steps, then ``--steps`` steps timed without the profiler (the medians of their
``gen_seconds``, ``train_seconds`` and ``step_seconds``), then one step under the profiler. For each phase of
that step (generate: the backend's generation calls; train: the trainer's update; sync: the merged copy's
refresh; other: scoring, grouping, metrics) it prints the wall time, the time the device was busy with
kernels (a phase whose busy time is a small part of its wall time waits for the host: launches, Python,
reads of device values), the kernel launches and graph replays, the host reads of device values
(``aten::_local_scalar_dense``: ``.item()``, ``float(t)``, ``bool(t)``; and the ranges labelled ``host_read``,
where the trainer reads a step's figures in one transfer), the operators it dispatched (``aten::`` events,
nested ones included), and its operations that take the most host time and the most device time. On the
CPU there is no device time: host time alone, and the operators and host reads of the training phase are
the CPU's stand-in for a GPU's kernel launches and device syncs (the line ``training phase:`` prints both).
The profiler slows the step it watches; the unprofiled medians are the step's own figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch  # noqa: E402

from node.config import load_config  # noqa: E402
from node.run.node import Node  # noqa: E402

PHASES = ("generate", "train", "sync")
LAUNCHES = {"cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx"}
REPLAYS = {"cudaGraphLaunch"}
READS = {"aten::_local_scalar_dense", "host_read"}


def _annotate(obj: Any, attr: str, label: str) -> None:
    """Wrap ``obj.attr`` so that each call shows in the profile as a range named ``phase:label``."""
    inner: Callable[..., Any] = getattr(obj, attr)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with torch.profiler.record_function(f"phase:{label}"):
            return inner(*args, **kwargs)

    setattr(obj, attr, wrapped)


def phase_table(events: Any, wall: float, top: int) -> dict[str, dict[str, Any]]:
    """Per phase: wall and busy seconds, launches, replays, host reads, the top operations (host, device)."""
    ranges = [(e.name.split(":", 1)[1], e.time_range.start, e.time_range.end)  # the host's ranges, not their
              for e in events if e.name.startswith("phase:") and str(e.device_type).endswith("CPU")]  # device copies
    out: dict[str, dict[str, Any]] = {}
    names: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0, 0.0, 0.0]))
    for phase in (*PHASES, "other"):
        span = sum(end - start for label, start, end in ranges if label == phase) / 1e6
        out[phase] = {"wall_s": span if phase != "other" else None, "busy_s": 0.0, "launches": 0, "replays": 0,
                      "host_reads": 0, "operators": 0, "calls": sum(1 for label, _, _ in ranges if label == phase)}
    for e in events:
        if e.name.startswith("phase:") or not str(e.device_type).endswith("CPU"):
            continue  # a device kernel is counted once, with the host operation that launched it
        start = e.time_range.start
        phase = next((label for label, s, t in ranges if s <= start <= t), "other")
        row = out[phase]
        device = sum(k.duration for k in e.kernels) / 1e6
        row["busy_s"] += device
        row["launches"] += e.name in LAUNCHES
        row["replays"] += e.name in REPLAYS
        row["host_reads"] += e.name in READS
        row["operators"] += e.name.startswith("aten::")  # nested ones included: the CPU's proxy for launches
        entry = names[phase][e.name]
        entry[0] += 1
        entry[1] += float(e.self_cpu_time_total) / 1e6
        entry[2] += device
    out["other"]["wall_s"] = max(0.0, wall - sum(out[p]["wall_s"] or 0.0 for p in PHASES))
    for phase, row in out.items():
        ops = names[phase]
        row["top_host"] = [(n, int(v[0]), round(v[1], 4)) for n, v in sorted(ops.items(), key=lambda kv: -kv[1][1])[:top]]
        row["top_device"] = [(n, int(v[0]), round(v[2], 4)) for n, v in sorted(ops.items(), key=lambda kv: -kv[1][2])[:top]
                             if v[2] > 0]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-c", "--config", required=True)
    parser.add_argument("--warmup", type=int, default=3, help="steps before anything is measured")
    parser.add_argument("--steps", type=int, default=3, help="steps timed without the profiler")
    parser.add_argument("--top", type=int, default=8, help="operations listed a phase")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here too")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    if args.warmup < 1 or args.steps < 1:
        parser.error("--warmup and --steps must be at least 1")
    with tempfile.TemporaryDirectory() as run_dir:
        total = args.warmup + args.steps + 1
        cfg = load_config(args.config, [*args.overrides, f"run_dir={run_dir}", f"train.steps={total}",
                                         "train.eval_every=0", f"train.checkpoint_every={total}"])
        node = Node(cfg, show_progress=False)
        try:
            node.setup()
            for _ in range(args.warmup):
                node.train_step()
            timed = [node.train_step() for _ in range(args.steps)]
            _annotate(node.generator, "generate", "generate")
            _annotate(node.generator, "sync", "sync")
            _annotate(node.trainer, "step", "train")
            cuda = node.policy.device.type == "cuda"
            activities = [torch.profiler.ProfilerActivity.CPU]
            if cuda:
                activities.append(torch.profiler.ProfilerActivity.CUDA)
                torch.cuda.synchronize()
            with torch.profiler.profile(activities=activities) as prof:
                t0 = time.perf_counter()
                node.train_step()
                if cuda:
                    torch.cuda.synchronize()
                wall = time.perf_counter() - t0
        finally:
            node.close()
    medians = {key: statistics.median(float(r[key]) for r in timed) for key in ("step_seconds", "gen_seconds",
                                                                                  "train_seconds", "gen_tokens_per_s")}
    phases = phase_table(prof.events(), wall, args.top)
    device = str(node.policy.device)
    print(f"profile_step: {args.config} on {device}; unprofiled medians over {args.steps} steps: step "
          f"{medians['step_seconds']:.3f} s, sampling+scoring {medians['gen_seconds']:.3f} s, training "
          f"{medians['train_seconds']:.3f} s, generation {medians['gen_tokens_per_s']:.1f} tokens/s; the profiled step "
          f"{wall:.3f} s")
    print(f"{'phase':<9} {'calls':>5} {'wall s':>8} {'busy s':>8} {'busy %':>7} {'launches':>9} {'replays':>8} "
          f"{'host reads':>10} {'operators':>9}")
    for phase, row in phases.items():
        busy = 100 * row["busy_s"] / row["wall_s"] if row["wall_s"] else 0.0
        print(f"{phase:<9} {row['calls']:>5} {row['wall_s']:>8.3f} {row['busy_s']:>8.3f} {busy:>6.1f}% "
              f"{row['launches']:>9} {row['replays']:>8} {row['host_reads']:>10} {row['operators']:>9}")
    train = phases["train"]
    print(f"training phase: {train['operators']} operators (aten::), {train['host_reads']} host reads of device "
          f"values, {train['launches']} kernel launches in one step")
    for phase, row in phases.items():
        print(f"-- {phase}: most host time: " + "; ".join(f"{n} x{c} {s:.3f}s" for n, c, s in row["top_host"]))
        if row["top_device"]:
            print(f"-- {phase}: most device time: " + "; ".join(f"{n[:60]} x{c} {s:.3f}s" for n, c, s in row["top_device"]))
    if args.json is not None:
        args.json.write_text(json.dumps({"device": device, "medians": medians, "profiled_wall_s": wall,
                                         "phases": phases}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
