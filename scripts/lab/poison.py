"""Verifier-passing poison against a real victim node, with and without its defence (docs/trust.md).

Usage: python scripts/lab/poison.py [--model smollm2|small] [--attacks phrase-prefix,length,...|all]
                                    [--arms silo,shared,shared-unscreened,undefended,defended]
                                    [--steps 50] [--seeds 0]
                                    [--honest same|small|none] [--out runs/poison] [--threads 2]
                                    [--only NAME,...] [--jobs 1] [--deadline 0]

Each run is a victim among one honest peer and one attacker (``scripts/lib/poison/lab.py``: real nodes on an
in-memory swarm carrying the signed bytes through the same checks as the hivemind path; the attacker needs no
model). ``undefended`` switches the victim's peer-text screen off (``ingest.screen=false``), ``defended`` runs
the defaults, ``silo`` is the victim alone with the same seed (the baseline of its held-out reward and its
completions' length); ``shared`` and ``shared-unscreened`` are the victim beside the honest peer with no
attacker, with and without the screen (what sharing alone does, and what the screen does to it; each attack's
payload measured on the victim as on the silo). A run's
result is saved as JSON in ``--out`` as soon as it ends, and a run already saved there is not run again, so
an interrupted suite goes on where it stopped. With ``--jobs N`` the runs go side by side, N at a time, each
its own process logging to ``--out`` (on a GPU they share the card), with a progress line every ``--every``
seconds and the runs still going at ``--deadline`` stopped. The table at the end gives,
per attack and arm, the attack success rate (the share of the victim's own held-out completions, sampled at
its temperature and greedy, that carry the payload), the victim's held-out greedy reward against the silo's
(and their difference task by task, in points, with its 95% interval) and its mean completion length against
the silo's, and the payload's mean log-prob a token before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

from scripts.lib.poison.attacks import ADAPTIVE, SUITE, together
from scripts.lib.poison.lab import ROOT, LabSpec, run
from scripts.lib.poison.report import summary, table
from scripts.lib.side_by_side import run_side_by_side

MODELS = {
    # the victim: configs/smollm2-swarm.yaml on one dataset, 8 own + up to 8 peer groups a step
    "smollm2": ("configs/smollm2-swarm.yaml", ("tasks.datasets=[basic_arithmetic]", "tasks.eval_size=64")),
    # small-base on a dataset with single answers; peer groups weigh as much as its own
    "small": ("configs/small-silo.yaml", ("tasks.datasets=[calendar_arithmetic]", "tasks.eval_size=32",
                                          "sapo.local_groups=2", "sapo.external_groups=8",
                                          "generation.max_new_tokens=64")),
}
HONEST = {"small": "configs/small-silo.yaml"}
ARMS = {"silo": (), "shared": (), "shared-unscreened": ("ingest.screen=false",), "undefended": ("ingest.screen=false",),
        "defended": (),
        # each lever of the defence against plausible text, one at a time (docs/results/poison.md)
        "policy-reference": ("ingest.screen_reference=policy",),
        "both-reference": ("ingest.screen_reference=both",),
        "base-reference": ("ingest.screen_reference=base",),
        "no-sequence": ("ingest.screen_sequence_quantile=null",),
        # the sequence weight's floor at a higher quantile of the node's own completions: a tighter bound
        "sequence-q25": ("ingest.screen_sequence_quantile=0.25",),
        "sequence-q50": ("ingest.screen_sequence_quantile=0.5",),
        "earlier": ("ingest.screen_reference=policy", "ingest.screen_sequence_quantile=null"),
        "group-cap": ("ingest.screen_group_positive_cap=0.25",),
        "author-cap": ("ingest.screen_author_positive_cap=0.25",),
        "shared-earlier": ("ingest.screen_reference=policy", "ingest.screen_sequence_quantile=null")}
HONEST_ONLY = ("shared", "shared-unscreened", "shared-earlier")  # the honest peer and no attacker: sharing alone


def specs(args: argparse.Namespace) -> list[LabSpec]:
    config, overrides = MODELS[args.model]
    honest_config = HONEST.get(args.honest)
    out = []
    runs = [(None, together(args.attacks))] if args.together else [(a, ()) for a in args.attacks]
    # the silo and the honest-only arms measure every attack's payload too: what the victim's own training, and
    # sharing alone, do to it
    measured = together(args.attacks) if args.together else tuple(SUITE[a] for a in args.attacks)
    for seed in args.seeds:
        for arm in args.arms:  # in the order given
            if arm == "silo":
                out.append(LabSpec(None, config, (*overrides, *args.set), silo=True, steps=args.steps, seed=seed,
                                   threads=args.threads, eval_tasks=args.eval_tasks, samples=args.samples,
                                   label=args.model, attacks=measured))
                continue
            if arm in HONEST_ONLY and args.honest == "none":
                continue  # no peer at all: the silo
            for attack, extra in [(None, measured)] if arm in HONEST_ONLY else runs:
                out.append(LabSpec(attack, config, (*overrides, *args.set), ARMS[arm], honest=args.honest != "none",
                                   honest_config=honest_config, steps=args.steps, seed=seed, threads=args.threads,
                                   attacker_groups=args.attacker_groups, eval_tasks=args.eval_tasks,
                                   samples=args.samples, label=f"{args.model}-{arm}", attacks=extra,
                                   send=arm not in HONEST_ONLY))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=list(MODELS), default="smollm2")
    p.add_argument("--attacks", default="all", help=f"comma-separated of {list(SUITE)}, or all, or adaptive")
    p.add_argument("--arms", default="silo,undefended,defended", help=f"comma-separated of {list(ARMS)}")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--seeds", default="0", help="comma-separated")
    p.add_argument("--honest", choices=("same", "small", "none"), default="same",
                   help="the honest peer: a node of the victim's config, a small-base node, or none")
    p.add_argument("--attacker-groups", type=int, default=4, help="groups the attacker sends a step")
    p.add_argument("--eval-tasks", type=int, default=64)
    p.add_argument("--samples", type=int, default=4, help="sampled completions a held-out task")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default="runs/poison")
    p.add_argument("--together", action="store_true", help="every attack against one victim at once, each from "
                   "its own attacker with a payload of its own (one run an arm instead of one an attack)")
    p.add_argument("--only", default="", help="comma-separated run names, as saved (silo-smollm2-s0, "
                   "length-smollm2-defended-s1): run only these of the grid")
    p.add_argument("--jobs", type=int, default=1, help="runs side by side, each its own process (on a GPU they "
                   "share the card)")
    p.add_argument("--deadline", type=float, default=0, help="with --jobs: stop the runs still going after S "
                   "seconds (exit 3; what finished is saved)")
    p.add_argument("--every", type=float, default=30, help="with --jobs: seconds between progress lines")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="more config overrides (every node)")
    args = p.parse_args(argv)
    args.attacks = (list(SUITE) if args.attacks == "all" else list(ADAPTIVE) if args.attacks == "adaptive"
                    else args.attacks.split(","))
    unknown = [a for a in args.attacks if a not in SUITE]
    if unknown:
        p.error(f"--attacks: unknown {unknown}; choose from {list(SUITE)}")
    args.arms = args.arms.split(",")
    if any(a not in ARMS for a in args.arms):
        p.error(f"--arms: choose from {list(ARMS)}")
    args.seeds = [int(s) for s in args.seeds.split(",")]
    if args.jobs < 1:
        p.error("--jobs: at least 1")
    grid = specs(args)
    if args.only:
        only = args.only.split(",")
        missing = sorted(set(only) - {s.name for s in grid})
        if missing:
            p.error(f"--only: {missing} are not runs of this grid; its runs: {[s.name for s in grid]}")
        grid = [s for s in grid if s.name in only]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    code = 0
    todo = [s for s in grid if not (out / f"{s.name}.json").exists()]
    if args.jobs > 1 and len(todo) > 1:
        code = side_by_side(args, argv if argv is not None else sys.argv[1:], todo, out)
        todo = []
    results = []
    for spec in grid:
        path = out / f"{spec.name}.json"
        if path.exists():
            results.append(json.loads(path.read_text()))
            continue
        if spec not in todo:
            continue  # stopped at the deadline or failed: named above
        load = os.getloadavg()[0]
        print(f"poison: {spec.name} ({spec.steps} steps, load {load:.1f}) ...", flush=True)
        started = time.perf_counter()
        result = asdict(run(spec, progress=lambda what, n=spec.name: print(f"poison: {n}: {what}", flush=True)))
        result["load"] = [load, os.getloadavg()[0]]
        path.write_text(json.dumps(result, indent=1))
        results.append(result)
        for a, asr in result["asr_sampled"].items():
            print(f"poison: {spec.name}: {a}: ASR {100 * asr:.1f}% sampled, {100 * result['asr_greedy'][a]:.1f}% "
                  f"greedy; own samples with the payload by step {[round(x, 2) for x in result['own_asr'][a]]}",
                  flush=True)
            for step, text in result["own_carrying"].get(a, []):
                print(f"poison: {spec.name}: {a}: its own sample at step {step}: {text!r}", flush=True)
        print(f"poison: {spec.name}: held-out greedy {result['greedy_reward']:.3f} "
              f"({time.perf_counter() - started:.0f} s)", flush=True)
    print("\n".join(table(results)))
    print("\n".join(summary(results)))
    mean_load = statistics.fmean(x for r in results for x in r.get("load", [])) if results else 0.0
    print(f"mean load average {mean_load:.1f}")
    return code


def side_by_side(args: argparse.Namespace, argv: list[str], todo: list[LabSpec], out: Path) -> int:
    """Run ``todo`` at most ``--jobs`` at once, each this script in its own process with ``--only`` its name;
    1 when one failed, 3 when the deadline stopped some, else 0."""
    me = [sys.executable, str(Path(__file__).resolve()), *argv]
    commands = {s.name: [*me, "--only", s.name, "--jobs", "1"] for s in todo}

    def state(name: str) -> str:  # the last progress line of the run's log
        if (out / f"{name}.json").exists():
            return "done"
        log = out / f"{name}.log"
        lines = [x for x in log.read_text(errors="replace").splitlines() if x.startswith(f"poison: {name}: ")] \
            if log.exists() else []
        return lines[-1].split(": ", 2)[2] if lines else "starting"

    print(f"poison: {len(todo)} runs, {args.jobs} at a time: {' '.join(commands)}", flush=True)
    outcome = run_side_by_side(commands, out, cwd=ROOT, jobs=args.jobs, deadline=args.deadline, every=args.every,
                               state=state, label="poison")
    return 1 if outcome.failed else 3 if outcome.stopped else 0


if __name__ == "__main__":
    raise SystemExit(main())
