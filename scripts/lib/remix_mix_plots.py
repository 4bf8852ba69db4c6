"""The plots of ``scripts/experiments/remix_mix.py report --plots DIR``: held-out greedy by dataset over
training for each picked arm (mean over seeds), and ReMix's routing over training (balance, specialisation,
drift, each LoRA's update size) with the last evaluation's usage by dataset."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

COLORS = {"remix": "tab:red", "lora16": "tab:blue", "lora64": "tab:green"}


def _mean_by_step(series: list[dict[int, float]]) -> tuple[list[int], list[float]]:
    steps = sorted(set.intersection(*(set(s) for s in series))) if series else []
    return steps, [statistics.fmean(s[t] for s in series) for t in steps]


def plot_all(runs: dict[tuple[str, float, int], list[dict[str, Any]]], chosen: dict[str, float],
             datasets: list[str], folder: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    picked = {key: rows for key, rows in runs.items() if chosen.get(key[0]) == key[1]}
    fig, axes = plt.subplots(1, len(datasets) + 1, figsize=(4 * (len(datasets) + 1), 3.4), sharey=True)
    for ax, name in zip(axes, ["all", *datasets]):
        for arm in chosen:
            series = [{r["step"]: (r["eval_accuracy"] if name == "all" else r["eval_by_dataset"][name])
                       for r in rows if "eval_by_dataset" in r}
                      for (a, _, _), rows in picked.items() if a == arm]
            steps, values = _mean_by_step([s for s in series if s])
            if steps:
                ax.plot(steps, values, color=COLORS.get(arm), label=f"{arm} (lr {chosen[arm]:g})", marker=".")
        ax.set(title=name, xlabel="step")
    axes[0].set_ylabel("held-out greedy reward (mean of seeds)")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(folder / "remix_mix_eval.png", dpi=110)
    plt.close(fig)
    remix = {key: rows for key, rows in picked.items() if key[0] == "remix"}
    if remix:
        _routing(plt, remix, datasets, folder / "remix_mix_routing.png")


def _routing(plt: Any, remix: dict[tuple[str, float, int], list[dict[str, Any]]], datasets: list[str],
             path: Path) -> None:
    import numpy as np

    fig, axes = plt.subplots(2, max(4, len(datasets)), figsize=(4.3 * max(4, len(datasets)), 7.5))
    styles = ["-", "--", ":", "-."]
    for i, ((_, _, seed), rows) in enumerate(sorted(remix.items())):
        ev = [r for r in rows if "routing_balance" in r]
        steps = [r["step"] for r in ev]
        style = styles[i % len(styles)]
        axes[0, 0].plot(steps, [r["routing_balance"] for r in ev], style, label=f"seed {seed}")
        axes[0, 1].plot(steps, [r["routing_specialisation"] for r in ev], style, label=f"seed {seed}")
        drift = [(r["step"], r["routing_drift"]) for r in ev if "routing_drift" in r]
        axes[0, 2].plot([s for s, _ in drift], [d for _, d in drift], style, label=f"seed {seed}")
        if i == 0:
            norms = np.array([[r["routing_lora_norm"][str(e)] for e in range(len(r["routing_lora_norm"]))] for r in ev])
            for e in range(norms.shape[1]):
                axes[0, 3].plot(steps, norms[:, e], label=f"LoRA {e}")
    axes[0, 0].set(xlabel="step", ylim=(0, 1.05))
    axes[0, 0].set_title("load balance: exp(H(load)) / n\n(k/n = collapsed)", fontsize=9)
    axes[0, 1].set(xlabel="step")
    axes[0, 1].set_title("specialisation: I(dataset; LoRA) / H(LoRA)", fontsize=9)
    axes[0, 2].set(xlabel="step")
    axes[0, 2].set_title("drift: share of routings changed\nsince the last evaluation", fontsize=9)
    axes[0, 3].set(xlabel="step", ylabel="omega ||B A||, mean")
    axes[0, 3].set_title("each LoRA's update size, first seed", fontsize=9)
    for ax in axes[0][:4]:
        ax.legend(fontsize=7)
    for ax in axes[0][4:]:
        ax.set_visible(False)
    first = sorted(remix.items())[0][1]
    last = [r for r in first if "routing_usage" in r][-1]
    usage = last["routing_usage"]
    for ax, name in zip(axes[1], datasets):
        counts = np.array(usage[name], dtype=float)  # [L, n]
        share = counts / counts.sum(axis=1, keepdims=True)
        image = ax.imshow(share, aspect="auto", cmap="viridis", vmin=0, vmax=1)
        ax.set(xlabel="LoRA", ylabel="layer")
        ax.set_title(f"{name}: share of selections, step {last['step']}", fontsize=9)
    for ax in axes[1][len(datasets):]:
        ax.set_visible(False)
    fig.subplots_adjust(hspace=0.4, wspace=0.3)
    fig.colorbar(image, ax=list(axes[1]), shrink=0.8)
    fig.savefig(path, dpi=110)
    plt.close(fig)
