"""Benchmark ReMix step time against a single LoRA of the same active rank (issue 6, step-time half).

Usage: python scripts/bench/bench_remix.py [--n 8] [--k 2] [--rank 4] [--routings 2] [--batch 32] [--tokens 16]
                                     [--reps 30] [--threads 2] [--profile]
       python scripts/bench/bench_remix.py --rewards [--steps 150] [--seeds 3] [--local-groups 16] [--group-size 8]
                                     [--alpha 16] [--threads 1] [--out runs/bench_remix] [--extra k=v ...]

One training step = forward + backward + AdamW step on the tiny Llama shape of ``tiny-base`` (hidden 128,
intermediate 384, 2 layers), adapters on gate/up/down of every MLP. The contenders see the same tokens:

- ``remix``: n LoRAs of rank r per projection, k active, M sampled routings (the batch repeated M times,
  routing-major), policy loss over all M*B rows plus the RLOO router loss.
- ``peft``: one peft LoRA of rank k*r on the same projections, the batch repeated M times.
- ``plain``: the same single LoRA as a minimal hand-written module (no peft overhead), for reference.

Steps are interleaved (one of each per repetition, order rotating) so drift in machine load hits all
contenders alike; the median over repetitions is reported. Goal: remix / peft <= 1.25.

``--rewards`` runs the reward-curve half instead (``remix_curves.py``): the real node loop on the tiny
addition task, ReMix (n=8, k=2, r=4, M=2) against a peft LoRA of rank 8 on the same MLP projections, several
seeds; prints a table and writes ``rewards.json`` and ``rewards.png`` under ``--out``.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable

import torch
from peft import LoraConfig, get_peft_model
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from node.policy.families import MLP as MLP_PROJECTIONS
from node.policy.remix.attach import attach_remix
from node.sources.embedded.tiny import char_vocab

Step = Callable[[], None]


def build_base(seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(char_vocab()),
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=128,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config)
    model.requires_grad_(False)
    return model


class PlainLora(nn.Module):
    """``y = W x + (alpha/r) B A x``: the cheapest single LoRA, the floor any adapter is measured against."""

    def __init__(self, base: nn.Linear, rank: int) -> None:
        super().__init__()
        self.base = base
        self.lora_A = nn.Parameter(torch.randn(rank, base.in_features) / base.in_features**0.5)
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.base(x)
        return out + (x @ self.lora_A.t()) @ self.lora_B.t()


def per_sequence_loss(
    logits: torch.Tensor, ids: torch.Tensor, advantages: torch.Tensor, prompt: int
) -> torch.Tensor:
    """REINFORCE-style ``-A * mean completion log-prob`` per row: ``[R, T, V]``, ``[R, T]``, ``[R]`` -> ``[R]``."""
    logp = torch.log_softmax(logits[:, prompt - 1 : -1].float(), dim=-1)
    token_logp = logp.gather(-1, ids[:, prompt:, None]).squeeze(-1)  # [R, T - prompt]
    return -advantages * token_logp.mean(dim=-1)


def make_single_lora_step(
    model: nn.Module, ids: torch.Tensor, advantages: torch.Tensor, prompt: int
) -> tuple[Step, int]:
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss = per_sequence_loss(model(ids).logits, ids, advantages, prompt).mean()
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()

    return step, sum(p.numel() for p in params)


def make_remix_step(
    model: LlamaForCausalLM,
    args: argparse.Namespace,
    ids: torch.Tensor,
    advantages: torch.Tensor,
    prompt: int,
) -> tuple[Step, int]:
    adapter = attach_remix(model, n=args.n, k=args.k, rank=args.rank)
    adapter.sampled(args.routings, torch.Generator().manual_seed(0))
    with torch.no_grad():  # non-zero B so the LoRA path does real work in the backward
        for p in adapter.trainable_parameters()["lora"]:
            p.normal_(0, 0.02)
    groups = adapter.trainable_parameters()
    optimizer = torch.optim.AdamW(
        [{"params": groups["lora"], "lr": 1e-4}, {"params": groups["router"], "lr": 1e-3}]
    )
    prompt_mask = torch.zeros_like(ids, dtype=torch.bool)
    prompt_mask[:, :prompt] = True

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        adapter.set_prompt_mask(prompt_mask)
        per_seq = per_sequence_loss(model(ids).logits, ids, advantages, prompt)
        loss = per_seq.mean() + adapter.router_loss(per_seq, args.routings)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()

    return step, sum(p.numel() for group in groups.values() for p in group)


def time_steps(steps: dict[str, Step], reps: int, warmup: int) -> dict[str, list[float]]:
    names = list(steps)
    for _ in range(warmup):
        for name in names:
            steps[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(reps):
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            start = time.perf_counter()
            steps[name]()
            times[name].append(time.perf_counter() - start)
    return times


def profile(step: Step) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(5):
            step()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--k", type=int, default=2)
    parser.add_argument("--rank", type=int, default=4)
    parser.add_argument("--routings", type=int, default=2, help="M, routings per sequence")
    parser.add_argument("--batch", type=int, default=32, help="sequences B before repeating M times")
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=8, help="prompt tokens of each sequence")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--profile", action="store_true", help="print a torch profile of the remix step")
    rewards = parser.add_argument_group("reward curves (--rewards)")
    rewards.add_argument("--rewards", action="store_true", help="run the reward-curve half instead of the timing")
    rewards.add_argument("--steps", type=int, default=150)
    rewards.add_argument("--seeds", type=int, default=3)
    rewards.add_argument("--local-groups", type=int, default=16, help="sapo.local_groups, tasks a step")
    rewards.add_argument("--group-size", type=int, default=8, help="generation.group_size, completions a task")
    rewards.add_argument("--alpha", type=float, default=16.0, help="adapter.alpha of both arms (same scale)")
    rewards.add_argument("--eval-every", type=int, default=25)
    rewards.add_argument("--window", type=int, default=25, help="last steps for the final reward and selections")
    rewards.add_argument("--arms", nargs="+", default=["remix", "lora"], choices=["remix", "lora"])
    rewards.add_argument("--extra", nargs="*", default=[], help="more config overrides for both arms (a.b=v)")
    rewards.add_argument("--out", default="runs/bench_remix")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.rewards:
        from scripts.lib.remix_curves import run as run_reward_curves

        run_reward_curves(args)
        return

    base = build_base(seed=0)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(4, base.config.vocab_size, (args.batch, args.tokens), generator=gen)
    ids = ids.repeat(args.routings, 1)  # [M*B, T], routing-major
    advantages = torch.randn(args.batch, generator=gen).repeat(args.routings)
    single_rank = args.k * args.rank

    peft_model = get_peft_model(
        copy.deepcopy(base),
        LoraConfig(
            r=single_rank, lora_alpha=single_rank, target_modules=list(MLP_PROJECTIONS), lora_dropout=0.0
        ),
    )
    plain_model = copy.deepcopy(base)
    for layer in plain_model.model.layers:
        for name in MLP_PROJECTIONS:
            setattr(layer.mlp, name, PlainLora(getattr(layer.mlp, name), single_rank))
    steps: dict[str, Step] = {}
    counts: dict[str, int] = {}
    steps["remix"], counts["remix"] = make_remix_step(copy.deepcopy(base), args, ids, advantages, args.prompt)
    steps["peft"], counts["peft"] = make_single_lora_step(peft_model, ids, advantages, args.prompt)
    steps["plain"], counts["plain"] = make_single_lora_step(plain_model, ids, advantages, args.prompt)

    print(
        f"tiny Llama hidden 128 x 2 layers, batch {args.batch} x {args.routings} routings x {args.tokens} tokens, "
        f"threads {args.threads}, torch {torch.__version__}"
    )
    print(f"remix n={args.n} k={args.k} r={args.rank}  vs  single LoRA r={single_rank}")
    times = time_steps(steps, args.reps, args.warmup)
    medians = {name: statistics.median(values) for name, values in times.items()}
    for name, values in times.items():
        quartiles = statistics.quantiles(values, n=4)
        print(
            f"{name:6s} median {medians[name] * 1e3:7.2f} ms  (p25 {quartiles[0] * 1e3:6.2f}, "
            f"p75 {quartiles[2] * 1e3:6.2f})  trainable params {counts[name]:,}"
        )
    print(f"ratio remix / peft  = {medians['remix'] / medians['peft']:.3f}  (goal <= 1.25)")
    print(f"ratio remix / plain = {medians['remix'] / medians['plain']:.3f}")
    if args.profile:
        profile(steps["remix"])


if __name__ == "__main__":
    main()
