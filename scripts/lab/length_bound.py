"""Which honest completions the screen's length bound drops between nodes at different stages of one run.

    python scripts/lab/length_bound.py --run RUN_DIR --steps 0,20 [--tasks 64] [--datasets a,b]

Each checkpoint of ``--steps`` (0: the base model) samples 8 completions for each of ``--tasks`` held-out
tasks of the run's evaluation, at the run's temperature, and plays the receiver for every other: its bound on
a dataset is what the ingestor's ``OwnProfile`` gives from those own completions
(``ingest.screen_length_ratio`` times their ``ingest.screen_length_quantile`` length, the config's defaults).
Of the other checkpoint's completions longer than that bound, the table splits those the loss would push up
(reward above their group's mean: dropped by default) from those it would push down (kept unless
``ingest.screen_length_all``), and counts the truncated ones (no end-of-sequence). A snapshot: a running node's
profile holds its last 1,024 own completions of the dataset, from several steps.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import torch

from node.config import IngestConfig
from node.exchange.plausibility import OwnProfile
from node.run.setup import screen_settings
from scripts.lib.checkpoints import held_out_tasks, policy_at, sample


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", required=True, help="a run dir (the folder a node trained in)")
    p.add_argument("--steps", required=True, help="comma-separated checkpoints, 0 for the base model")
    p.add_argument("--tasks", type=int, default=64)
    p.add_argument("--datasets", default=None, help="comma-separated; default the run's")
    args = p.parse_args()
    torch.set_num_threads(1)
    steps = [int(s) for s in args.steps.split(",")]
    datasets = args.datasets.split(",") if args.datasets else None
    cfg, source, tasks = held_out_tasks(args.run, max(steps), args.tasks, datasets)
    g = cfg.generation
    sampled = {step: sample(policy_at(args.run, step, cfg), cfg, source, tasks, group_size=8, seed=step)
               for step in steps}
    screen = screen_settings(IngestConfig())
    print(f"{args.tasks} held-out tasks x 8 completions a checkpoint; bound = {screen.length_ratio} x the own "
          f"{screen.length_quantile} quantile length (tokens); max_new_tokens {g.max_new_tokens}")
    print("| receiver | peer | dataset | bound | peer completions | longer | of them pushed up (dropped) | "
          "pushed down (kept) | truncated |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for receiver in steps:
        profile = OwnProfile(screen)
        for s in sampled[receiver]:
            profile.observe(s.task.ref.dataset, s.group.anchor_logprobs)
        for peer in (s for s in steps if s != receiver):
            rows: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0])
            for s in sampled[peer]:
                dataset, group = s.task.ref.dataset, s.group
                limit = profile.max_length(dataset)
                held = screen.held_to_length(group.rewards)
                for ids, pushed_up, finish in zip(group.completions, held, s.finish_reasons):
                    row = rows[dataset]
                    row[0] += 1
                    if limit is not None and len(ids) > limit:
                        row[1] += 1
                        row[2 if pushed_up else 3] += 1
                        row[4] += finish != "eos"
            for dataset, (n, longer, up, down, cut) in rows.items():
                print(f"| step {receiver} | step {peer} | {dataset} | {profile.max_length(dataset)} | {n} | "
                      f"{longer} | {up} | {down} | {cut} |")


if __name__ == "__main__":
    main()
