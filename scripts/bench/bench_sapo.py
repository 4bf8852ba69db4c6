"""Does sharing pay? SAPO on K nodes in one process, exchanging signed batches over the real wire path.

Usage:
    python scripts/bench/bench_sapo.py --quick                       # a small grid, under 10 minutes on 2 cores
    python scripts/bench/bench_sapo.py --full [--jobs 2] [--out DIR]  # the whole grid: 72 runs, about 1.3 CPU-hours
    python scripts/bench/bench_sapo.py [--settings ...] [--arms ...] [--splits 8/0 4/4 8+8] [...] (--help)
    python scripts/bench/bench_sapo.py --out DIR --report       # tables and plot from the finished runs only

Each run: K nodes joined to an in-memory swarm (``swarm.memory``) that carries the same
bytes as the hivemind transport: every batch encoded and signed, its manifest signed, both verified and
screened by the receiver's peer book (quotas, staleness, dedup) through ``swarm.intake``, then ingested
(tasks regenerated, completions re-scored, held-out tasks rejected). Nodes step round-robin, one epoch a
step. Splits: ``I/J`` equal generation compute (I + J groups generated, I own + up to J peer groups
trained on), ``I+J`` on top (I generated and trained on, plus up to J peer groups); each is paired with
the silo ``T/0`` generating as many groups. Arms (peer-data treatment): ``grpo_onpolicy`` (Gensyn's:
GRPO, ratio fixed at 1; baseline ``silo_grpo``), ``topr_uncorrected`` (TOPR with the ratio fixed at 1),
``topr_corrected`` (TOPR taper with behaviour log-probs) and ``rec`` (REC clipping), all three against the
TOPR ``silo``; and ``remix``, the TOPR silo with a ReMix adapter of the same active rank, against the LoRA
silo at the same split (``remix_lr2`` against ``lora_lr2``: both at twice the learning rate, the latter
against the silo). Lever arms (``sapo_runs.LEVER_ARMS``), TOPR corrected with one change each, against
the TOPR silo: ``topr_fixed_loss`` (the loss summed over a fixed I x G sequences), ``topr_2_updates`` (two
optimizer steps a training step), ``topr_by_reward`` (peer groups by their re-scored mean reward),
``topr_low_signal`` (peer groups first on the datasets where the node's own carry the least signal),
``topr_above_own`` (only peer groups whose mean reward beats the node's own on their dataset),
``topr_fill`` (peer groups only in the slots of the step's flat own groups, datasets inside the node's
learning band first: ``sapo.peer_slots=flat``, ``sapo.dataset_preference=learning_band``) and
``topr_decide`` (the same, taken only while the node's estimate says they pay: ``sapo.take_peers=decide``).
Settings (``sapo_runs.SETTINGS``): homogeneous tiny nodes; a capability-heterogeneous
swarm (tiny bases pretrained for different lengths, on a common mixture); a sparse-signal regime (3-digit
addition); ``models``, two models with two tokenizers (smollm2-135m beside small-base, every peer group
re-tokenized, re-scored and anchored); ``smollm2``, homogeneous smollm2-135m nodes on reasoning-gym;
``smollm2-pair``, base smollm2-135m nodes (weak) beside smollm2-135m nodes started from a 20-step silo
run's adapter (strong, ``adapter.init_from``); ``smollm2-mix3``, smollm2-135m on three datasets of
different kinds (for ReMix); ``small`` (homogeneous small-base) and ``smollm2-arith`` (smollm2-135m on
basic_arithmetic alone, where its own groups run dry within 20 steps), for long horizons. A job of these settings holds about 4 GB resident (7 GB with ReMix).

Pairing: node i of a seed index has the same seed, base and task stream in every arm, so each sharing run
is compared with its silo seed by seed; deltas are means over seeds with a 95% t-interval.

Output: one line per finished run; per setting a table of cumulative reward (each node's sampled reward
on its own tasks averaged over the run, then over the nodes of a type) and final greedy accuracy on
held-out tasks, with the change against the paired silo; the per-step cost of the exchange; the goals.
``--out`` gets ``runs/*.json`` (one per run: a rerun skips finished runs, so a long grid can be resumed;
each holds the commit, command and load average of every process that ran part of it, the peer data
rejected and the peer groups left unread by a budget, by reason),
``results.json``, ``table.md``, ``reward_curves.png`` and ``signal_curves.png`` (the share of own groups
with signal beside reward and held-out accuracy). With ``--checkpoint-every N`` a run's nodes checkpoint
every N steps under ``--out``'s ``work/``, and a rerun of a stopped run resumes there.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, replace
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from scripts.lib.sapo.plots import reward_curves, signal_curves  # noqa: E402
from scripts.lib.sapo.regime import decision_lines, regime_lines  # noqa: E402
from scripts.lib.sapo.report import (
    MAIN_ARM,
    cost_line,
    cum_reward,
    end_lines,
    goals,
    mean_ci,
    pause_lines,
    summarize,
    table_lines,
)
from scripts.lib.sapo.runs import (  # noqa: E402
    BASELINE_OF,
    BASES,
    NODE_TYPES,
    SETTINGS,
    SHARING_ARMS,
    TREATMENT_ARMS,
    VARIANT_OF,
    RunSpec,
    base_path,
    parse_split,
    run_one,
    silo_split,
    trained_run,
    type_overrides,
)

QUICK: dict[str, Any] = {"settings": ["homogeneous", "capability"], "arms": [MAIN_ARM], "nodes": 4,
                         "steps": 30, "seeds": 1, "splits": ["8/0", "4/4", "8+8"], "ablation_splits": None}
# The grid of docs/results/sapo-tiny.md. Splits by setting: the homogeneous goal is "at every split"; the heterogeneous
# settings are run at one equal-compute and one on-top split. The ablation arms (on-policy GRPO, TOPR
# uncorrected, REC) run at one split per setting beside TOPR corrected.
FULL: dict[str, Any] = {
    "settings": ["homogeneous", "capability", "sparse"], "arms": TREATMENT_ARMS, "nodes": 8, "steps": 60, "seeds": 3,
    "splits": {"homogeneous": ["8/0", "6/2", "4/4", "2/6", "8+4", "8+8"], "capability": ["8/0", "4/4", "8+8"],
               "sparse": ["8/0", "4/4", "8+8"]},
    "ablation_splits": {"homogeneous": ["4/4"], "capability": ["8+8"], "sparse": ["8+8"]},
}



def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help=f"small grid: {QUICK}")
    mode.add_argument("--full", action="store_true", help=f"the whole grid (the default): {FULL}")
    p.add_argument("--settings", nargs="+", choices=list(SETTINGS))
    p.add_argument("--arms", nargs="+", choices=[*SHARING_ARMS, *VARIANT_OF],
                   help="sharing arms (their silos are added); remix runs at the silo splits")
    p.add_argument("--splits", nargs="+", help="I/J (equal compute) or I+J (on top); silos T/0 are added")
    p.add_argument("--ablation-splits", nargs="+",
                   help=f"the arms other than {MAIN_ARM} run only at these splits (default: at every split)")
    p.add_argument("--nodes", type=int, help="K nodes a run")
    p.add_argument("--steps", type=int, help="training steps a node")
    p.add_argument("--seeds", type=int, help="seed indices a configuration")
    p.add_argument("--first-seed", type=int, default=0, help="first seed index (to add seeds to an earlier run)")
    p.add_argument("--group-size", type=int, default=8, help="G completions a group")
    p.add_argument("--eval-every", type=int, default=0, help="held-out evaluation every N steps (0: the last only)")
    p.add_argument("--checkpoint-every", type=int, default=0,
                   help="checkpoint every N steps under --out's work/, so a stopped run resumes (0: never)")
    p.add_argument("--set", dest="extra", nargs="*", default=[], metavar="key=value",
                   help="node config overrides for every run (e.g. sapo.dataset_preference=low_signal); "
                   "TYPE:key=value for the nodes of one type (e.g. smollm2:generation.backend=vllm)")
    p.add_argument("--jobs", type=int, default=2, help="runs in parallel (one process, one torch thread each)")
    p.add_argument("--out", default="runs/bench_sapo", help="results folder (finished runs in it are reused)")
    p.add_argument("--run-only", nargs="+", metavar="ARM",
                   help="run only the runs of these arms (e.g. while their silos run in another process); the "
                   "grid's other runs are reported if finished in --out")
    p.add_argument("--baselines", metavar="OUT",
                   help="pair the arms with the silo runs finished in this other results folder (same setting, "
                   "split, seed, nodes and steps; their --set may differ): a lever's arm, run with --run-only "
                   "and its own --set, against the silo already run without it")
    p.add_argument("--report", action="store_true",
                   help="run nothing: tables, goals and plot from the grid's runs already finished in --out")
    args = p.parse_args(argv)
    preset = dict(QUICK if args.quick else FULL)
    if args.splits is not None:
        preset["ablation_splits"] = None  # custom splits: every arm at every split unless told otherwise
    for key, value in preset.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    try:
        for setting in args.settings:
            for split in [*_for(args.splits, setting), *_for(args.ablation_splits, setting)]:
                parse_split(split)
        type_overrides(tuple(args.extra), "")
    except ValueError as exc:
        p.error(str(exc))
    if args.baselines and not (Path(args.baselines) / "runs").is_dir():
        p.error(f"--baselines: {args.baselines} has no runs/ folder; name the --out of the silo's run")
    return args


def _for(value: list[str] | dict[str, list[str]] | None, setting: str) -> list[str]:
    """A split list given for every setting, or by setting."""
    if value is None:
        return []
    return value.get(setting, []) if isinstance(value, dict) else value


def build_grid(args: argparse.Namespace) -> list[RunSpec]:
    """Every sharing arm at every sharing split (other arms than the main one only at the ablation splits),
    plus the silos they are paired with, and every variant arm (remix) at every silo split, for every seed."""
    silo_arms = list(dict.fromkeys(BASELINE_OF[a] for a in args.arms))
    common = dict(nodes=args.nodes, steps=args.steps, group_size=args.group_size, extra=tuple(args.extra),
                  eval_every=args.eval_every)
    grid = []
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        for setting in args.settings:
            splits = _for(args.splits, setting)
            sharing = [s for s in splits if parse_split(s)[1] > 0]
            ablation = _for(args.ablation_splits, setting)
            silos = list(dict.fromkeys([*(s for s in splits if parse_split(s)[1] == 0), *map(silo_split, sharing)]))
            grid += [RunSpec(setting, arm, split, seed, **common) for arm in silo_arms for split in silos]  # type: ignore[arg-type]
            for arm in args.arms:
                arm_splits = sharing if arm == MAIN_ARM or args.ablation_splits is None else [
                    s for s in sharing if s in ablation]
                if arm in VARIANT_OF:
                    arm_splits = silos
                grid += [RunSpec(setting, arm, split, seed, **common) for split in arm_splits]  # type: ignore[arg-type]
    return list(dict.fromkeys(grid))  # a variant arm can be another's baseline too: each run once


def same_spec(saved: dict[str, Any], spec: RunSpec) -> bool:
    """Whether a saved run's spec is ``spec`` (a field the saved one predates counts at its default)."""
    wanted = json.loads(json.dumps(asdict(spec)))
    defaults = json.loads(json.dumps(asdict(RunSpec(spec.setting, spec.arm, spec.split, spec.seed_index))))
    return all(saved.get(key, defaults[key]) == value for key, value in wanted.items())


