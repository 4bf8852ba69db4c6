"""When does a node's own signal run dry, and what does sharing do after that point? bench_sapo's regime
report (``scripts/lib/sapo/regime.py``) per seed, for runs finished or still in progress, with a plot.

Usage:
    python scripts/experiments/sharing_regime.py OUT [OUT ...] [--window 10] [--plot FILE] [--table 50]

OUT is a ``scripts/bench/bench_sapo.py --out`` folder. Finished runs are read from ``OUT/runs/*.json``;
runs still in progress (or stopped) from their nodes' ``metrics.jsonl`` under ``OUT/work/`` into the same
shape, cut to the steps every node of the run has reached. Each sharing run is paired with its silo of the
same seed as bench_sapo pairs them, both cut to the steps both have, and reported one line a seed:
the silo's dry step (its ``--window``-step mean share of own groups with signal below 30%), the sharing
run's reward after it against the silo's, held-out accuracy at the last evaluation both have, and the
groups trained a step. ``--table N`` also prints, per run, its share of own groups with signal, sampled
reward and peer groups a node-step over windows of N steps (nodes averaged), as markdown rows.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from scripts.lib.sapo.plots import DRY, _mean_curve, _smooth  # noqa: E402
from scripts.lib.sapo.regime import regime_lines  # noqa: E402
from scripts.lib.sapo.runs import SILO_OF, silo_split  # noqa: E402

CURVES = ("rewards", "signal", "peer_groups", "local_groups")
PLOT_WINDOW = 25  # steps of the plotted rolling means


def _in_progress(work: Path) -> dict[str, Any] | None:
    """A run's record as far as every node has got, from its work folder (``None`` before its first step)."""
    progress, nodes = work / "progress.json", sorted(work.glob("node*/metrics.jsonl"))
    if not progress.is_file() or not nodes:
        return None
    per_node = [[json.loads(line) for line in p.read_text().splitlines() if line.strip()] for p in nodes]
    steps = [{int(r["step"]): r for r in rows if "reward_mean" in r} for rows in per_node]
    reached = min(max(s, default=0) for s in steps)
    if reached == 0:
        return None
    column = {"rewards": "reward_mean", "signal": "local_signal_fraction", "peer_groups": "n_peer_groups",
              "local_groups": "n_local_groups"}
    evals = [{int(r["step"]): float(r["eval_accuracy"]) for r in rows if isinstance(r.get("eval_accuracy"), float)}
             for rows in per_node]
    common = sorted(set.intersection(*(set(e) for e in evals)))
    record = {key: [[float(s[i].get(col) or 0.0) for i in range(1, reached + 1)] for s in steps]
              for key, col in column.items()}
    return {**record, "name": work.name, "spec": json.loads(progress.read_text())["spec"],
            "accuracy": [e[common[-1]] for e in evals] if common else [float("nan")] * len(evals)}


def load(outs: list[Path]) -> dict[str, dict[str, Any]]:
    runs: dict[str, dict[str, Any]] = {}
    for out in outs:
        for work in sorted((out / "work").glob("*")):
            if (res := _in_progress(work)) is not None:
                runs[res["name"]] = res
        for path in sorted((out / "runs").glob("*.json")):  # a finished run's record wins over its work folder
            res = json.loads(path.read_text())
            runs[res["name"]] = res
    return runs


def pairs(runs: dict[str, dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(sharing run, its silo), both cut to the steps both have."""
    index = {(r["spec"]["setting"], r["spec"]["arm"], r["spec"]["split"], r["spec"]["seed_index"]): r
             for r in runs.values()}
    out = []
    for (setting, arm, split, seed), res in sorted(index.items()):
        silo = index.get((setting, SILO_OF.get(arm, ""), silo_split(split), seed))
        if silo is None:
            continue
        steps = min(len(res["rewards"][0]), len(silo["rewards"][0]))
        out.append(tuple({**r, **{k: [c[:steps] for c in r[k]] for k in CURVES if r.get(k)}} for r in (res, silo)))
    return out  # type: ignore[return-value]


def plot(runs: dict[str, dict[str, Any]], window: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    for name, run in sorted(runs.items()):
        top.plot(_smooth(_mean_curve(run["signal"]), window), label=name)
        bottom.plot(_smooth(_mean_curve(run["rewards"]), window), label=name)
    top.axhline(DRY, color="grey", linestyle=":")
    top.set_ylabel(f"own groups with signal ({window}-step mean)")
    bottom.set_ylabel(f"sampled reward ({window}-step mean)")
    bottom.set_xlabel("step")
    top.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def table(runs: dict[str, dict[str, Any]], window: int) -> list[str]:
    """Markdown rows: a run's curves averaged over its nodes and over windows of ``window`` steps."""
    steps = max(len(r["rewards"][0]) for r in runs.values())
    spans = [(a + 1, min(a + window, steps)) for a in range(0, steps, window)]
    rows = ["| run: curve | " + " | ".join(f"{a}-{b}" for a, b in spans) + " |",
            "| --- |" + " --- |" * len(spans)]
    for name, run in sorted(runs.items()):
        for key, label in (("signal", "own groups with signal"), ("rewards", "sampled reward"),
                           ("peer_groups", "peer groups a node-step")):
            curve = _mean_curve(run[key]) if run.get(key) else []
            cells = [f"{statistics.fmean(curve[a - 1:b]):.2f}" if len(curve) >= b else "-" for a, b in spans]
            if key != "peer_groups" or any(c not in ("0.00", "-") for c in cells):
                rows.append(f"| {name}: {label} | " + " | ".join(cells) + " |")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="+", type=Path, help="bench_sapo --out folders")
    parser.add_argument("--window", type=int, default=10, help="steps of the rolling mean that finds the dry step")
    parser.add_argument("--plot", type=Path, default=None, help=f"write every run's {PLOT_WINDOW}-step curves here")
    parser.add_argument("--table", type=int, default=None, metavar="N",
                        help="also print each run's curves over windows of N steps (markdown rows)")
    args = parser.parse_args()
    if args.table is not None and args.table < 1:
        parser.error("--table N: N must be at least 1")
    for out in args.out:
        if not out.is_dir():
            parser.error(f"{out}: not a folder (give a bench_sapo --out folder)")
    runs = load(args.out)
    one_seed = lambda values: (statistics.fmean(values), 0.0)  # noqa: E731  # a line a seed: no interval
    found = pairs(runs)
    for res, silo in found:
        for line in regime_lines([res, silo], one_seed, args.window):
            print(f"seed {res['spec']['seed_index']}, {len(res['rewards'][0])} steps: {line}")
    if not found:
        print("no sharing run with its silo found")
    if args.table is not None and runs:
        print("\n".join(table(runs, args.table)))
    if args.plot is not None:
        plot(runs, PLOT_WINDOW, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
