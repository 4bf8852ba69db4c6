"""The records nodes exchange: rollouts, groups of one task's rollouts, signed batches, DHT manifests.

Every record is a frozen dataclass that checks its own invariants on construction (raising
``MalformedError``, also a ``ValueError``) and normalises what has one canonical form: sequences become
tuples, ints in float fields become floats, behaviour log-probs are rounded to float32 (the precision
they travel at), so a record always equals its decoded copy. Size bounds are not checked here: they are
the receiver's policy (``Limits``), enforced by the codec.
"""

from __future__ import annotations

import math
import re
import struct
from dataclasses import dataclass
from typing import Any

from protocol.errors import MalformedError
from protocol.identity import PUBLIC_KEY_BYTES
from protocol.taskref import TaskRef

__all__ = [
    "FINISH_REASONS",
    "Manifest",
    "Rollout",
    "RolloutBatch",
    "RolloutGroup",
    "SamplingParams",
]

FINISH_REASONS: tuple[str, ...] = ("eos", "length")
MAX_TOKEN_ID = 2**32 - 1  # ids travel as uint32
MAX_ROUTING_INDEX = 2**16 - 1  # ReMix LoRA indices travel as uint16
MAX_COUNTER = 2**63 - 1  # epochs, sequence numbers, steps, sizes
_BATCH_ID_RE = re.compile(r"[0-9a-f]{64}")


def _set(obj: object, name: str, value: Any) -> None:
    object.__setattr__(obj, name, value)


def _check_counter(name: str, value: object) -> None:
    if type(value) is not int or not 0 <= value <= MAX_COUNTER:
        raise MalformedError(f"{name} must be an int in [0, 2**63), got {value!r:.80}")


def _float_field(obj: object, name: str, *, allow_none: bool = False) -> None:
    """Check that ``obj.name`` is a finite number (or None if allowed) and store it as a float."""
    value = getattr(obj, name)
    if value is None and allow_none:
        return
    if type(value) is not float:
        if type(value) is not int:
            raise MalformedError(f"{name} must be a float, got {value!r:.80}")
        try:
            value = float(value)
        except OverflowError as exc:
            raise MalformedError(f"{name} is out of float range") from exc
        _set(obj, name, value)
    if not math.isfinite(value):
        raise MalformedError(f"{name} must be finite, got {value!r}")


def _check_name(name: str, value: object, *, allow_empty: bool = False) -> None:
    if type(value) is not str or (not value and not allow_empty):
        kind = "a str" if allow_empty else "a non-empty str"
        raise MalformedError(f"{name} must be {kind}, got {value!r:.80}")


def _int_tuple(obj: object, name: str, upper: int) -> None:
    """Store ``obj.name`` as a tuple of ints, each in ``[0, upper]``."""
    value = getattr(obj, name)
    if type(value) is not tuple:
        if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
            raise MalformedError(f"{name} must be a sequence of ints, got {value!r:.80}")
        value = tuple(value)
        _set(obj, name, value)
    if value and not (set(map(type, value)) == {int} and min(value) >= 0 and max(value) <= upper):
        bad = next(v for v in value if type(v) is not int or not 0 <= v <= upper)
        raise MalformedError(f"{name} must hold ints in [0, {upper}], got {bad!r:.80}")


def _check_task(name: str, task: object) -> None:
    if type(task) is not TaskRef:
        raise MalformedError(f"{name} must be a TaskRef, got {type(task).__name__}")
    for part in (task.source, task.dataset, task.config_hash):
        _check_name(f"{name} field", part)
    numbers: tuple[object, ...] = (task.seed, task.index)
    for number in numbers:
        if type(number) is not int or not -(2**63) <= number <= MAX_COUNTER:
            raise MalformedError(f"{name} seed and index must be int64, got {number!r:.80}")


def _check_addresses(address: object) -> tuple[str, ...]:
    if type(address) is not tuple:
        if isinstance(address, (str, bytes)) or not hasattr(address, "__iter__"):
            raise MalformedError(f"address must be a sequence of str, got {address!r:.80}")
        address = tuple(address)
    for item in address:
        _check_name("address entry", item)
    return address


def _check_author(author: object) -> None:
    if type(author) is not bytes or len(author) != PUBLIC_KEY_BYTES:
        raise MalformedError(f"author must be {PUBLIC_KEY_BYTES} raw public-key bytes, got {author!r:.80}")


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """The sampling settings the behaviour log-probs were computed under.

    ``temperature >= 0`` (0 means greedy), ``0 < top_p <= 1``.
    """

    temperature: float
    top_p: float

    def __post_init__(self) -> None:
        _float_field(self, "temperature")
        _float_field(self, "top_p")
        if self.temperature < 0:
            raise MalformedError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise MalformedError(f"top_p must be in (0, 1], got {self.top_p}")