def _finished(grid: list[RunSpec], runs_dir: Path) -> tuple[list[dict[str, Any]], list[RunSpec]]:
    """The runs of ``grid`` already saved in ``runs_dir``, and the specs still to run."""
    results: list[dict[str, Any]] = []
    todo = []
    for spec in grid:
        path = runs_dir / f"{spec.name}.json"
        if path.is_file():
            res = json.loads(path.read_text())
            if same_spec(res["spec"], spec):
                results.append(res)
                continue
        todo.append(spec)
    return results, todo


def borrowed_baselines(grid: list[RunSpec], results: list[dict[str, Any]], folder: Path) -> list[dict[str, Any]]:
    """The silo runs of ``grid`` missing from ``results`` that ``folder/runs`` holds with other config
    overrides (everything else of the spec the same), each named as borrowed."""
    have = {(r["spec"]["setting"], r["spec"]["arm"], r["spec"]["split"], r["spec"]["seed_index"]) for r in results}
    saved = [json.loads(p.read_text()) for p in sorted((folder / "runs").glob("*.json"))]
    borrowed = []
    for spec in grid:
        key = (spec.setting, spec.arm, spec.split, spec.seed_index)
        if spec.arm not in BASELINE_OF.values() or key in have:
            continue
        wanted = replace(spec, extra=())
        for res in saved:
            if same_spec({**res["spec"], "extra": []}, wanted):
                print(f"bench_sapo: baseline {res['name']} from {folder} (its --set: {res['spec'].get('extra')})",
                      flush=True)
                borrowed.append(res)
                have.add(key)
                break
    return borrowed


