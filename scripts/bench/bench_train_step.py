"""What the fused pass and running a group's prompt once save in a training step.

The trainer's step on the same groups three ways: ``fused`` (the node's default for a Llama-family LoRA
policy: ``node.fused.decoder``, each prompt packed with its completions into one row, projections by
family), ``shared`` (through transformers' and peft's modules, ``train.fused=false``: each distinct prompt
runs once and its KV cache is copied to the group's rows, ``node.policy.logprobs.shared_prompt_logprobs``) and
``full`` (through the modules, every row running prompt and completion, ``sequence_logprobs``: what the
trainer did before prompts were shared). Each runs in its own process, so its peak resident memory is its
own; the time is the median of ``--reps`` steps after one warm-up step.

Usage:
    python scripts/bench/bench_train_step.py [-c configs/smollm2-silo.yaml] [--groups 8] [--reps 3] [--threads 1]
                                       [key=value ...]

The groups are the config's own: its task source draws the tasks and formats the prompts exactly as the
node does, ``generation.group_size`` completions a task of seeded random tokens, 8 (or fewer) to
``generation.max_new_tokens`` long, with alternating advantages.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

MODES = ("fused", "shared", "full")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-c", "--config", default=str(ROOT / "configs" / "smollm2-silo.yaml"))
    p.add_argument("--groups", type=int, default=8, help="groups (tasks) a step")
    p.add_argument("--reps", type=int, default=3, help="timed steps after one warm-up")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    p.add_argument("overrides", nargs="*", help="config overrides, key=value")
    return p.parse_args(argv)


def _groups(node, n_groups: int, seed: int = 0) -> list:
    import torch

    from node.generation.rollouts import encode_prompt
    from node.train.groups import TrainGroup

    rng = random.Random(seed)
    g = node.cfg.generation
    vocab = len(node.policy.tokenizer)
    groups = []
    for ref in node.source.sample(n_groups, rng):
        prompt = encode_prompt(node.policy, node.source.format_prompt(node.source.task(ref), node.policy.tokenizer))
        completions = [[rng.randrange(vocab) for _ in range(rng.randint(min(8, g.max_new_tokens), g.max_new_tokens))]
                       for _ in range(g.group_size)]
        group = TrainGroup(key=ref.key(), peer_id="", epoch=0, prompt_ids=prompt, completions=completions,
                           anchor_logprobs=[[-2.0] * len(c) for c in completions], rewards=[0.0] * len(completions))
        group.advantages = torch.tensor([1.0 if i % 2 else -1.0 for i in range(len(completions))])
        groups.append(group)
    return groups


def child(args: argparse.Namespace) -> dict:
    """One mode in this process: the median step time and the process's peak resident memory."""
    import torch

    import node.train.trainer as trainer_module
    from node.config import load_config
    from node.policy.logprobs import left_pad, sequence_logprobs
    from node.run.node import Node

    torch.set_num_threads(args.threads)
    if args.child == "full":  # every row in full, as the trainer ran before prompts were shared
        def full(model, prompts, completion_ids, completion_mask, *, pad_id, temperature=1.0):
            ids, mask = left_pad([list(p) for p in prompts], pad_id)
            return sequence_logprobs(model, ids, mask, completion_ids, completion_mask, temperature=temperature)

        trainer_module.shared_prompt_logprobs = full  # type: ignore[assignment]
    run_dir = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench_train_step_{os.getpid()}"
    modules = [] if args.child == "fused" else ["train.fused=false"]
    cfg = load_config(args.config, [f"run_dir={run_dir}", *args.overrides, *modules])
    node = Node(cfg, show_progress=False)
    node.setup()
    try:
        groups = _groups(node, args.groups)
        rows = sum(len(g.completions) for g in groups)
        prompt_tokens = sum(len(g.prompt_ids) * len(g.completions) for g in groups)
        distinct_prompt_tokens = sum(len(g.prompt_ids) for g in groups)
        completion_tokens = sum(len(c) for g in groups for c in g.completions)
        times = []
        for rep in range(args.reps + 1):
            t0 = time.perf_counter()
            node.trainer.step(groups)
            if rep:  # the first is a warm-up
                times.append(time.perf_counter() - t0)
    finally:
        node.close()
    return {"mode": args.child, "seconds": statistics.median(times), "rows": rows, "prompt_tokens": prompt_tokens,
            "distinct_prompt_tokens": distinct_prompt_tokens, "completion_tokens": completion_tokens,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(child(args)), flush=True)
        return 0
    load_before = os.getloadavg()
    results = {}
    for mode in MODES:
        cmd = [sys.executable, __file__, "--child", mode, "-c", args.config, "--groups", str(args.groups),
               "--reps", str(args.reps), "--threads", str(args.threads), *args.overrides]
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            print(out.stderr[-4000:], file=sys.stderr)
            return out.returncode
        results[mode] = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"bench_train_step: {mode} done", flush=True)
    r = results["shared"]
    print(f"\n{Path(args.config).name} {' '.join(args.overrides)}: {r['rows']} rows a step ({args.groups} groups), "
          f"prompt tokens {r['prompt_tokens']} ({r['distinct_prompt_tokens']} distinct), completion tokens "
          f"{r['completion_tokens']}; {args.threads} thread(s), median of {args.reps} steps after a warm-up")
    print(f"{'mode':<8} {'step s':>8} {'peak RSS MB':>12}")
    for mode in MODES:
        print(f"{mode:<8} {results[mode]['seconds']:>8.2f} {results[mode]['peak_rss_mb']:>12.0f}")
    print(f"full / shared: {results['full']['seconds'] / results['shared']['seconds']:.2f}x the time, "
          f"{results['full']['peak_rss_mb'] / results['shared']['peak_rss_mb']:.2f}x the peak memory")
    print(f"shared / fused: {results['shared']['seconds'] / results['fused']['seconds']:.2f}x the time, "
          f"{results['shared']['peak_rss_mb'] / results['fused']['peak_rss_mb']:.2f}x the peak memory; "
          f"load average {load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after")
    return 0


if __name__ == "__main__":
    sys.exit(main())
