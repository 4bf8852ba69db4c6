"""Where a node's own signal runs dry, and what sharing does after that point (``bench_sapo.py``'s report).

For each sharing run and its silo of the same seed: the silo's dry step (the first step at which the
10-step mean share of its own groups with signal, over its nodes, is below ``DRY``); the sharing run's
sampled reward over the steps after it against the silo's over the same steps; the held-out accuracy at the
last evaluation, in points against the silo's; and the groups each trained on a step (own with signal plus
peers': the training compute) against the silo's. Means over seeds with a 95% t-interval.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from scripts.lib.sapo.plots import DRY, dry_step
from scripts.lib.sapo.runs import SILO_OF, silo_split


def _mean_signal(res: dict[str, Any]) -> list[float]:
    return [statistics.fmean(col) for col in zip(*res["signal"])]


def _reward_after(res: dict[str, Any], step: int) -> float:
    """Mean sampled reward over the nodes and the steps after ``step`` (1-based, exclusive)."""
    return statistics.fmean(statistics.fmean(r[step:]) for r in res["rewards"])


def _trained(res: dict[str, Any]) -> float:
    """Groups trained on a step, own with signal plus peers', mean over nodes and steps."""
    local = res.get("local_groups")
    if not local:
        return float("nan")
    return statistics.fmean(statistics.fmean(a + b for a, b in zip(lo, pe)) for lo, pe in zip(local, res["peer_groups"]))


def regime_rows(results: list[dict[str, Any]], window: int = 10) -> list[dict[str, Any]]:
    """One row per (setting, arm, split) of a sharing arm whose silo ran dry on some seed: the dry steps by
    seed and the paired changes after them (see the module docstring; ``window``: steps of the mean)."""
    index = {(r["spec"]["setting"], r["spec"]["arm"], r["spec"]["split"], r["spec"]["seed_index"]): r
             for r in results}
    rows: dict[tuple[str, str, str], dict[str, Any]] = {}
    for (setting, arm, split, seed), res in sorted(index.items()):
        if arm not in SILO_OF:
            continue
        silo = index.get((setting, SILO_OF[arm], silo_split(split), seed))
        if silo is None:
            continue
        row = rows.setdefault((setting, arm, split), {"setting": setting, "arm": arm, "split": split, "dry": [],
                                                      "after": [], "acc_points": [], "trained": [],
                                                      "silo_trained": []})
        dry = dry_step(_mean_signal(silo), window)
        row["dry"].append(dry)
        row["trained"].append(_trained(res))
        row["silo_trained"].append(_trained(silo))
        if dry is not None and dry < len(silo["rewards"][0]):
            row["after"].append(100 * (_reward_after(res, dry) / _reward_after(silo, dry) - 1))
        row["acc_points"].append(100 * (statistics.fmean(res["accuracy"]) - statistics.fmean(silo["accuracy"])))
    return list(rows.values())


def regime_lines(results: list[dict[str, Any]], mean_ci: Callable[[list[float]], tuple[float, float]],
                 window: int = 10) -> list[str]:
    """The report's lines: per sharing row, the silo's dry steps by seed, the reward after them against the
    silo, the final accuracy in points and the groups trained a step."""
    def pct(values: list[float]) -> str:
        if not values:
            return "n/a"
        mean, half = mean_ci(values)
        return f"{mean:+.1f}% ±{half:.1f}" if half else f"{mean:+.1f}%"

    lines = []
    for row in regime_rows(results, window):
        acc_mean, acc_half = mean_ci(row["acc_points"])
        dry = ", ".join("never" if d is None else str(d) for d in row["dry"])
        lines.append(
            f"after own signal < {DRY:.0%}, {row['setting']} {row['arm']} {row['split']}: silo dry at step {dry}; "
            f"reward after it {pct(row['after'])} ({len(row['after'])} seed(s)); final accuracy "
            f"{acc_mean:+.1f} points" + (f" ±{acc_half:.1f}" if acc_half else "")
            + f"; groups trained a step {statistics.fmean(row['trained']):.2f} (silo "
            f"{statistics.fmean(row['silo_trained']):.2f})")
    return lines


def decision_lines(results: list[dict[str, Any]]) -> list[str]:
    """Per run of a deciding node (``sapo.take_peers=decide``): how its steps were decided over the run, in
    quarters, and the alignment it measured."""
    lines = []
    for res in sorted(results, key=lambda r: r["name"]):
        decisions = res.get("decisions") or []
        if not any(d for node in decisions for d in node):
            continue
        steps = len(decisions[0])
        quarters = []
        for q in range(4):
            part = [d for node in decisions for d in node[q * steps // 4 : (q + 1) * steps // 4]]
            taken = sum(d in ("warmup", "pays", "probe") for d in part)
            quarters.append(f"{taken / max(1, len(part)):.0%}")
        measured = [a for node in res["alignment"] for a in node if a is not None]
        probes = sum(d == "probe" for node in decisions for d in node)
        mean = f"{statistics.fmean(measured):+.3f}" if measured else "n/a"
        lines.append(f"decisions, {res['name']}: peers taken on {' / '.join(quarters)} of the steps by quarter "
                     f"({probes} probes); alignment {mean} over {len(measured)} measured steps")
    return lines
