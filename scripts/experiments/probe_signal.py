"""Where a base model gives RL signal: held-out reward and the share of groups with signal, per dataset and
prompt variant, measured with the node's own task sources, prompt formatting, generation backend and scoring.

Usage: python scripts/experiments/probe_signal.py [--model smollm2-135m] [--source reasoning_gym]
                                      [--datasets basic_arithmetic,syllogism,...] [--dataset-configs easy]
                                      [--variants none,default,example] [--tasks 12] [--samples 8]
                                      [--max-new-tokens 96] [--backend vllm] [--dtype float32] [--threads 2]
                                      [--out runs/probe_signal.json] [key=value ...]
       python scripts/experiments/probe_signal.py --source arith --datasets add --variants default,none \
                                      model.chat_template=always --max-new-tokens 8

For every prompt variant, the same held-out tasks (``--tasks`` per dataset, the node's evaluation split) get
one greedy completion and ``--samples`` completions at temperature 1, each scored by the dataset's own
scorer exactly as the node scores (``TaskSource.score``). Per dataset and variant:

- ``greedy``: mean greedy reward; ``greedy=1``: the share of tasks whose greedy answer scored 1;
- ``sampled``: mean reward at T=1;
- ``signal``: groups (one task's completions) whose rewards are not all equal: what RLOO/GRPO learn from;
- ``exact signal``: groups where some completions score 1 and some do not (signal that is not only
  partial credit, which e.g. gcd and letter_counting give to answers that contain the right number);
- ``tagged``: the share of sampled completions with an ``<answer>`` tag (the format the scorers read first).

Variants set ``tasks.prompt`` (docs/tasks.md; results: docs/results/smollm2-signal.md): ``none`` (no system prompt, no example: a chat template's
own default system turn, if it has one), ``default`` (the source's default system prompt, no example; for
arith under ``model.chat_template=always`` its own system prompt and an example of its dataset),
``example`` (the default system prompt and the worked example ``What is 3 + 4?`` -> ``3 + 4 = 7.``
``<answer>7</answer>``), ``example-nosys`` (that example, no system prompt); ``short``, ``example-short``
and ``example-short-nosys`` are ``default``, ``example`` and ``example-nosys`` with the answer instruction
after each question shortened to ``Give your final answer inside <answer></answer> tags.`` (the default
one goes on ``e.g. <answer>42</answer>.``).

``--dataset-configs easy`` gives the easy settings below (``EASY_CONFIGS``); ``default`` the library's own;
or a YAML/JSON mapping like ``tasks.dataset_configs``. Trailing ``key=value`` are config overrides. The
machine load is printed before and after; everything is saved as JSON (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from node.config import NodeConfig, load_config  # noqa: E402
from node.generation.backend import node_backend  # noqa: E402
from node.generation.base import GenerationBackend, SamplingSettings  # noqa: E402
from node.generation.rollouts import SampledGroup, sample_groups, split_by_fit  # noqa: E402
from node.policy.model import Policy, build_policy  # noqa: E402
from node.tasks import Task, TaskSource, build_task_source  # noqa: E402

EASY_CONFIGS: dict[str, dict[str, Any]] = {
    "basic_arithmetic": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2, "operators": ["+", "-"],
                         "allow_parentheses": False, "allow_negation": False},
    "coin_flip": {"max_trials": 4},
    "gcd": {"max_value": 50},
    "leg_counting": {"min_animals": 1, "max_animals": 2, "max_instances": 3},
    "letter_counting": {"min_words": 3, "max_words": 5},
    "number_sorting": {"min_numbers": 3, "max_numbers": 4, "min_value": 0, "max_value": 50, "max_decimals": 0},
    "simple_equations": {"min_terms": 2, "max_terms": 2, "max_value": 20},
    "spell_backward": {"max_word_len": 5},
    "word_sorting": {"max_words": 4},
}
"""Easy settings of reasoning-gym datasets for a small model (syllogism: the library's own)."""
CANDIDATES = ["basic_arithmetic", "syllogism", "spell_backward", "gcd", "leg_counting", "letter_counting",
              "word_sorting", "simple_equations", "coin_flip", "number_sorting"]
EXAMPLE = "{user: 'What is 3 + 4?', assistant: \"3 + 4 = 7.\\n<answer>7</answer>\"}"
SHORT = "tasks.prompt.answer_instruction='Give your final answer inside <answer></answer> tags.'"
VARIANTS: dict[str, list[str]] = {
    "none": ["tasks.prompt.system=null", "tasks.prompt.examples=[]"],
    "default": [],
    "short": [SHORT],
    "example": [f"tasks.prompt.examples=[{EXAMPLE}]"],
    "example-nosys": ["tasks.prompt.system=null", f"tasks.prompt.examples=[{EXAMPLE}]"],
    "example-short": [f"tasks.prompt.examples=[{EXAMPLE}]", SHORT],
    "example-short-nosys": ["tasks.prompt.system=null", f"tasks.prompt.examples=[{EXAMPLE}]", SHORT],
}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="smollm2-135m", help="model.name_or_path")
    p.add_argument("--source", default="reasoning_gym", choices=["reasoning_gym", "arith"])
    p.add_argument("--datasets", default=",".join(CANDIDATES))
    p.add_argument("--dataset-configs", default="easy", help="easy | default | a YAML/JSON mapping")
    p.add_argument("--variants", default="none,default,example,example-short",
                   help=f"comma-separated, of {list(VARIANTS)}")
    p.add_argument("--tasks", type=int, default=12, help="held-out tasks per dataset")
    p.add_argument("--samples", type=int, default=8, help="completions per task at temperature 1 (G)")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--backend", default="vllm", choices=["hf", "vllm"])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs/probe_signal.json")
    p.add_argument("overrides", nargs="*", help="config overrides, key=value")
    args = p.parse_args()
    unknown = [v for v in args.variants.split(",") if v not in VARIANTS]
    if unknown:
        p.error(f"unknown variant(s) {unknown}; choose from {list(VARIANTS)}")
    return args


