"""Small, valid rollout batches for swarm tests (built with protocol's records)."""

from __future__ import annotations

import time

from protocol.identity import Identity
from protocol.records import Rollout, RolloutBatch, RolloutGroup, SamplingParams
from protocol.taskref import TaskRef


def make_batch(
    identity: Identity, *, n_groups: int = 2, group_size: int = 2, text: str = "42", index: int = 0
) -> RolloutBatch:
    """A batch of ``n_groups`` arithmetic tasks with ``group_size`` completions each."""
    groups = []
    for g in range(n_groups):
        task = TaskRef(source="arith", dataset="add", config_hash="c0ffee", seed=7, index=index * 1000 + g)
        rollouts = tuple(
            Rollout(
                task=task,
                prompt=f"What is {g} + {k}?",
                completion=text,
                completion_ids=(1, 2, 3),
                tokenizer_fingerprint="tok-test",
                behavior_logprobs=(-0.5, -0.25, -1.0),
                sampling=SamplingParams(temperature=1.0, top_p=1.0),
                model_fingerprint="model-test",
                policy_step=3,
                finish_reason="eos",
                reward=1.0,
            )
            for k in range(group_size)
        )
        groups.append(RolloutGroup(task=task, rollouts=rollouts))
    return RolloutBatch(
        swarm_id="test-swarm",
        author=identity.public_key,
        address=(),
        epoch=0,
        seq=0,
        created_at=time.time(),
        groups=tuple(groups),
    )

