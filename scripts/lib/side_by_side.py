"""Runs side by side, each its own process (on a GPU they share the card), with progress and a deadline.

Used by the lab and experiment scripts whose runs are independent (``scripts/lab/poison.py --jobs``,
``scripts/experiments/remix_mix.py grid``): each run's output goes to its own log, a progress line names
every run's state at a fixed interval with the machine's load (and the card's use where ``nvidia-smi``
answers), and the runs still going at the deadline are stopped, their process groups sent SIGTERM and,
20 s later, SIGKILL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


def gpu_use() -> str:
    """``, gpu 87% 41200 MiB`` from nvidia-smi where it answers, else nothing."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout.split(",")
        return f", gpu {int(out[0])}% {int(out[1])} MiB"
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return ""


@dataclass
class Outcome:
    """What became of the runs: the names that exited non-zero (with their codes) and those the deadline stopped."""

    failed: dict[str, int] = field(default_factory=dict)
    stopped: list[str] = field(default_factory=list)


def run_side_by_side(commands: dict[str, list[str]], logs: Path, *, cwd: Path, jobs: int = 0, deadline: float = 0,
                     every: float = 30, state: Callable[[str], str] = lambda name: "",
                     tick: Callable[[], None] = lambda: None, label: str = "side_by_side") -> Outcome:
    """Run ``commands`` (name -> argv), at most ``jobs`` at once (0: all), each logging to ``logs/NAME.log``.
    Every ``every`` seconds print one line: elapsed time, load, the card's use, and ``state(name)`` of each
    run started (``exit N`` for one that failed); then call ``tick``. Stop what is still going after ``deadline``
    seconds (0: never)."""
    logs.mkdir(parents=True, exist_ok=True)
    waiting = list(commands)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    start = time.monotonic()
    outcome = Outcome()
    while True:
        while waiting and (jobs <= 0 or sum(p.poll() is None for p in procs.values()) < jobs):
            name = waiting.pop(0)
            with open(logs / f"{name}.log", "ab") as log:  # the child holds its own descriptor
                procs[name] = subprocess.Popen(commands[name], stdout=log, stderr=subprocess.STDOUT, cwd=cwd,
                                               start_new_session=True)
        elapsed = time.monotonic() - start
        late = deadline > 0 and elapsed > deadline
        done = not waiting and all(p.poll() is not None for p in procs.values())
        states = " ".join(f"{n}:{state(n) if p.poll() in (None, 0) else f'exit {p.poll()}'}" for n, p in procs.items())
        print(f"[{elapsed:5.0f} s, load {os.getloadavg()[0]:.1f}{gpu_use()}] {states}"
              + (f" ({len(waiting)} waiting)" if waiting else ""), flush=True)
        tick()
        if done or late:
            break
        time.sleep(min(every, deadline - elapsed) if deadline > 0 else every)
    outcome.stopped = [n for n, p in procs.items() if p.poll() is None] + waiting
    for name in outcome.stopped:
        if name in procs:
            os.killpg(procs[name].pid, signal.SIGTERM)
    for name in outcome.stopped:
        if name not in procs:
            continue
        try:
            procs[name].wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(procs[name].pid, signal.SIGKILL)
            procs[name].wait()
    outcome.failed = {n: p.returncode for n, p in procs.items() if n not in outcome.stopped and p.returncode != 0}
    for name, code in outcome.failed.items():
        print(f"{label}: {name} exited {code} (its log: {logs / name}.log)", flush=True)
    if outcome.stopped:
        print(f"{label}: stopped at the deadline ({deadline:g} s): " + ", ".join(
            f"{n} ({state(n)})" if n in procs else f"{n} (not started)" for n in outcome.stopped),
              flush=True)
    return outcome