def dataset_configs(choice: str, datasets: list[str]) -> dict[str, dict[str, Any]]:
    if choice == "default":
        return {}
    if choice == "easy":
        return {d: EASY_CONFIGS[d] for d in datasets if d in EASY_CONFIGS}
    loaded = yaml.safe_load(choice)
    if not isinstance(loaded, dict):
        raise SystemExit(f"--dataset-configs must be easy, default or a mapping, got {choice!r}")
    return loaded


def node_config(args: argparse.Namespace, variant: str) -> NodeConfig:
    datasets = args.datasets.split(",")
    overrides = [f"model.name_or_path={args.model}", f"model.dtype={args.dtype}", "model.device=cpu",
                 "adapter.rank=16", "adapter.alpha=32", "adapter.train_norms=false", f"seed={args.seed}",
                 f"tasks.source={args.source}", f"tasks.datasets=[{', '.join(datasets)}]",
                 f"generation.backend={args.backend}", f"generation.max_new_tokens={args.max_new_tokens}",
                 f"generation.group_size={args.samples}"]
    if args.source == "reasoning_gym":
        overrides.append(f"tasks.dataset_configs={json.dumps(dataset_configs(args.dataset_configs, datasets))}")
    return load_config(None, [*overrides, *VARIANTS[variant], *args.overrides])


def build_source(cfg: NodeConfig) -> TaskSource:
    t = cfg.tasks
    return build_task_source(t.source, list(t.datasets), None, cfg.seed, **t.source_options(cfg.model.chat_template))


def tagged(text: str) -> bool:
    return "<answer>" in text.lower()


def summarize(greedy: list[SampledGroup], sampled: list[SampledGroup]) -> dict[str, Any]:
    """The measures of one dataset and variant (see the module docstring)."""
    greedy_rewards = [g.group.rewards[0] for g in greedy]
    rewards = [g.group.rewards for g in sampled]
    flat = [r for group in rewards for r in group]
    texts = [t for g in sampled for t in g.texts]
    return {
        "tasks": len(greedy),
        "greedy_reward": sum(greedy_rewards) / len(greedy_rewards),
        "greedy_exact": sum(r == 1.0 for r in greedy_rewards) / len(greedy_rewards),
        "greedy_tagged": sum(tagged(g.texts[0]) for g in greedy) / len(greedy),
        "sampled_reward": sum(flat) / len(flat),
        "sampled_exact": sum(r == 1.0 for r in flat) / len(flat),
        "groups": len(rewards),
        "groups_with_signal": sum(len(set(group)) > 1 for group in rewards),
        "groups_with_exact_signal": sum(0 < sum(r == 1.0 for r in group) < len(group) for group in rewards),
        "tagged": sum(tagged(t) for t in texts) / len(texts),
        "greedy_example": greedy[0].texts[0][:300],
        "sampled_examples": [t[:300] for t in sampled[0].texts[:3]],
    }


