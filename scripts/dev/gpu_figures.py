"""Lines of ``scripts/gpu_check.sh``'s goals table from the figures its steps wrote: the GPU config's run
(``gpu-config.json``, from ``gpu_silo.py``), the profiled silo step (``profile.json``, from
``scripts/bench/profile_step.py``) and the swarm of three on one device (``swarm.json``, from
``gpu_swarm.py``). Each line: goal, measured, target, verdict (``-`` where the target is a GPU's and the run
was not on one).

Usage: python scripts/dev/gpu_figures.py LOGS_DIR DEVICE
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def line(label: str, value: str, goal: str, verdict: str) -> str:
    return f"{label:<34} {value:<40} {goal:<34} {verdict}"


def rows(logs: Path, device: str) -> list[str]:
    out: list[str] = []
    cuda = device == "cuda"

    def judged(ok: bool) -> str:
        return ("pass" if ok else "FAIL") if cuda else "-"

    def read(name: str) -> dict[str, Any] | None:
        path = logs / name
        return json.loads(path.read_text()) if path.is_file() else None

    config = read("gpu-config.json")
    if config is not None:
        rate = float(config.get("gen_tokens_per_s") or 0.0)
        step = config.get("median_step_seconds")
        out.append(line("GPU config (256 x 48): sampling", f"{rate:,.0f} tok/s; step {step or 0:.2f} s",
                        "at least 50,000 tok/s", judged(rate >= 50000)))
    profile = read("profile.json")
    if profile is not None:
        train = profile["phases"]["train"]
        out.append(line("training phase of a silo step",
                        f"{train['launches']} launches, {train['host_reads']} host reads",
                        "49,419 and 893 before" if cuda else f"{train.get('operators', 0)} operators", "-"))
    swarm = read("swarm.json")
    if swarm is not None:
        for n in swarm["nodes"]:
            ok = n["steps"] >= swarm["steps_asked"] and n["exit_code"] == 0
            value = f"{n['steps']} steps, {n['groups_accepted']} groups in, {n['device_peak_mb']} MB"
            out.append(line(f"swarm node {n['node']}", value, "its steps, exit 0", "pass" if ok else "FAIL"))
        t = swarm["throughput"]
        ok = bool(swarm["pairs"]) and all(r["groups_accepted"] > 0 for r in swarm["pairs"])
        out.append(line("swarm of three on one device", f"{t['tokens_per_s']:,.0f} tok/s "
                        f"({t['gen_tokens_per_s']:,.0f} generated)", "each accepts the others' groups",
                        "pass" if ok else "FAIL"))
    return out


if __name__ == "__main__":
    print("\n".join(rows(Path(sys.argv[1]), sys.argv[2])))
