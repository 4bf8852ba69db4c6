"""The batches a swarm probe publishes: signed-shaped rollout batches of random text, numbered through their task
refs (task index = n * ``TAG_STRIDE`` + group), so a receiver knows which batch arrived without a model."""

from __future__ import annotations

import random
import string
import time

from protocol.identity import Identity
from protocol.records import Rollout, RolloutBatch, RolloutGroup, SamplingParams
from protocol.taskref import TaskRef

TAG_STRIDE = 1000


def probe_batch(identity: Identity, swarm_id: str, n: int, *, n_groups: int = 2, text_chars: int = 64) -> RolloutBatch:
    rng = random.Random(f"{identity.peer_id}/{n}")
    groups = []
    for g in range(n_groups):
        task = TaskRef(source="arith", dataset="add", config_hash="probe", seed=0, index=n * TAG_STRIDE + g)
        rollouts = tuple(
            Rollout(
                task=task,
                prompt=f"probe {n}/{g}",
                completion="".join(rng.choices(string.ascii_letters, k=text_chars)),
                completion_ids=(1, 2, 3),
                tokenizer_fingerprint="probe",
                behavior_logprobs=(-0.5, -0.25, -1.0),
                sampling=SamplingParams(temperature=1.0, top_p=1.0),
                model_fingerprint="probe",
                policy_step=n,
                finish_reason="eos",
            )
            for _ in range(4)
        )
        groups.append(RolloutGroup(task=task, rollouts=rollouts))
    return RolloutBatch(swarm_id, identity.public_key, (), 0, 0, time.time(), tuple(groups))