def run_variant(args: argparse.Namespace, variant: str, policy: Policy, backend: GenerationBackend,
                tasks_by_ref: list[Task] | None) -> tuple[dict[str, dict[str, Any]], dict[str, float], list[Task]]:
    cfg = node_config(args, variant)
    source = build_source(cfg)
    tasks = tasks_by_ref or [source.task(r) for r in source.eval_refs(args.tasks * len(source.datasets))]
    fit, too_long = split_by_fit(policy, source, tasks, backend.max_len)
    if too_long:
        print(f"  {len(too_long)} task(s) left out: prompt too long for the backend", flush=True)
    gen = torch.Generator().manual_seed(args.seed)
    started = time.perf_counter()
    greedy = sample_groups(backend, policy, source, fit, group_size=1, generator=gen,
                           settings=SamplingSettings(max_new_tokens=args.max_new_tokens, greedy=True))
    greedy_s = time.perf_counter() - started
    started = time.perf_counter()
    sampled = sample_groups(backend, policy, source, fit, group_size=args.samples, generator=gen,
                            settings=SamplingSettings(max_new_tokens=args.max_new_tokens, temperature=1.0))
    sampled_s = time.perf_counter() - started
    tokens = sum(len(c) for g in [*greedy, *sampled] for c in g.group.completions)
    timing = {"greedy_s": greedy_s, "sampled_s": sampled_s, "tokens": tokens,
              "tokens_per_s": tokens / (greedy_s + sampled_s)}
    rows: dict[str, dict[str, Any]] = {}
    for dataset in source.datasets:
        g = [x for x in greedy if x.task.ref.dataset == dataset]
        s = [x for x in sampled if x.task.ref.dataset == dataset]
        if g:
            rows[dataset] = summarize(g, s)
    return rows, timing, tasks


def print_table(results: dict[str, dict[str, dict[str, Any]]], args: argparse.Namespace) -> None:
    print(f"\n{args.model} ({args.dtype}, {args.backend}), {args.tasks} held-out tasks per dataset x {args.samples} "
          f"samples at T=1 and 1 greedy, {args.max_new_tokens} new tokens at most\n")
    print("| dataset | prompt | greedy | greedy=1 | sampled | groups with signal | exact signal | tagged |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    datasets = list(next(iter(results.values())))
    for dataset in datasets:
        for variant, rows in results.items():
            r = rows[dataset]
            print(f"| {dataset} | {variant} | {r['greedy_reward']:.3f} | {r['greedy_exact']:.2f} | "
                  f"{r['sampled_reward']:.3f} | {r['groups_with_signal']}/{r['groups']} | "
                  f"{r['groups_with_exact_signal']}/{r['groups']} | {r['tagged']:.2f} |")
    for variant, rows in results.items():
        groups = sum(r["groups"] for r in rows.values())
        signal = sum(r["groups_with_signal"] for r in rows.values())
        exact = sum(r["groups_with_exact_signal"] for r in rows.values())
        tag = sum(r["tagged"] * r["groups"] for r in rows.values()) / groups
        print(f"| all | {variant} | | | | {signal}/{groups} | {exact}/{groups} | {tag:.2f} |")


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    print(f"probe_signal: {args.model} on {args.source} {args.datasets}; {args.threads} threads, "
          f"load average {load_before[0]:.1f} (1 min), {load_before[1]:.1f} (5 min)", flush=True)
    variants = args.variants.split(",")
    cfg = node_config(args, variants[0])
    started = time.perf_counter()
    policy = build_policy(cfg.model, cfg.adapter, cfg.seed)
    backend = node_backend(cfg, policy)
    print(f"model and {args.backend} backend ready in {time.perf_counter() - started:.0f} s", flush=True)
    results: dict[str, dict[str, dict[str, Any]]] = {}
    timings: dict[str, dict[str, float]] = {}
    tasks: list[Task] | None = None
    try:
        for variant in variants:  # the same held-out tasks for every variant: prompting does not change them
            results[variant], timings[variant], tasks = run_variant(args, variant, policy, backend, tasks)
            t = timings[variant]
            print(f"variant {variant}: {t['tokens']} tokens in {t['greedy_s'] + t['sampled_s']:.0f} s "
                  f"({t['tokens_per_s']:.0f} tokens/s), load {os.getloadavg()[0]:.1f}", flush=True)
    finally:
        backend.close()
    print_table(results, args)
    load_after = os.getloadavg()
    print(f"\nload average before {load_before[0]:.1f}/{load_before[1]:.1f}, after {load_after[0]:.1f}/"
          f"{load_after[1]:.1f} (1/5 min) on {os.cpu_count()} cores", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {"args": vars(args), "command": " ".join(sys.argv), "load_before": load_before, "load_after": load_after,
              "cpu_count": os.cpu_count(), "dataset_configs": cfg.tasks.dataset_configs,
              "prompts": {v: VARIANTS[v] for v in variants}, "timings": timings, "results": results}
    out.write_text(json.dumps(record, indent=1))
    print(f"saved {out}")


if __name__ == "__main__":
    main()
