"""ReMix against one LoRA on a diverse mixture, where routing should pay: held-out greedy per dataset,
paired seeds, each adapter at its own learning rate, and the routing's own diagnostics.

Usage:
  python scripts/experiments/remix_mix.py run ARM --lr LR --seed S --steps N [--out runs/remix_mix]
                                          [--eval-every 10] [--threads 1] [--config CONFIG] [--extra key=value ...]
  python scripts/experiments/remix_mix.py grid --runs ARM=LR[,LR...] ... [--seeds 0 1] --steps N [--deadline S]
                                          [--pack FILE] [--out ...] [--eval-every 10] [--config ...] [--extra ...]
  python scripts/experiments/remix_mix.py report [--out runs/remix_mix] [--pick ARM=LR ...] [--sweep-step 30]
                                          [--plots DIR]

``run`` trains one silo node (``python -m node.cli silo``) on ``configs/smollm2-silo.yaml`` (smollm2-135m;
basic_arithmetic, syllogism, spell_backward, gcd: arithmetic, logic, spelling and number theory, each with
signal for the base; its prompt, sampling, TOPR loss and 8 groups of 8 a step) with the arm's adapter on the
MLP projections of every layer, in ``OUT/ARM-lrLR-sS``; the node evaluates 128 held-out tasks (32 a
dataset) greedily every ``--eval-every`` steps and at the last, logging ``eval_by_dataset`` and, for ReMix,
the ``routing_*`` metrics. A run dir resumes from its checkpoints, so the same command with a larger
``--steps`` extends a run (a sweep's run at the picked rate goes on to the main length). ``--config`` puts
another config in place of smollm2's (``configs/tiny-silo.yaml``: a smoke run of the script in seconds).

Arms, all at scale 2 a direction (LoRA ``alpha / r``, ReMix ``omega = (alpha / r) / k`` on each of its k):

- ``remix``: n = 8 LoRAs of rank 8 a projection, k = 2 routed a sequence (active rank 16), M = 2 routings.
- ``lora16``: one LoRA of rank 16: the same active rank.
- ``lora64``: one LoRA of rank 64: the same trainable parameters as ``remix`` (n * r = 64; ReMix's
  routers add 1%).

``grid`` starts every (arm, rate, seed) of ``--runs`` x ``--seeds`` at once, each ``run`` its own process (on a
GPU the runs share the card: ``--extra model.device=cuda model.dtype=bfloat16 model.memory_mb=6000``), prints
each run's step every ``--every`` seconds with the machine's load, and with ``--pack`` rewrites one tar.gz of
every run's ``metrics.jsonl``, ``config.yaml`` and log each time, so that a lease that ends early still brings back
every step taken. At ``--deadline`` seconds the runs still going are stopped (their steps so far kept) and
named; exit 0 when every run finished its steps, 3 when the deadline stopped some, 1 when one failed.

``report`` prints, for every run, its steps, last held-out greedy (all and by dataset), sampled reward
over the last 20 steps and median step seconds; the sweep (every rate of seed 0 at ``--sweep-step``); and,
for each ``--pick`` (an arm at its picked rate) against ``remix`` at its picked rate, the paired
differences by seed and dataset, with the routing's specialisation by dataset. With ``--plots``, writes
``remix_mix_eval.png`` (held-out greedy by dataset over training) and ``remix_mix_routing.png`` (balance,
specialisation, drift, each LoRA's update size over training, and the last evaluation's usage by dataset).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

from scripts.lib.side_by_side import run_side_by_side

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "smollm2-silo.yaml"
MLP = "[gate_proj,up_proj,down_proj]"
ARMS: dict[str, list[str]] = {
    "remix": ["adapter.kind=remix", "adapter.rank=8", "adapter.alpha=32", "adapter.remix.n=8", "adapter.remix.k=2",
              "adapter.remix.routings=2"],
    "lora16": ["adapter.kind=lora", "adapter.rank=16", "adapter.alpha=32", f"adapter.target_modules={MLP}"],
    "lora64": ["adapter.kind=lora", "adapter.rank=64", "adapter.alpha=128", f"adapter.target_modules={MLP}"],
}
LAST = 20  # steps of sampled reward averaged at the end of a run


def run_name(arm: str, lr: float, seed: int) -> str:
    return f"{arm}-lr{lr:g}-s{seed}"


def run(args: argparse.Namespace) -> int:
    run_dir = Path(args.out) / run_name(args.arm, args.lr, args.seed)
    overrides = [f"seed={args.seed}", f"train.lr={args.lr!r}", f"train.steps={args.steps}",
                 f"train.eval_every={args.eval_every}", f"train.checkpoint_every={args.eval_every}",
                 "train.keep_checkpoints=1", *ARMS[args.arm], *args.extra]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    cmd = [sys.executable, "-m", "node.cli", "silo", "-c", str(args.config), "--run-dir", str(run_dir), "--no-progress",
           *overrides]
    print(" ".join(cmd), flush=True)
    return subprocess.call(cmd, env=env, cwd=ROOT)


def grid_specs(runs: list[str], seeds: list[int]) -> list[tuple[str, float, int]]:
    """``["remix=4e-4,8e-4", "lora16=2e-4"]`` x seeds -> ``[(arm, lr, seed), ...]``; a bad entry exits 2."""
    specs = []
    for item in runs:
        arm, _, rates = item.partition("=")
        if arm not in ARMS or not rates:
            print(f"remix_mix grid: --runs {item!r}: write ARM=LR[,LR...] with ARM one of {sorted(ARMS)}",
                  file=sys.stderr)
            raise SystemExit(2)
        try:
            lrs = [float(x) for x in rates.split(",")]
        except ValueError:
            print(f"remix_mix grid: --runs {item!r}: the rates must be numbers (4e-4,8e-4)", file=sys.stderr)
            raise SystemExit(2) from None
        specs += [(arm, lr, seed) for lr in lrs for seed in seeds]
    return specs


def pack(out: Path, names: list[str], dest: Path) -> None:
    """One tar.gz of each run's metrics, config and log, written beside ``dest`` and renamed onto it."""
    tmp = dest.with_name(dest.name + ".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        for name in names:
            for part in ("metrics.jsonl", "config.yaml"):
                if (out / name / part).exists():
                    tar.add(out / name / part, arcname=f"{name}/{part}")
            if (out / f"{name}.log").exists():
                tar.add(out / f"{name}.log", arcname=f"{name}/run.log")
    tmp.replace(dest)


def last_step(run_dir: Path) -> int:
    rows = read_rows(run_dir)
    return max((int(r["step"]) for r in rows if "step" in r), default=0)


def grid(args: argparse.Namespace) -> int:
    specs = grid_specs(args.runs, args.seeds)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    commands = {run_name(arm, lr, seed): [
        sys.executable, str(Path(__file__).resolve()), "run", arm, "--lr", repr(lr), "--seed", str(seed),
        "--steps", str(args.steps), "--eval-every", str(args.eval_every), "--threads", str(args.threads),
        "--out", str(out), "--config", str(args.config), "--extra", *args.extra] for arm, lr, seed in specs}
    names = list(commands)
    print(f"remix_mix grid: {len(names)} runs of {args.steps} steps: {' '.join(names)}", flush=True)
    outcome = run_side_by_side(commands, out, cwd=ROOT, deadline=args.deadline, every=args.every,
                               state=lambda name: f"step {last_step(out / name)}",
                               tick=(lambda: pack(out, names, Path(args.pack))) if args.pack else (lambda: None),
                               label="remix_mix grid")
    if args.pack:
        pack(out, names, Path(args.pack))
    return 1 if outcome.failed else 3 if outcome.stopped else 0


def read_rows(run_dir: Path) -> list[dict[str, Any]]:
    rows = []
    path = run_dir / "metrics.jsonl"
    for line in path.read_text(encoding="utf-8").splitlines() if path.exists() else []:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def parse_name(name: str) -> tuple[str, float, int] | None:
    try:
        arm, lr, seed = name.rsplit("-", 2)
        return arm, float(lr.removeprefix("lr")), int(seed.removeprefix("s"))
    except ValueError:
        return None


def load_runs(out: Path) -> dict[tuple[str, float, int], list[dict[str, Any]]]:
    runs = {}
    for run_dir in sorted(p for p in out.iterdir() if p.is_dir()) if out.is_dir() else []:
        key = parse_name(run_dir.name)
        if key is not None and key[0] in ARMS:
            runs[key] = read_rows(run_dir)
    return runs


def evals(rows: list[dict[str, Any]], at: int | None = None) -> list[dict[str, Any]]:
    """The evaluation rows (up to step ``at``)."""
    return [r for r in rows if "eval_by_dataset" in r and (at is None or r["step"] <= at)]


def last_reward(rows: list[dict[str, Any]], at: int | None = None) -> float:
    rewards = [r["reward_mean"] for r in rows if at is None or r["step"] <= at]
    return statistics.fmean(rewards[-LAST:]) if rewards else math.nan


def dataset_specialisation(usage: dict[str, list[list[int]]]) -> dict[str, float]:
    """Per dataset: ``KL(p(LoRA | dataset) || p(LoRA)) / H(LoRA)``, mean over layers (its share of the
    routing's entropy that sets it apart; their prompt-weighted sum is ``routing_specialisation``)."""
    names = list(usage)
    layers, n = len(usage[names[0]]), len(usage[names[0]][0])
    out = {name: 0.0 for name in names}
    for layer in range(layers):
        pooled = [sum(usage[d][layer][e] for d in names) for e in range(n)]
        total = sum(pooled)
        marginal = [c / total for c in pooled]
        entropy = -sum(p * math.log(p) for p in marginal if p > 0)
        for d in names:
            own = sum(usage[d][layer])
            kl = sum(c / own * math.log((c / own) / marginal[e]) for e, c in enumerate(usage[d][layer]) if c > 0)
            out[d] += (kl / entropy if entropy > 0 else 0.0) / layers
    return out


def _fmt(v: float) -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}"


