from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from protocol import MalformedError, Manifest, Rollout, RolloutBatch, RolloutGroup, SamplingParams, TaskRef

TASK = TaskRef("arith", "add", "c0ffee12", 1, 2)
OTHER_TASK = TaskRef("arith", "add", "c0ffee12", 1, 3)


def make_rollout(**overrides: Any) -> Rollout:
    fields: dict[str, Any] = dict(
        task=TASK,
        prompt="What is 2+3?",
        completion="5",
        completion_ids=(20, 151_643),
        tokenizer_fingerprint="tok",
        behavior_logprobs=(-0.5, -0.25),
        sampling=SamplingParams(1.0, 0.95),
        model_fingerprint="model",
        policy_step=7,
        finish_reason="eos",
    )
    fields.update(overrides)
    return Rollout(**fields)


def test_logprobs_are_rounded_to_float32() -> None:
    r = make_rollout(completion_ids=(1, 2, 3), behavior_logprobs=[-0.1, -1.0, 0.0])
    # float32(-0.1) = -13421773 * 2**-27 exactly.
    assert r.behavior_logprobs == (-13421773 / 2**27, -1.0, 0.0)
    assert r.behavior_logprobs[0] == -0.10000000149011612
    assert isinstance(r.completion_ids, tuple)
    assert isinstance(r.behavior_logprobs, tuple)


def test_sequences_and_ints_are_normalised() -> None:
    r = make_rollout(completion_ids=[1, 2], routing=[3, 4], reward=1)
    assert r.completion_ids == (1, 2) and r.routing == (3, 4)
    assert r.reward == 1.0 and type(r.reward) is float
    assert SamplingParams(1, 1).temperature == 1.0 and type(SamplingParams(1, 1).top_p) is float


@pytest.mark.parametrize(
    "overrides",
    [
        dict(behavior_logprobs=(-0.5,)),  # one log-prob per token
        dict(behavior_logprobs=(-0.5, 0.5)),  # > 0
        dict(behavior_logprobs=(-0.5, math.nan)),
        dict(behavior_logprobs=(-math.inf, -0.5)),
        dict(behavior_logprobs=(-1e300, -0.5)),  # beyond float32
        dict(behavior_logprobs="ab"),
        dict(completion_ids=(1, 2**32)),
        dict(completion_ids=(-1, 2)),
        dict(completion_ids=(True, 2)),
        dict(completion_ids=(1.0, 2)),
        dict(routing=(65536,)),
        dict(finish_reason="stop"),
        dict(policy_step=-1),
        dict(policy_step=True),
        dict(policy_step=2**63),
        dict(reward=math.inf),
        dict(reward=10**400),
        dict(reward="1"),
        dict(tokenizer_fingerprint=""),
        dict(model_fingerprint=None),
        dict(prompt=b"bytes"),
        dict(task=("arith", "add", "h", 1, 2)),
        dict(task=TaskRef("arith", "add", "h", 1, 2**63)),
        dict(task=TaskRef("", "add", "h", 1, 2)),
        dict(sampling=(1.0, 0.9)),
    ],
)
def test_rollout_invariants(overrides: dict[str, Any]) -> None:
    with pytest.raises(MalformedError):
        make_rollout(**overrides)
    with pytest.raises(ValueError):  # MalformedError is also a ValueError
        make_rollout(**overrides)


@pytest.mark.parametrize(
    "temperature,top_p", [(-0.1, 0.9), (1.0, 0.0), (1.0, 1.0001), (math.nan, 0.9), (1.0, "x")]
)
def test_sampling_invariants(temperature: Any, top_p: Any) -> None:
    with pytest.raises(MalformedError):
        SamplingParams(temperature, top_p)


def test_greedy_and_full_top_p_are_valid() -> None:
    assert SamplingParams(0.0, 1.0) == SamplingParams(0, 1)


def test_group_invariants() -> None:
    group = RolloutGroup(TASK, [make_rollout(), make_rollout()])  # type: ignore[arg-type]  # lists are normalised
    assert isinstance(group.rollouts, tuple) and len(group.rollouts) == 2
    with pytest.raises(MalformedError, match="differs from group task"):
        RolloutGroup(TASK, (make_rollout(), make_rollout(task=OTHER_TASK)))
    with pytest.raises(MalformedError, match="at least one"):
        RolloutGroup(TASK, ())
    with pytest.raises(MalformedError):
        RolloutGroup(TASK, ("not a rollout",))  # type: ignore[arg-type]


def test_batch_invariants_and_count() -> None:
    group = RolloutGroup(TASK, (make_rollout(), make_rollout()))
    batch = RolloutBatch("s", b"\x01" * 32, ["/ip4/1.2.3.4"], 1, 2, 3, [group, group])  # type: ignore[arg-type]
    assert batch.n_rollouts == 4
    assert batch.address == ("/ip4/1.2.3.4",) and batch.created_at == 3.0
    for bad in (
        dict(author=b"\x01" * 31),
        dict(author="x" * 32),
        dict(swarm_id=""),
        dict(epoch=-1),
        dict(address="/ip4/1.2.3.4"),
        dict(address=("",)),
        dict(created_at=math.nan),
        dict(groups=(make_rollout(),)),
    ):
        with pytest.raises(MalformedError):
            dataclasses.replace(batch, **bad)


def test_manifest_invariants() -> None:
    m = Manifest("s", "ab" * 32, b"\x02" * 32, (), 1, 2, 1000, 8, 64, 10.0, 70.0)
    assert m.expires_at == 70.0
    for bad in (
        dict(batch_id="AB" * 32),
        dict(batch_id="ab" * 31),
        dict(expires_at=9.0),
        dict(byte_size=-1),
        dict(n_rollouts=1.5),
        dict(author=b"\x02" * 33),
    ):
        with pytest.raises(MalformedError):
            dataclasses.replace(m, **bad)


def test_records_are_frozen() -> None:
    r = make_rollout()
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.prompt = "changed"  # type: ignore[misc]
