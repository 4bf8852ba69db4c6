"""Does sharing pay? SAPO on K tiny nodes in one process (issue 5, "The experiment").

Usage:
    python scripts/bench_sapo.py --quick                      # < 10 min on 2 cores
    python scripts/bench_sapo.py [--full] [--nodes 4] [--steps 200] [--seeds 3] [--jobs 2] [--out DIR]
                                 [--splits 8/0 6/2 4/4 2/6] [--settings ...] [--families ...] [--set key=value ...]
                                 [--relevance-filter]

Each run: K nodes of the embedded tiny model, an in-memory hub carrying the same signed ``RolloutBatch``
records as the swarm, stepped round-robin with one epoch per step; equal generation compute per node
(I + J groups generated a step, I own + up to J peers' trained on). Grid: local/external splits x peer-data
treatment (on-policy GRPO, ratio fixed at 1, vs TOPR with off-policy corrections) x setting (homogeneous
addition; heterogeneous add-heavy / sub-heavy nodes, evaluated on add + sub). Every sharing run has a
silo (8/0) baseline with the same loss family and the same node seeds (seed = seed_index * 100 + node).

Output: one line per finished run, then a table of cumulative mean reward (mean of each node's
``reward_mean`` over the whole run, averaged over nodes and seeds) and final greedy accuracy, with the
change against the matching silo in %; ``results.json`` (every number) and ``reward_curves.png`` in ``--out``.
Goals (issue 5): corrected sharing never worse than silo by more than 2% (homogeneous) and at least +30%
cumulative reward (heterogeneous).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sapo_lib import DEFAULT_FAMILIES, LOSS_FAMILIES, SETTINGS, RunSpec, run_one  # noqa: E402

QUICK = {"nodes": 4, "steps": 40, "seeds": 1, "splits": ["8/0", "4/4"]}
FULL = {"nodes": 4, "steps": 200, "seeds": 3, "splits": ["8/0", "6/2", "4/4", "2/6"]}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help=f"small grid: {QUICK}")
    mode.add_argument("--full", action="store_true", help=f"the whole grid (default): {FULL}")
    p.add_argument("--nodes", type=int, help="K nodes a run")
    p.add_argument("--steps", type=int, help="training steps a node")
    p.add_argument("--seeds", type=int, help="seed indices 0..n-1 a configuration")
    p.add_argument("--first-seed", type=int, default=0, help="first seed index (to add seeds to an earlier run)")
    p.add_argument("--splits", nargs="+", help="I/J local/external groups, e.g. 8/0 4/4 (8/0 is added if missing)")
    p.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    p.add_argument("--families", nargs="+", default=DEFAULT_FAMILIES, choices=list(LOSS_FAMILIES))
    p.add_argument("--group-size", type=int, default=8, help="G completions a group")
    p.add_argument("--set", dest="extra", nargs="*", default=[], metavar="key=value",
                   help="extra node config overrides for every run (e.g. sapo.max_per_peer=2)")
    p.add_argument("--relevance-filter", action="store_true",
                   help="experiment: keep a peer group of dataset d with probability w_d / max(w) of the receiver")
    p.add_argument("--jobs", type=int, default=2, help="runs in parallel (one process, one torch thread each)")
    p.add_argument("--out", default="runs/bench_sapo", help="results folder")
    args = p.parse_args(argv)
    preset = QUICK if args.quick else FULL
    for key, value in preset.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def build_grid(args: argparse.Namespace) -> list[RunSpec]:
    splits = [tuple(int(x) for x in s.split("/")) for s in args.splits]
    total = splits[0][0] + splits[0][1]
    if any(i + j != total for i, j in splits) or any(i < 1 for i, _ in splits):
        raise SystemExit(f"bench_sapo: every split must have I >= 1 and the same I + J, got {args.splits}")
    if (total, 0) not in splits:
        splits.insert(0, (total, 0))
    return [RunSpec(setting=s, family=f, local_groups=i, external_groups=j, seed_index=seed, nodes=args.nodes,
                    steps=args.steps, group_size=args.group_size, extra=tuple(args.extra),
                    relevance_filter=args.relevance_filter)
            for seed in range(args.first_seed, args.first_seed + args.seeds) for s in args.settings for f in args.families for i, j in splits]


def execute(grid: list[RunSpec], jobs: int) -> list[dict[str, Any]]:
    """Run every spec (``jobs`` processes), printing one line per finished run."""
    results: list[dict[str, Any]] = []
    t0 = time.perf_counter()

    def report(res: dict[str, Any]) -> None:
        results.append(res)
        cum = statistics.fmean(statistics.fmean(r) for r in res["rewards"])
        acc = statistics.fmean(res["accuracy"])
        print(f"[{len(results):3d}/{len(grid)}] {res['name']:<44s} cum_reward {cum:.3f}  acc {acc:.3f}  "
              f"{res['seconds']:.0f}s (elapsed {time.perf_counter() - t0:.0f}s)", flush=True)

    if jobs <= 1:
        for spec in grid:
            report(run_one(spec))
        return results
    with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(run_one, spec) for spec in grid]
        for fut in as_completed(futures):
            report(fut.result())
    return results


def summarize(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (setting, family, split): means over seeds of node-averaged numbers, change vs silo."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for res in results:
        s = res["spec"]
        groups.setdefault((s["setting"], s["family"], f"{s['local_groups']}/{s['external_groups']}"), []).append(res)
    rows = []
    for (setting, family, split), runs in groups.items():
        per_seed = [statistics.fmean(statistics.fmean(r) for r in res["rewards"]) for res in runs]
        per_node = [statistics.fmean(r) for res in runs for r in res["rewards"]]
        rows.append({"setting": setting, "family": family, "split": split, "seeds": len(runs),
                     "cum_reward": statistics.fmean(per_seed),
                     "cum_reward_sd": statistics.stdev(per_seed) if len(per_seed) > 1 else 0.0,
                     "min_node_cum_reward": min(per_node),
                     "final_reward": statistics.fmean(statistics.fmean(r[-10:]) for res in runs for r in res["rewards"]),
                     "accuracy": statistics.fmean(a for res in runs for a in res["accuracy"]),
                     "peer_groups": statistics.fmean(statistics.fmean(p) for res in runs for p in res["peer_groups"])})
    for row in rows:
        silo = next((r for r in rows if r["setting"] == row["setting"] and r["family"] == row["family"]
                     and r["split"].endswith("/0")), None)
        row["delta_reward_pct"] = 100 * (row["cum_reward"] / silo["cum_reward"] - 1) if silo else None
        row["delta_acc_pct"] = 100 * (row["accuracy"] / silo["accuracy"] - 1) if silo and silo["accuracy"] else None
    order = {name: i for i, name in enumerate([*SETTINGS, *LOSS_FAMILIES])}
    rows.sort(key=lambda r: (order[r["setting"]], order[r["family"]], -int(r["split"].split("/")[0])))
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    head = (f"{'setting':<14s} {'peer data':<15s} {'I/J':>4s} {'seeds':>5s} {'cum reward':>15s} {'vs silo':>8s} "
            f"{'min node':>8s} {'last10':>6s} {'accuracy':>8s} {'vs silo':>8s} {'peer grp':>8s}")
    print(head)
    print("-" * len(head))
    for r in rows:
        dr = "    silo" if r["split"].endswith("/0") else f"{r['delta_reward_pct']:+7.1f}%"
        da = "    silo" if r["split"].endswith("/0") else f"{r['delta_acc_pct']:+7.1f}%"
        print(f"{r['setting']:<14s} {r['family']:<15s} {r['split']:>4s} {r['seeds']:>5d} "
              f"{r['cum_reward']:7.3f} +-{r['cum_reward_sd']:.3f} {dr:>8s} {r['min_node_cum_reward']:8.3f} "
              f"{r['final_reward']:6.3f} {r['accuracy']:8.3f} {da:>8s} {r['peer_groups']:8.2f}")
    print("cum reward: each node's sampled reward on its own tasks averaged over the run, then over nodes "
          "(+- sd over seeds); min node: the lowest single node; last10: the last 10 steps; accuracy: final "
          "greedy accuracy on held-out add + sub; peer grp: peer groups trained on a step.")


def goals(rows: list[dict[str, Any]]) -> list[str]:
    """The issue's two goals, checked on the TOPR-corrected rows present."""
    lines = []
    for setting, test, label in (("homogeneous", lambda d: d >= -2.0, "never worse than silo by > 2%"),
                                 ("heterogeneous", lambda d: d >= 30.0, ">= +30% vs silo")):
        share = [r for r in rows if r["setting"] == setting and r["family"] == "topr_corrected"
                 and not r["split"].endswith("/0")]
        if not share:
            continue
        deltas = ", ".join(f"{r['split']} {r['delta_reward_pct']:+.1f}%" for r in share)
        if setting == "homogeneous":
            ok = all(test(r["delta_reward_pct"]) for r in share)
        else:
            ok = any(test(r["delta_reward_pct"]) for r in share)
        lines.append(f"goal {setting} (TOPR corrected, {label}): {'MET' if ok else 'NOT MET'} -- {deltas}")
    return lines


