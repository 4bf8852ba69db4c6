"""When does a node's own signal run dry, and what does sharing do after that point?

Usage:
    python scripts/experiments/sharing_regime.py OUT [OUT ...] [--window 25] [--bar 0.30] [--plot FILE]

OUT is a ``scripts/bench/bench_sapo.py --out`` folder. Finished runs are read from ``OUT/runs/*.json``;
runs still in progress (or stopped) from their nodes' ``metrics.jsonl`` under ``OUT/work/``, cut to the
steps every node of the run has reached. Each sharing run is paired, as bench_sapo pairs it, with the silo
``T/0`` of its setting and seed that generates as many groups (``I/J`` with ``(I+J)/0``, ``I+J`` with
``I/0``), and both are cut to the steps both have.

For each pair it prints: the silo's own-signal share (the share of its own groups with unequal rewards, a
rolling mean over ``--window`` steps, averaged over nodes), the first step where that share falls below
``--bar`` (the low-signal regime; "never" with its lowest value otherwise), and the change of cumulative
sampled reward (sharing against silo, in percent) before and after that step, with the peer groups taken
a node-step after it; held-out greedy accuracy at the last evaluation both runs have.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path
from typing import Any


def _finished(out: Path) -> dict[str, dict[str, Any]]:
    runs = {}
    for path in sorted((out / "runs").glob("*.json")):
        res = json.loads(path.read_text())
        runs[res["name"]] = {"rewards": res["rewards"], "signal": res["signal"], "peers": res["peer_groups"],
                             "evals": {int(s): statistics.fmean(a) for s, a in res.get("evals", [])}}
    return runs


def _in_progress(out: Path) -> dict[str, dict[str, Any]]:
    runs = {}
    for work in sorted((out / "work").glob("*")):
        nodes = sorted(work.glob("node*/metrics.jsonl"))
        if not nodes:
            continue
        per_node = [[json.loads(line) for line in p.read_text().splitlines() if line.strip()] for p in nodes]
        steps = [{int(r["step"]): r for r in rows if "reward_mean" in r} for rows in per_node]
        reached = min(max(s, default=0) for s in steps)
        evals_by_node = [{int(r["step"]): float(r["eval_accuracy"]) for r in rows
                          if isinstance(r.get("eval_accuracy"), float)} for rows in per_node]
        common = set.intersection(*(set(e) for e in evals_by_node)) if evals_by_node else set()
        runs[work.name] = {
            "rewards": [[s[i]["reward_mean"] for i in range(1, reached + 1) if i in s] for s in steps],
            "signal": [[s[i].get("local_signal_fraction", 0.0) for i in range(1, reached + 1) if i in s] for s in steps],
            "peers": [[s[i].get("n_peer_groups", 0) for i in range(1, reached + 1) if i in s] for s in steps],
            "evals": {k: statistics.fmean(e[k] for e in evals_by_node) for k in sorted(common)}}
    return runs


def _parts(name: str) -> tuple[str, str, str, str] | None:
    """(setting, arm, split, seed) of a run name such as ``smollm2-arith-topr_fill-2plus2-xff8ecd5e-s0``."""
    m = re.match(r"(?P<setting>.+?)-(?P<arm>silo|[a-z0-9]+_[a-z0-9_]+)-(?P<split>\d+(?:of|plus)\d+)(?:-x[0-9a-f]+)?-"
                 r"(?P<seed>s\d+)$", name)
    return (m["setting"], m["arm"], m["split"], m["seed"]) if m else None


def _generated(split: str) -> int:
    own, other = (int(x) for x in re.split("of|plus", split))
    return own + other if "of" in split else own


def _rolling(rows: list[list[float]], window: int) -> list[float]:
    steps = min(len(r) for r in rows)
    mean = [statistics.fmean(r[i] for r in rows) for i in range(steps)]
    return [statistics.fmean(mean[max(0, i - window + 1):i + 1]) for i in range(steps)]


def _cum(rows: list[list[float]], lo: int, hi: int) -> float:
    return statistics.fmean(statistics.fmean(r[lo:hi]) for r in rows) if hi > lo else float("nan")


def _pct(share: float, silo: float) -> str:
    return f"{100 * (share - silo) / silo:+.1f}%" if silo == silo and silo > 0 else "-"


def analyse(runs: dict[str, dict[str, Any]], window: int, bar: float) -> list[str]:
    lines = []
    silos = {(p[0], _generated(p[2]), p[3]): name for name in runs if (p := _parts(name)) and p[1] == "silo"}
    for name, run in sorted(runs.items()):
        p = _parts(name)
        if p is None or p[1] == "silo" or (p[0], _generated(p[2]), p[3]) not in silos:
            continue
        silo = runs[silos[(p[0], _generated(p[2]), p[3])]]
        steps = min(min(len(r) for r in run["rewards"]), min(len(r) for r in silo["rewards"]))
        if steps == 0:  # a run that has not finished a step yet
            continue
        cut = {k: [r[:steps] for r in v] for k, v in silo.items() if k in ("rewards", "signal")}
        share = _rolling(cut["signal"], window)
        start = next((i for i, v in enumerate(share) if 0 < i < steps and v < bar), None)
        reward = [r[:steps] for r in run["rewards"]]
        where = "never" if start is None else f"step {start + 1}"
        before = _pct(_cum(reward, 0, start or steps), _cum(cut["rewards"], 0, start or steps))
        after = _pct(_cum(reward, start, steps), _cum(cut["rewards"], start, steps)) if start is not None else "-"
        peers = statistics.fmean(statistics.fmean(r[start or 0:steps]) for r in run["peers"])
        evals = sorted(set(run["evals"]) & set(silo["evals"]))
        acc = (f"greedy at {evals[-1]}: {silo['evals'][evals[-1]]:.3f} -> {run['evals'][evals[-1]]:.3f}"
               if evals else "no common evaluation")
        lines.append(f"{name}: {steps} steps; silo own signal below {bar:.0%} from {where} (lowest {min(share):.2f}); "
                     f"reward vs silo before {before}, after {after}; peer groups a node-step "
                     f"{'after' if start is not None else 'over the run'} {peers:.2f}; {acc}")
    return lines


def plot(runs: dict[str, dict[str, Any]], window: int, bar: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    for name, run in sorted(runs.items()):
        top.plot(_rolling(run["signal"], window), label=name)
        bottom.plot(_rolling(run["rewards"], window), label=name)
    top.axhline(bar, color="grey", linestyle=":")
    top.set_ylabel(f"own groups with signal ({window}-step mean)")
    bottom.set_ylabel(f"sampled reward ({window}-step mean)")
    bottom.set_xlabel("step")
    top.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="+", type=Path, help="bench_sapo --out folders")
    parser.add_argument("--window", type=int, default=25, help="steps of the rolling means")
    parser.add_argument("--bar", type=float, default=0.30, help="the own-signal share that marks the regime")
    parser.add_argument("--plot", type=Path, default=None, help="write the rolling curves of every run here")
    args = parser.parse_args()
    runs: dict[str, dict[str, Any]] = {}
    for out in args.out:
        if not out.is_dir():
            parser.error(f"{out}: not a folder (give a bench_sapo --out folder)")
        runs.update(_in_progress(out))
        runs.update(_finished(out))  # a finished run's record wins over its work folder
    for line in analyse(runs, args.window, args.bar) or ["no sharing run with its silo found"]:
        print(line)
    if args.plot is not None:
        plot(runs, args.window, args.bar, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