def report(args: argparse.Namespace) -> int:
    runs = load_runs(Path(args.out))
    if not runs:
        print(f"no runs under {args.out}")
        return 1
    datasets = next((list(evals(r)[-1]["eval_by_dataset"]) for r in runs.values() if evals(r)), [])
    print("| run | steps | held-out greedy | " + " | ".join(datasets) + f" | reward, last {LAST} | step s |")
    print("| --- " * (5 + len(datasets)) + "|")
    for (arm, lr, seed), rows in sorted(runs.items()):
        last = evals(rows)[-1] if evals(rows) else None
        by = [_fmt(last["eval_by_dataset"].get(d)) if last else "n/a" for d in datasets]
        steps = statistics.median(r["step_seconds"] for r in rows) if rows else math.nan
        print(f"| {run_name(arm, lr, seed)} | {rows[-1]['step'] if rows else 0} | "
              f"{_fmt(last['eval_accuracy']) if last else 'n/a'} | " + " | ".join(by)
              + f" | {_fmt(last_reward(rows))} | {steps:.1f} |")
    print(f"\nsweep (seed 0, at step {args.sweep_step}): held-out greedy / sampled reward over the last {LAST} steps")
    for (arm, lr, seed), rows in sorted(runs.items()):
        at = evals(rows, args.sweep_step)
        if seed == 0 and at and at[-1]["step"] == args.sweep_step:
            print(f"  {arm:7s} lr {lr:<8g} {_fmt(at[-1]['eval_accuracy'])} / {_fmt(last_reward(rows, args.sweep_step))}")
    picks = dict(p.split("=", 1) for p in args.pick)
    if "remix" in picks:
        compare(runs, picks, datasets)
    if args.plots:
        from scripts.lib.remix_mix_plots import plot_all

        chosen = {arm: float(lr) for arm, lr in picks.items()}
        plot_all(runs, chosen, datasets, Path(args.plots))
    return 0