def _float32_logprobs(values: object, n_tokens: int) -> tuple[float, ...]:
    """Round behaviour log-probs to float32; ``[T]`` in, ``[T]`` out. Each must be finite and <= 0."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise MalformedError(f"behavior_logprobs must be a sequence of floats, got {values!r:.80}")
    seq: Any = values
    if len(seq) != n_tokens:
        raise MalformedError(
            f"behavior_logprobs has {len(seq)} entries but completion_ids has {n_tokens}; "
            "there is one log-prob per completion token"
        )
    fmt = f"<{n_tokens}f"
    try:
        rounded: tuple[float, ...] = struct.unpack(fmt, struct.pack(fmt, *seq))
    except (struct.error, OverflowError, TypeError) as exc:
        raise MalformedError(f"behavior_logprobs must be float32-range numbers: {exc}") from exc
    # sum() is nan or inf iff some entry is (fsum would raise on inf + -inf).
    if rounded and not (math.isfinite(sum(rounded)) and max(rounded) <= 0.0):
        raise MalformedError("behavior_logprobs must be finite and <= 0")
    return rounded


@dataclass(frozen=True, slots=True)
class Rollout:
    """One completion of one task, with what a receiver needs to score it and correct off-policy.

    ``completion_ids`` is ``[T]`` token ids (uint32), ``behavior_logprobs`` is ``[T]`` float32 log-probs
    of those tokens under the sampling policy (``sampling``), ``routing`` the ReMix LoRA indices that
    produced it, flattened per layer (empty for plain LoRA). ``reward`` travels for display only; a
    receiver re-scores with its own verifier.
    """

    task: TaskRef
    prompt: str
    completion: str
    completion_ids: tuple[int, ...]
    tokenizer_fingerprint: str
    behavior_logprobs: tuple[float, ...]
    sampling: SamplingParams
    model_fingerprint: str
    policy_step: int
    finish_reason: str
    reward: float | None = None
    routing: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        _check_task("task", self.task)
        _check_name("prompt", self.prompt, allow_empty=True)
        _check_name("completion", self.completion, allow_empty=True)
        _int_tuple(self, "completion_ids", MAX_TOKEN_ID)
        _set(self, "behavior_logprobs", _float32_logprobs(self.behavior_logprobs, len(self.completion_ids)))
        _check_name("tokenizer_fingerprint", self.tokenizer_fingerprint)
        _check_name("model_fingerprint", self.model_fingerprint)
        if type(self.sampling) is not SamplingParams:
            raise MalformedError(f"sampling must be SamplingParams, got {type(self.sampling).__name__}")
        _check_counter("policy_step", self.policy_step)
        if self.finish_reason not in FINISH_REASONS:
            raise MalformedError(
                f"finish_reason must be one of {FINISH_REASONS}, got {self.finish_reason!r:.80}"
            )
        _float_field(self, "reward", allow_none=True)
        _int_tuple(self, "routing", MAX_ROUTING_INDEX)


@dataclass(frozen=True, slots=True)
class RolloutGroup:
    """One task's completions (at least one); every rollout's ``task`` equals the group's."""

    task: TaskRef
    rollouts: tuple[Rollout, ...]

    def __post_init__(self) -> None:
        _check_task("group task", self.task)
        rollouts: Any = self.rollouts
        if type(rollouts) is not tuple:
            rollouts = tuple(rollouts)
            _set(self, "rollouts", rollouts)
        if not rollouts:
            raise MalformedError("a RolloutGroup holds at least one rollout")
        for rollout in rollouts:
            if type(rollout) is not Rollout:
                raise MalformedError(f"rollouts must be Rollout records, got {type(rollout).__name__}")
            if rollout.task != self.task:
                raise MalformedError(
                    f"rollout task {rollout.task.key()} differs from group task {self.task.key()}"
                )


@dataclass(frozen=True, slots=True)
class RolloutBatch:
    """What one node publishes for one step: groups of rollouts, signed by ``author``.

    ``author`` is the raw 32-byte Ed25519 public key; ``address`` the author's transport addresses
    (multiaddrs), filled in by the swarm layer; ``epoch`` and ``seq`` order the author's batches.
    """

    swarm_id: str
    author: bytes
    address: tuple[str, ...]
    epoch: int
    seq: int
    created_at: float
    groups: tuple[RolloutGroup, ...]

    def __post_init__(self) -> None:
        _check_name("swarm_id", self.swarm_id)
        _check_author(self.author)
        _set(self, "address", _check_addresses(self.address))
        _check_counter("epoch", self.epoch)
        _check_counter("seq", self.seq)
        _float_field(self, "created_at")
        groups: Any = self.groups
        if type(groups) is not tuple:
            groups = tuple(groups)
            _set(self, "groups", groups)
        for group in groups:
            if type(group) is not RolloutGroup:
                raise MalformedError(f"groups must be RolloutGroup records, got {type(group).__name__}")

    @property
    def n_rollouts(self) -> int:
        """Total rollouts over all groups."""
        return sum(len(group.rollouts) for group in self.groups)


@dataclass(frozen=True, slots=True)
class Manifest:
    """The small signed pointer a node puts in the DHT for one batch (at most 8 KB encoded).

    ``batch_id`` is the batch's content address (64 lowercase hex chars, see ``codec.batch_id``),
    ``byte_size`` the signed batch's size, ``expires_at >= created_at`` (seconds, DHT time).
    """

    swarm_id: str
    batch_id: str
    author: bytes
    address: tuple[str, ...]
    epoch: int
    seq: int
    byte_size: int
    n_groups: int
    n_rollouts: int
    created_at: float
    expires_at: float

    def __post_init__(self) -> None:
        _check_name("swarm_id", self.swarm_id)
        if type(self.batch_id) is not str or not _BATCH_ID_RE.fullmatch(self.batch_id):
            raise MalformedError(f"batch_id must be 64 lowercase hex chars, got {self.batch_id!r:.80}")
        _check_author(self.author)
        _set(self, "address", _check_addresses(self.address))
        for name in ("epoch", "seq", "byte_size", "n_groups", "n_rollouts"):
            _check_counter(name, getattr(self, name))
        _float_field(self, "created_at")
        _float_field(self, "expires_at")
        if self.expires_at < self.created_at:
            raise MalformedError(f"expires_at {self.expires_at} is before created_at {self.created_at}")