def execute(grid: list[RunSpec], jobs: int, out: Path, run: bool = True, checkpoint_every: int = 0,
            only: list[str] | None = None) -> list[dict[str, Any]]:
    """Run every spec not already finished in ``out/runs`` (``jobs`` processes), one line per run; with
    ``run`` False, only the finished ones (the missing ones are named); with ``only``, the runs of those arms
    (the others' finished runs are reused, the missing ones named). A run's nodes live in
    ``out/work/NAME`` while it runs (checkpoints every ``checkpoint_every`` steps: a rerun resumes there)."""
    runs_dir = out / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    results, todo = _finished(grid, runs_dir)
    if results:
        print(f"bench_sapo: {len(results)} finished runs reused from {runs_dir}", flush=True)
    skipped = [spec for spec in todo if not run or (only is not None and spec.arm not in only)]
    todo = [spec for spec in todo if spec not in skipped]
    for spec in skipped:
        print(f"bench_sapo: not run (left out of the tables): {spec.name}", flush=True)
    if not run:
        return results
    t0 = time.perf_counter()

    def work(spec: RunSpec) -> Path | None:
        return out / "work" / spec.name if checkpoint_every else None

    def report(res: dict[str, Any]) -> None:
        (runs_dir / f"{res['name']}.json").write_text(json.dumps(res))
        if checkpoint_every:
            shutil.rmtree(out / "work" / res["name"], ignore_errors=True)  # its checkpoints: the run is done
        results.append(res)
        cum = statistics.fmean(cum_reward(r) for r in res["rewards"])
        acc = statistics.fmean(res["accuracy"])
        print(f"[{len(results):3d}/{len(grid)}] {res['name']:<44s} cum_reward {cum:.3f}  acc {acc:.3f}  "
              f"{res['seconds']:.0f}s, {res.get('cpu_seconds', 0):.0f} CPU-s (elapsed {time.perf_counter() - t0:.0f}s)",
              flush=True)

    failed: list[str] = []

    def failure(spec: RunSpec, exc: BaseException) -> None:
        """A run that raised is named with its error and left unsaved (a rerun retries it); the others go on."""
        failed.append(spec.name)
        detail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        print(f"bench_sapo: run {spec.name} failed: {type(exc).__name__}: {exc}\n{detail}", flush=True)

    if jobs <= 1 or len(todo) <= 1:
        for spec in todo:
            try:
                res = run_one(spec, 1, work(spec), checkpoint_every)
            except Exception as exc:  # one run's failure must not lose the grid's other runs
                failure(spec, exc)
                continue
            report(res)
    else:
        with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn")) as pool:
            futures = {pool.submit(run_one, spec, 1, work(spec), checkpoint_every): spec for spec in todo}
            for fut in as_completed(futures):
                try:
                    res = fut.result()
                except Exception as exc:  # raised in the run, or its worker died (e.g. killed for memory)
                    failure(futures[fut], exc)
                    continue
                report(res)
    if failed:
        print(f"bench_sapo: {len(failed)} run(s) failed and are left out of the tables (rerun to retry them): "
              f"{', '.join(failed)}", flush=True)
    return results


