"""Hypothesis strategies and small builders for protocol records, shared by the protocol tests."""

from __future__ import annotations

from hypothesis import strategies as st

from protocol import Rollout, RolloutBatch, RolloutGroup, SamplingParams, TaskRef

# RFC 8032, section 7.1, TEST 1.
RFC8032_SECRET = bytes.fromhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
RFC8032_PUBLIC = bytes.fromhex("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a")
RFC8032_SIG_EMPTY = bytes.fromhex(
    "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555f"
    "b8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b"
)

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
COUNTER = st.integers(min_value=0, max_value=2**63 - 1)
NAMES = st.text(min_size=1, max_size=24)
TEXT = st.text(max_size=200)
FINITE = st.floats(allow_nan=False, allow_infinity=False)


def task_refs() -> st.SearchStrategy[TaskRef]:
    return st.builds(TaskRef, source=NAMES, dataset=NAMES, config_hash=NAMES, seed=INT64, index=INT64)


@st.composite
def rollouts(draw: st.DrawFn, task: TaskRef) -> Rollout:
    n = draw(st.integers(min_value=0, max_value=24))
    return Rollout(
        task=task,
        prompt=draw(TEXT),
        completion=draw(TEXT),
        completion_ids=tuple(draw(st.lists(st.integers(0, 2**32 - 1), min_size=n, max_size=n))),
        tokenizer_fingerprint=draw(NAMES),
        behavior_logprobs=tuple(
            draw(st.lists(st.floats(min_value=-50.0, max_value=0.0, width=32), min_size=n, max_size=n))
        ),
        sampling=SamplingParams(
            temperature=draw(st.floats(min_value=0.0, max_value=4.0)),
            top_p=draw(st.floats(min_value=0.0, max_value=1.0, exclude_min=True)),
        ),
        model_fingerprint=draw(NAMES),
        policy_step=draw(COUNTER),
        finish_reason=draw(st.sampled_from(["eos", "length"])),
        reward=draw(st.none() | FINITE),
        routing=tuple(draw(st.lists(st.integers(0, 2**16 - 1), max_size=12))),
    )


@st.composite
def groups(draw: st.DrawFn) -> RolloutGroup:
    task = draw(task_refs())
    return RolloutGroup(task, tuple(draw(st.lists(rollouts(task), min_size=1, max_size=4))))


@st.composite
def batches(draw: st.DrawFn, author: bytes) -> RolloutBatch:
    return RolloutBatch(
        swarm_id=draw(NAMES),
        author=author,
        address=tuple(draw(st.lists(st.text(min_size=1, max_size=60), max_size=3))),
        epoch=draw(COUNTER),
        seq=draw(COUNTER),
        created_at=draw(FINITE),
        groups=tuple(draw(st.lists(groups(), max_size=3))),
    )