def compare(runs: dict[tuple[str, float, int], list[dict[str, Any]]], picks: dict[str, str],
            datasets: list[str]) -> None:
    """Paired by seed: remix at its rate minus each other picked arm at its rate, at their last common
    evaluation, overall and by dataset (points of greedy reward), and remix's specialisation by dataset."""
    remix_lr = float(picks["remix"])
    for arm, lr in picks.items():
        if arm == "remix":
            continue
        print(f"\nremix (lr {remix_lr:g}) - {arm} (lr {float(lr):g}), held-out greedy, points, by seed:")
        diffs: dict[str, list[float]] = {d: [] for d in ["all", *datasets]}
        for (a, rate, seed), rows in sorted(runs.items()):
            if a != "remix" or rate != remix_lr or (arm, float(lr), seed) not in runs:
                continue
            other = runs[(arm, float(lr), seed)]
            common = sorted({r["step"] for r in evals(rows)} & {r["step"] for r in evals(other)})
            if not common:
                continue
            mine = next(r for r in evals(rows) if r["step"] == common[-1])
            theirs = next(r for r in evals(other) if r["step"] == common[-1])
            row = {"all": 100 * (mine["eval_accuracy"] - theirs["eval_accuracy"])}
            row.update({d: 100 * (mine["eval_by_dataset"][d] - theirs["eval_by_dataset"][d]) for d in datasets})
            for d, v in row.items():
                diffs[d].append(v)
            spec = dataset_specialisation(mine["routing_usage"]) if "routing_usage" in mine else {}
            print(f"  seed {seed}, step {common[-1]}: " + ", ".join(f"{d} {v:+.1f}" for d, v in row.items())
                  + ("; remix specialisation " + ", ".join(f"{d} {v:.3f}" for d, v in spec.items()) if spec else ""))
        if diffs["all"]:
            print("  mean: " + ", ".join(f"{d} {statistics.fmean(v):+.1f}" for d, v in diffs.items() if v))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("arm", choices=sorted(ARMS))
    r.add_argument("--lr", type=float, required=True)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--steps", type=int, default=100)
    r.add_argument("--eval-every", type=int, default=10)
    r.add_argument("--threads", type=int, default=1)
    r.add_argument("--out", default="runs/remix_mix")
    r.add_argument("--config", default=str(CONFIG), help="the node's config (default: smollm2-silo)")
    r.add_argument("--extra", nargs="*", default=[], help="more config overrides (key=value)")
    g = sub.add_parser("grid")
    g.add_argument("--runs", nargs="+", required=True, help="ARM=LR[,LR...] for each arm")
    g.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    g.add_argument("--steps", type=int, default=100)
    g.add_argument("--eval-every", type=int, default=10)
    g.add_argument("--threads", type=int, default=1)
    g.add_argument("--deadline", type=float, default=0, help="stop the runs still going after S seconds (0: never)")
    g.add_argument("--every", type=float, default=15, help="seconds between progress lines (and packs)")
    g.add_argument("--pack", default=None, help="rewrite this tar.gz of every run's metrics and config as they go")
    g.add_argument("--out", default="runs/remix_mix")
    g.add_argument("--config", default=str(CONFIG), help="the node's config (default: smollm2-silo)")
    g.add_argument("--extra", nargs="*", default=[], help="more config overrides (key=value), for every run")
    p = sub.add_parser("report")
    p.add_argument("--out", default="runs/remix_mix")
    p.add_argument("--pick", nargs="*", default=[], help="ARM=LR: each arm's picked rate (remix among them)")
    p.add_argument("--sweep-step", type=int, default=30)
    p.add_argument("--plots", default=None, help="write the plots into this folder")
    args = parser.parse_args(argv)
    return {"run": run, "grid": grid, "report": report}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
