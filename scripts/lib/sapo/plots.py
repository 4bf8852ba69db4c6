"""bench_sapo's plots: sampled reward by step (``reward_curves``), and the share of a node's own groups with
signal beside its reward and held-out accuracy (``signal_curves``: where the own signal runs dry, and what
sharing does after that point).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from scripts.lib.sapo.runs import BASELINE_OF, SILO_OF, VARIANT_OF

DRY = 0.3  # the share of own groups with signal below which a node's own groups have run dry


def _smooth(values: list[float], window: int) -> list[float]:
    return [statistics.fmean(values[max(0, i - window + 1) : i + 1]) for i in range(len(values))]


def _mean_curve(curves: list[list[float]]) -> list[float]:
    return [statistics.fmean(col) for col in zip(*curves)]


def dry_step(signal: list[float], window: int = 10, share: float = DRY) -> int | None:
    """The first step (1-based) at which the ``window``-step mean of ``signal`` is below ``share``."""
    for i, value in enumerate(_smooth(signal, window)):
        if i + 1 >= window and value < share:
            return i + 1
    return None


def reward_curves(results: list[dict[str, Any]], path: Path, window: int = 10) -> None:
    """Rows: (setting, node type); columns: sharing arms; each panel the silo (dashed) and every split."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = list(dict.fromkeys((r["spec"]["setting"], t) for r in results for t in r["node_types"]))
    arms = [a for a in BASELINE_OF if any(r["spec"]["arm"] == a for r in results)] or ["silo"]
    fig, axes = plt.subplots(len(panels), len(arms), figsize=(5 * len(arms), 3.4 * len(panels)), squeeze=False,
                             sharey="row")
    for a, (setting, kind) in enumerate(panels):
        for b, arm in enumerate(arms):
            ax = axes[a][b]
            curves: dict[str, list[list[float]]] = {}
            baselines: set[str] = set()  # drawn dashed
            for res in results:
                s = res["spec"]
                if s["setting"] != setting or s["arm"] not in (arm, BASELINE_OF.get(arm, arm)):
                    continue
                label = f"{s['split']} {s['arm']}" if s["arm"] in VARIANT_OF else (
                    f"{s['split']} silo" if s["arm"] not in SILO_OF else s["split"])
                if s["arm"] != arm or arm not in BASELINE_OF:
                    baselines.add(label)
                curves.setdefault(label, []).extend(r for r, t in zip(res["rewards"], res["node_types"]) if t == kind)
            for label in sorted(curves, key=lambda x: (x not in baselines, x)):
                mean = [statistics.fmean(col) for col in zip(*curves[label])]
                smooth = [statistics.fmean(mean[max(0, i - window + 1) : i + 1]) for i in range(len(mean))]
                ax.plot(range(1, len(mean) + 1), smooth, "--" if label in baselines else "-", label=label)
            ax.set_title(f"{setting} / {kind} nodes, {arm}", fontsize=9)
            ax.set_xlabel("step")
            ax.set_ylabel(f"sampled reward ({window}-step mean)", fontsize=8)
            ax.legend(fontsize=7)
            ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _label(spec: dict[str, Any]) -> str:
    return spec["split"] if spec["arm"] == "silo" else f"{spec['arm']} {spec['split']}"


def signal_curves(results: list[dict[str, Any]], path: Path, window: int = 10) -> None:
    """One row a setting: the share of own groups with signal, the sampled reward (both ``window``-step
    means over the nodes and seeds) and the held-out greedy accuracy at each evaluation, every run of the
    setting one line (silos dashed); a dotted line where the silo's own signal falls below ``DRY``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = list(dict.fromkeys(r["spec"]["setting"] for r in results))
    fig, axes = plt.subplots(len(settings), 3, figsize=(16, 3.6 * len(settings)), squeeze=False)
    for row, setting in enumerate(settings):
        runs: dict[str, list[dict[str, Any]]] = {}
        for res in results:
            if res["spec"]["setting"] == setting:
                runs.setdefault(_label(res["spec"]), []).append(res)
        silo_dry = None
        for label in sorted(runs, key=lambda x: (x[0].isalpha(), x)):
            group = runs[label]
            style = "--" if group[0]["spec"]["arm"] not in SILO_OF else "-"
            signal = _mean_curve([s for res in group for s in res["signal"]])
            reward = _mean_curve([r for res in group for r in res["rewards"]])
            steps = range(1, len(signal) + 1)
            axes[row][0].plot(steps, _smooth(signal, window), style, label=label)
            axes[row][1].plot(steps, _smooth(reward, window), style, label=label)
            evals = [e for e in group[0].get("evals", []) if all(len(r.get("evals", [])) for r in group)]
            if evals:
                at = [step for step, _ in evals]
                acc = [statistics.fmean(statistics.fmean(r["evals"][k][1]) for r in group) for k in range(len(at))]
                axes[row][2].plot(at, acc, style + "o", label=label, markersize=3)
            if group[0]["spec"]["arm"] == "silo" and silo_dry is None:
                silo_dry = dry_step(signal, window)
        for col, ylabel in enumerate(("own groups with signal", "sampled reward", "held-out greedy accuracy")):
            ax = axes[row][col]
            if col == 0:
                ax.axhline(DRY, color="grey", linewidth=0.8)
            if silo_dry is not None:
                ax.axvline(silo_dry, color="grey", linestyle=":", linewidth=1)
            ax.set_title(f"{setting}: {ylabel}" + (f" ({window}-step mean)" if col < 2 else ""), fontsize=9)
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