# ----------------------------------------------------------------------------------------- statistics


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    grid = build_grid(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"bench_sapo: {len(grid)} runs: settings {args.settings}, arms {args.arms}, splits {args.splits}, "
          f"K={args.nodes} nodes x {args.steps} steps, {args.seeds} seed(s), G={args.group_size}, jobs {args.jobs}, "
          f"extra {args.extra}", flush=True)
    t0 = time.perf_counter()
    for kind in dict.fromkeys(NODE_TYPES[k].base for s in args.settings for k in SETTINGS[s].node_types):
        print(f"bench_sapo: base {kind}: {base_path(kind)} {' '.join(BASES.get(kind, []))}", flush=True)
    for kind in dict.fromkeys(k for s in args.settings for k in SETTINGS[s].node_types):
        if (trained := NODE_TYPES[kind].trained) is not None:  # a missing run stops here, with its command
            print(f"bench_sapo: {kind} nodes start from {trained_run(trained)}", flush=True)
    results = execute(grid, args.jobs, out, run=not args.report, checkpoint_every=args.checkpoint_every,
                      only=args.run_only)
    if args.baselines:
        results += borrowed_baselines(grid, results, Path(args.baselines))
    if not results:
        print(f"bench_sapo: no finished runs of this grid in {out / 'runs'}", flush=True)
        return 1
    rows = summarize(results)
    print()
    for line in table_lines(rows):
        print(line)
    extra_lines = [line for line in (*end_lines(rows), *regime_lines(results, mean_ci), *decision_lines(results),
                                     cost_line(rows), *pause_lines(rows), *goals(rows)) if line]
    for line in extra_lines:
        print(line)
    reward_curves(results, out / "reward_curves.png")
    signal_curves(results, out / "signal_curves.png")
    (out / "table.md").write_text("\n".join([*table_lines(rows, markdown=True), *extra_lines]) + "\n")
    (out / "results.json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))
    timed = [r["cpu_seconds"] for r in results if "cpu_seconds" in r]
    if timed:
        cpu = sum(timed)
        print(f"bench_sapo: {len(timed)} runs took {cpu:.0f} CPU-s in all ({cpu / 60 / max(1, args.jobs):.1f} min of "
              f"{args.jobs} cores at full use; CPU time does not grow with the machine's load)", flush=True)
    print(f"bench_sapo: {time.perf_counter() - t0:.0f}s; tables in {out / 'table.md'}, every run in {out / 'runs'}, "
          f"plot in {out / 'reward_curves.png'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
