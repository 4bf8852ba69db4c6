"""``StatusBoard``: what the training thread tells the status API, as immutable snapshots.

The training thread builds a new ``StepSnapshot`` after each step and swaps it in (one reference
assignment); API handlers in another thread only ever read the reference they got. Nothing here touches
torch, the model or the network, and nothing blocks.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

NodeState = Literal["starting", "ready", "training", "stopping", "stopped", "finished"]


@dataclass(frozen=True)
class NodeInfo:
    """What does not change while a node runs. No key material, no paths beyond the run dir's name."""

    version: str
    mode: Literal["silo", "swarm"]
    peer_id: str | None
    swarm_id: str | None
    model: str
    adapter: str
    run_dir: str
    device: str
    """Where the policy runs and in what dtype: ``cpu · float32``, ``cuda:0 (NVIDIA H100 80GB HBM3) · bfloat16``."""
    total_steps: int | None
    """None: the node trains until stopped."""
    started_at: float


@dataclass(frozen=True)
class PeerIngest:
    """What this node made of one peer's groups after re-scoring them itself."""

    groups_accepted: int
    groups_rejected: Mapping[str, int]
    groups_trained: int = 0  # of those accepted, how many a step trained on
    # the peer-text screen's running figures of its completions (AuthorVerdicts.summary): judged, failed,
    # dropped, sequence_failed, policy_failed, tokens, tokens_masked, mean_weight, pauses, paused_until,
    # probation, trial; and whether the screen has it paused now
    screen: Mapping[str, float] = field(default_factory=dict)
    screen_paused: bool = False


@dataclass(frozen=True)
class StepSnapshot:
    """The node after one step: the metrics row it wrote and the exchange's own counts."""

    step: int
    record: Mapping[str, Any]
    last_eval: tuple[int, float] | None
    published_batches: int = 0
    published_groups: int = 0
    peer_ingest: Mapping[str, PeerIngest] = field(default_factory=dict)
    recent_steps: int = 0
    """How many recent steps the two medians below are over."""
    step_seconds_median: float | None = None
    tokens_per_s_median: float | None = None
    at: float = field(default_factory=time.time)


def freeze_record(record: dict[str, Any]) -> Mapping[str, Any]:
    """A read-only view of a metrics row whose dict values (counts by reason) are copied and frozen too."""
    return MappingProxyType({k: MappingProxyType(dict(v)) if isinstance(v, dict) else v for k, v in record.items()})


class StatusBoard:
    """The latest snapshot, the node's state and its last sign of progress (for ``/healthz``)."""

    def __init__(self) -> None:
        self.info: NodeInfo | None = None
        self.state: NodeState = "starting"
        self.snapshot: StepSnapshot | None = None
        self._progress = time.monotonic()

    def set_info(self, info: NodeInfo) -> None:
        self.info = info
        self.beat()

    def set_state(self, state: NodeState) -> None:
        self.state = state
        self.beat()

    def publish(self, snapshot: StepSnapshot) -> None:
        """Called by the training thread after each step."""
        self.snapshot = snapshot
        self.beat()

    def beat(self) -> None:
        """The loop made progress (a step, the end of set-up, a state change)."""
        self._progress = time.monotonic()

    def seconds_since_progress(self) -> float:
        return time.monotonic() - self._progress
