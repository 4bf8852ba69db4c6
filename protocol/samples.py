"""Sample records shaped like real traffic, for benchmarks and tests (deterministic by seed)."""

from __future__ import annotations

import random
import time

from protocol._wire import KIND_BATCH, compress, seal
from protocol.codec import _pack
from protocol.identity import Identity
from protocol.records import Rollout, RolloutBatch, RolloutGroup, SamplingParams
from protocol.taskref import TaskRef

WORDS = [
    "the",
    "of",
    "and",
    "to",
    "a",
    "in",
    "is",
    "it",
    "that",
    "we",
    "so",
    "answer",
    "sum",
    "step",
    "add",
    "then",
    "total",
    "carry",
    "result",
]


def realistic_batch(
    author: bytes, n_groups: int = 8, n_completions: int = 8, n_tokens: int = 40, seed: int = 0
) -> RolloutBatch:
    """A batch shaped like real traffic: arithmetic prompts, ~n_tokens-token completions, float log-probs."""
    rng = random.Random(seed)
    out = []
    for g in range(n_groups):
        task = TaskRef("arith", "add_sub", "c0ffee12", seed, g)
        a, b = rng.randrange(10**6), rng.randrange(10**6)
        prompt = f"Solve the problem and give the final answer in <answer></answer> tags.\nWhat is {a} + {b}?"
        rollouts_ = []
        for _ in range(n_completions):
            words = [rng.choice(WORDS) for _ in range(n_tokens - 4)]
            completion = " ".join(words) + f" <answer>{a + b + rng.choice([0, 0, 1, -10])}</answer>"
            rollouts_.append(
                Rollout(
                    task=task,
                    prompt=prompt,
                    completion=completion,
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
        out.append(RolloutGroup(task, tuple(rollouts_)))
    return RolloutBatch(
        swarm_id="swarm-test",
        author=author,
        address=("/ip4/10.0.0.7/tcp/31337/p2p/QmPeer",),
        epoch=4242,
        seq=17,
        created_at=1_700_000_000.25,
        groups=tuple(out),
    )


def expanding_batch(identity: Identity, payload_bytes: int, *, swarm_id: str = "test-swarm", epoch: int = 0,
                    seq: int = 0) -> bytes:
    """Signed bytes of a valid batch whose payload expands to about ``payload_bytes`` yet compresses to a
    few KB (groups of 64 completions of 4096 zero tokens): the memory-amplification attack.

    Built from the wire layout directly, without records, so building it costs little memory.
    """
    zeros = bytes(4 * 4096)  # 4096 uint32 token ids, or float32 log-probs, of 0
    rollout = ["p", "", zeros, "tok-test", zeros, 1.0, 1.0, "model-test", 0, "length", None, b""]
    n_groups = max(1, payload_bytes // (64 * 2 * len(zeros)))
    groups = [["arith", "add", "c0ffee", 7, g, [rollout] * 64] for g in range(n_groups)]
    raw = _pack([swarm_id, [], epoch, seq, time.time(), groups])
    return seal(KIND_BATCH, identity, compress(raw))
