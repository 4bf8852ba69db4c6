"""The reward-curve half of ``bench_remix.py``: ReMix against a plain LoRA of equal active parameters.

Each run is one real silo ``Node`` (``configs/tiny-silo.yaml`` plus overrides) trained ``steps`` steps on
the tiny addition task. The two arms differ only in the adapter:

- ``remix``: n=8 LoRAs of rank 4 on gate/up/down of every MLP, k=2 active, M=2 sampled routings a
  sequence in training; the active update is rank k*r = 8 with weight ``omega = (alpha/r)/k``.
- ``lora``: one peft LoRA of rank 8 on gate/up/down, scaling ``alpha/r``.

With r_remix=4, k=2 and r_lora=8, ``omega = alpha/8 = alpha/r_lora``, so the same ``adapter.alpha`` gives
both the same scale on a rank-8 active update (and both start with B = 0, A Kaiming-uniform). Both train
the RMSNorm weights and share lr, norm_lr and everything else; ReMix also trains its routers at
``adapter.remix.router_lr``.

Per run: the sampled reward of every step, the greedy eval accuracy every ``eval_every`` steps, step
seconds, and for ReMix the router entropy of every step, the selection counts over the last ``window``
training steps (generation rows, deterministic top-k, plus the M sampled training rows) and the
deterministic routing of the final greedy evaluation.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from node.config import load_config
from node.run.node import Node

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "tiny-silo.yaml"
MLP = "[gate_proj,up_proj,down_proj]"

ARMS: dict[str, list[str]] = {
    "remix": ["adapter.kind=remix", "adapter.rank=4", "adapter.remix.n=8", "adapter.remix.k=2",
              "adapter.remix.routings=2"],
    "lora": ["adapter.kind=lora", "adapter.rank=8", f"adapter.target_modules={MLP}"],
}


def fractions(counts: torch.Tensor) -> list[list[float]]:
    """``[L, n]`` selection counts -> per-layer fractions of all selections (each row sums to 1)."""
    totals = counts.sum(dim=1, keepdim=True).clamp(min=1)
    return (counts.double() / totals).tolist()


def run_arm(arm: str, seed: int, args: Any) -> dict[str, Any]:
    """Train one arm for ``args.steps`` steps with ``seed``; returns its curves and summary numbers."""
    overrides = [
        f"seed={seed}", f"train.steps={args.steps}", f"train.checkpoint_every={args.steps + 1}",
        f"train.eval_every={args.eval_every}", f"sapo.local_groups={args.local_groups}",
        f"generation.group_size={args.group_size}", f"adapter.alpha={args.alpha}", *ARMS[arm], *args.extra,
    ]
    cfg = load_config(CONFIG, overrides)
    result: dict[str, Any] = {"arm": arm, "seed": seed, "overrides": overrides, "rewards": [],
                              "step_seconds": [], "router_entropy": [], "eval": {}}
    with tempfile.TemporaryDirectory(prefix=f"remix_curves_{arm}_") as run_dir:
        node = Node(cfg, run_dir, show_progress=False)
        node.setup()
        try:
            remix = node.policy.remix
            result["trainable_params"] = {k: sum(p.numel() for p in v) for k, v in node.policy.param_groups.items()}
            result["eval"][0] = node.evaluate()
            for step in range(1, args.steps + 1):
                if remix is not None and step == args.steps - args.window + 1:
                    remix.reset_selection_counts()
                record = node.train_step()
                result["rewards"].append(record["reward_mean"])
                result["step_seconds"].append(record["step_seconds"])
                if "router_entropy" in record:
                    result["router_entropy"].append(record["router_entropy"])
                if "eval_accuracy" in record:
                    result["eval"][step] = record["eval_accuracy"]
            if remix is not None:
                result["train_selection"] = fractions(remix.selection_counts())
                remix.reset_selection_counts()
                node.evaluate()  # greedy, deterministic top-k routing: what inference would use
                result["eval_selection"] = fractions(remix.selection_counts())
        finally:
            node.close()
    result["final_eval"] = result["eval"][args.steps]
    return result


def _mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def summarize(results: list[dict[str, Any]], window: int) -> dict[str, dict[str, Any]]:
    """Per arm: mean and std over seeds of the cumulative reward, last-``window`` reward, final eval."""
    summary: dict[str, dict[str, Any]] = {}
    for arm in ARMS:
        runs = [r for r in results if r["arm"] == arm]
        if not runs:
            continue
        row: dict[str, Any] = {
            "seeds": len(runs),
            "cumulative_reward": _mean_std([statistics.fmean(r["rewards"]) for r in runs]),
            "last_reward": _mean_std([statistics.fmean(r["rewards"][-window:]) for r in runs]),
            "final_eval": _mean_std([r["final_eval"] for r in runs]),
            "initial_eval": statistics.fmean(r["eval"][0] for r in runs),
            "step_seconds": statistics.median(t for r in runs for t in r["step_seconds"]),
            "trainable_params": runs[0]["trainable_params"],
        }
        if runs[0]["router_entropy"]:
            head = min(5, len(runs[0]["router_entropy"]))
            row["router_entropy_start"] = statistics.fmean(e for r in runs for e in r["router_entropy"][:head])
            row["router_entropy_end"] = statistics.fmean(e for r in runs for e in r["router_entropy"][-head:])
        summary[arm] = row
    return summary


def table(summary: dict[str, dict[str, Any]], window: int) -> list[str]:
    lines = [f"{'arm':6s} {'seeds':>5s} {'cum. reward':>15s} {f'last-{window} reward':>16s} "
             f"{'eval start':>10s} {'final eval':>15s} {'step s':>7s}  trainable"]
    for arm, s in summary.items():
        cols = [f"{s[key][0]:.3f} ± {s[key][1]:.3f}" for key in ("cumulative_reward", "last_reward", "final_eval")]
        lines.append(f"{arm:6s} {s['seeds']:5d} {cols[0]:>15s} {cols[1]:>16s} {s['initial_eval']:10.3f} "
                     f"{cols[2]:>15s} {s['step_seconds']:7.2f}  {s['trainable_params']}")
    if "remix" in summary and "router_entropy_start" in summary["remix"]:
        s = summary["remix"]
        lines.append(f"remix router entropy (nats, mean of first/last 5 steps): "
                     f"{s['router_entropy_start']:.3f} -> {s['router_entropy_end']:.3f} (uniform ln 8 = 2.079)")
    return lines


def selection_lines(results: list[dict[str, Any]], window: int) -> list[str]:
    lines = []
    for r in results:
        if "train_selection" not in r:
            continue
        for label, key in ((f"last {window} train steps", "train_selection"), ("final greedy eval", "eval_selection")):
            for layer, fr in enumerate(r[key]):
                lines.append(f"seed {r['seed']} layer {layer} {label:>20s}: " + " ".join(f"{f:.2f}" for f in fr))
    return lines


def plot(results: list[dict[str, Any]], path: Path, smooth: int = 10) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(17, 4.5))
    colors = {"remix": "tab:red", "lora": "tab:blue"}
    for arm in ARMS:
        runs = [r for r in results if r["arm"] == arm]
        if not runs:
            continue
        for r in runs:
            sm = [statistics.fmean(r["rewards"][max(0, t - smooth + 1) : t + 1]) for t in range(len(r["rewards"]))]
            axes[0].plot(range(1, len(sm) + 1), sm, color=colors[arm], alpha=0.25, lw=0.8)
        mean = [statistics.fmean(col) for col in zip(*(r["rewards"] for r in runs), strict=True)]
        sm = [statistics.fmean(mean[max(0, t - smooth + 1) : t + 1]) for t in range(len(mean))]
        axes[0].plot(range(1, len(sm) + 1), sm, color=colors[arm], lw=2, label=f"{arm} (mean of {len(runs)} seeds)")
        steps = sorted(runs[0]["eval"])
        accs = [statistics.fmean(r["eval"][s] for r in runs) for s in steps]
        axes[1].plot(steps, accs, "o-", color=colors[arm], label=arm)
        if runs[0]["router_entropy"]:
            for r in runs:
                axes[2].plot(range(1, len(r["router_entropy"]) + 1), r["router_entropy"], color=colors[arm],
                             lw=1, label=f"seed {r['seed']}")
    axes[0].set(xlabel="step", ylabel=f"sampled reward ({smooth}-step avg)", title="reward (thin: seeds)")
    axes[1].set(xlabel="step", ylabel="greedy eval accuracy", title="eval accuracy (mean over seeds)")
    axes[2].axhline(2.0794, color="gray", ls="--", lw=0.8)
    axes[2].set(xlabel="step", ylabel="nats", title="ReMix router entropy (dashed: uniform)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(args: Any) -> None:
    """Run every arm x seed (interleaved per seed), print the table, write ``rewards.json`` and the plot."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"reward curves: {args.steps} steps, seeds {args.seeds}, I={args.local_groups} x G={args.group_size}, "
          f"alpha {args.alpha} (ReMix omega = alpha/8 = LoRA alpha/8), extra {args.extra}", flush=True)
    results = []
    t0 = time.perf_counter()
    for seed in range(args.seeds):
        for arm in args.arms:
            res = run_arm(arm, seed, args)
            results.append(res)
            print(f"  {arm:5s} seed {seed}: cum. reward {statistics.fmean(res['rewards']):.3f}, last-{args.window} "
                  f"{statistics.fmean(res['rewards'][-args.window:]):.3f}, eval {res['eval']}, "
                  f"{sum(res['step_seconds']):.0f} s  [{time.perf_counter() - t0:.0f} s total]", flush=True)
    summary = summarize(results, args.window)
    lines = table(summary, args.window) + ["selection fractions per LoRA (ReMix):"]
    lines += selection_lines(results, args.window)
    print("\n".join(lines))
    (out / "rewards.json").write_text(json.dumps({"summary": summary, "runs": results}, indent=1))
    plot(results, out / "rewards.png")
    print(f"wrote {out / 'rewards.json'} and {out / 'rewards.png'}")