def plot(results: list[dict[str, Any]], path: Path, window: int = 10) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = list(dict.fromkeys(r["spec"]["setting"] for r in results))
    families = list(dict.fromkeys(r["spec"]["family"] for r in results))
    fig, axes = plt.subplots(len(settings), len(families), figsize=(6 * len(families), 4 * len(settings)),
                             squeeze=False, sharey="row")
    for a, setting in enumerate(settings):
        for b, family in enumerate(families):
            ax = axes[a][b]
            curves: dict[str, list[list[float]]] = {}
            for res in results:
                s = res["spec"]
                if s["setting"] == setting and s["family"] == family:
                    curves.setdefault(f"{s['local_groups']}/{s['external_groups']}", []).extend(res["rewards"])
            for split in sorted(curves, key=lambda x: -int(x.split("/")[0])):
                runs = curves[split]
                mean = [statistics.fmean(col) for col in zip(*runs)]
                smooth = [statistics.fmean(mean[max(0, t - window + 1) : t + 1]) for t in range(len(mean))]
                ax.plot(range(1, len(mean) + 1), smooth, label=f"{split} ({len(runs)} node-runs)")
            ax.set_title(f"{setting}, {family}")
            ax.set_xlabel("step")
            ax.set_ylabel(f"sampled reward (mean over nodes, {window}-step avg)")
            ax.legend()
            ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    grid = build_grid(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"bench_sapo: {len(grid)} runs, K={args.nodes} nodes x {args.steps} steps, {args.seeds} seed(s), "
          f"splits {args.splits}, G={args.group_size}, jobs {args.jobs}, extra {args.extra}", flush=True)
    t0 = time.perf_counter()
    results = execute(grid, args.jobs)
    rows = summarize(results)
    print()
    print_table(rows)
    for line in goals(rows):
        print(line)
    plot(results, out / "reward_curves.png")
    (out / "results.json").write_text(json.dumps({"args": vars(args), "rows": rows, "runs": results}, indent=1))
    print(f"bench_sapo: {time.perf_counter() - t0:.0f}s; table data in {out / 'results.json'}, "
          f"plot in {out / 'reward_curves.png'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
