"""Benchmark the protocol codec on one core: encode+sign and decode+verify throughput, and size vs JSON.

Usage: python scripts/bench_protocol.py [--groups 8] [--completions 8] [--tokens 40] [--seconds 2]

Rollouts are shaped like real traffic: an arithmetic prompt, a ~40-token completion, uint32-range
token ids and float log-probs. Goals (issue 3): >= 2,000 rollouts/s decode+verify on one core, and
encoded bytes at most half of plain JSON of the same records.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import random
import time
from collections.abc import Callable
from typing import Any

from protocol import (
    Identity,
    Rollout,
    RolloutBatch,
    RolloutGroup,
    SamplingParams,
    TaskRef,
    decode_batch,
    encode_batch,
)

WORDS = (
    "so",
    "the",
    "sum",
    "of",
    "and",
    "then",
    "we",
    "carry",
    "one",
    "to",
    "get",
    "total",
    "answer",
    "is",
    "step",
)


def make_batch(author: bytes, n_groups: int, n_completions: int, n_tokens: int, seed: int) -> RolloutBatch:
    rng = random.Random(seed)
    groups = []
    for g in range(n_groups):
        task = TaskRef("arith", "add_sub", "c0ffee12", seed, g)
        a, b = rng.randrange(10**6), rng.randrange(10**6)
        prompt = f"Solve the problem and give the final answer in <answer></answer> tags.\nWhat is {a} + {b}?"
        rollouts = []
        for _ in range(n_completions):
            text = " ".join(rng.choice(WORDS) for _ in range(n_tokens - 4))
            rollouts.append(
                Rollout(
                    task=task,
                    prompt=prompt,
                    completion=f"{text} <answer>{a + b + rng.choice([0, 0, 1, -10])}</answer>",
                    completion_ids=tuple(rng.randrange(151_000) for _ in range(n_tokens)),
                    tokenizer_fingerprint="sha256:3f9a1c0d5e7b2a4c",
                    behavior_logprobs=tuple(-rng.expovariate(2.0) for _ in range(n_tokens)),
                    sampling=SamplingParams(temperature=1.0, top_p=0.95),
                    model_fingerprint="Qwen2.5-0.5B-Instruct+lora:8f2e",
                    policy_step=1234,
                    finish_reason="eos",
                    reward=float(rng.random() < 0.5),
                )
            )
        groups.append(RolloutGroup(task, tuple(rollouts)))
    return RolloutBatch(
        swarm_id="swarm-bench",
        author=author,
        address=("/ip4/10.0.0.7/tcp/31337/p2p/QmPeer",),
        epoch=4242,
        seq=17,
        created_at=1_700_000_000.25,
        groups=tuple(groups),
    )


def to_json(batch: RolloutBatch) -> bytes:
    """Plain JSON of the same records: every field, compact separators, bytes as hex."""

    def default(obj: Any) -> Any:
        if isinstance(obj, bytes):
            return obj.hex()
        raise TypeError(type(obj).__name__)

    return json.dumps(dataclasses.asdict(batch), separators=(",", ":"), default=default).encode()


def rate(fn: Callable[[], object], seconds: float) -> float:
    """Calls per second of ``fn`` over about ``seconds`` (after one warm-up call)."""
    fn()
    calls, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        fn()
        calls += 1
    return calls / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--completions", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=40)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()

    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core
    identity = Identity.generate()
    batch = make_batch(identity.public_key, args.groups, args.completions, args.tokens, seed=0)
    n = batch.n_rollouts
    data = encode_batch(batch, identity)
    if decode_batch(data) != batch:
        raise SystemExit("round trip failed")
    plain = to_json(batch)

    enc = rate(lambda: encode_batch(batch, identity), args.seconds)
    dec = rate(lambda: decode_batch(data), args.seconds)

    print(f"python {platform.python_version()} on {platform.machine()}, pinned to one core")
    print(
        f"batch: {args.groups} groups x {args.completions} completions x {args.tokens} tokens = {n} rollouts"
    )
    print(f"encode+sign   : {enc:9.1f} batches/s  {enc * n:10.0f} rollouts/s")
    print(f"decode+verify : {dec:9.1f} batches/s  {dec * n:10.0f} rollouts/s   (goal >= 2000 rollouts/s)")
    print(f"encoded size  : {len(data):8d} bytes  {len(data) / n:8.1f} bytes/rollout")
    print(f"plain JSON    : {len(plain):8d} bytes  {len(plain) / n:8.1f} bytes/rollout")
    print(f"size ratio    : {len(data) / len(plain):.3f} of JSON   (goal <= 0.5)")


if __name__ == "__main__":
    main()
