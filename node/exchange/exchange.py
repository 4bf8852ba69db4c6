"""The node's side of the swarm: publish our groups as signed batches, ingest what peers published.

``SwarmExchange`` works over any ``BatchTransport``: the hivemind ``swarm.transport.SwarmTransport`` in a
daemon, or ``InMemoryHub`` transports (the same signed bytes and checks, carried in memory) for
experiments that isolate learning from the network. It never
blocks the training loop: publishing queues, collecting returns what has arrived, and a dead transport is
restarted with backoff while the node keeps training on its own groups. Ingestion is bounded per step
(``node.exchange.ingest``); offences found in a peer's rollouts are reported to the transport, whose peer book
bans the author. Failures of the transport's calls are counted (``exchange_errors``), never raised.

A node that steps faster than its peers accept batches from one author (``min_publish_interval``: the
per-author quota of each epoch) does not publish a batch every step: its groups accumulate (at most
``max_pending_groups``, the oldest dropped and counted) and go out together in the next batch allowed.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, OrderedDict
from typing import Any, Protocol

from node.exchange.ingest import IngestLimits, Ingestor
from node.exchange.outbound import to_rollout_groups
from node.exchange.plausibility import ScreenSettings
from node.exchange.scoring import ScoringWorker
from node.failpoints import crash_point
from node.generation.rollouts import SampledGroup
from node.policy.model import Policy
from node.tasks import TaskSource
from node.train.groups import TrainGroup
from node.train.screen import PeerScreen
from protocol.identity import Identity
from protocol.records import RolloutBatch, RolloutGroup
from swarm.peer_book import PeerRow
from swarm.state import NetworkStatus

logger = logging.getLogger(__name__)


class BatchTransport(Protocol):
    def publish(self, batch: RolloutBatch) -> str | None: ...

    def collect(self) -> list[RolloutBatch]: ...

    def current_epoch(self) -> int: ...

    def min_publish_interval(self) -> float: ...

    def stats(self) -> dict[str, Any]: ...

    def network_status(self) -> NetworkStatus: ...

    def peer_stats(self) -> list[PeerRow]: ...

    def is_alive(self) -> bool: ...

    def restart(self) -> None: ...

    def close(self) -> None: ...


_MAX_PEERS_REMEMBERED = 4096


class SwarmExchange:
    """Implements the node loop's ``Exchange`` over a ``BatchTransport``."""

    def __init__(self, policy: Policy, source: TaskSource, transport: BatchTransport, identity: Identity, *,
                 swarm_id: str, temperature: float, top_p: float, max_completion_tokens: int,
                 max_peer_tokens: int | None = None, ingest_limits: IngestLimits | None = None,
                 scorer: ScoringWorker | None = None, restart_backoff: float = 5.0,
                 max_restart_backoff: float = 300.0, max_pending_groups: int = 256,
                 anchor_flat_groups: bool = True, screen: ScreenSettings | None = None) -> None:
        self.policy = policy
        self.transport = transport
        self.identity = identity
        self.swarm_id = swarm_id
        self.temperature = temperature
        self.top_p = top_p
        penalize = getattr(transport, "penalize", None)
        self.ingestor = Ingestor(policy, source, temperature=temperature, max_completion_tokens=max_completion_tokens,
                                 max_peer_tokens=max_peer_tokens, limits=ingest_limits, scorer=scorer,
                                 penalize=penalize, anchor_flat_groups=anchor_flat_groups, screen=screen)
        self.seq = 0
        self.groups_shared = 0
        self.restart_backoff = restart_backoff
        self.max_restart_backoff = max_restart_backoff
        self._next_restart = 0.0
        self._failures = 0
        self.errors: Counter[str] = Counter()
        self.peers_seen: OrderedDict[str, None] = OrderedDict()  # bounded: most recent authors
        self.max_pending_groups = max_pending_groups
        self._pending: list[RolloutGroup] = []
        self._last_publish = float("-inf")
        self.groups_dropped = 0
        self._connected: bool | None = None  # as last reported (None: not yet)

    def current_epoch(self) -> int:
        return self.transport.current_epoch()

    def _ensure_alive(self) -> bool:
        if self.transport.is_alive():
            self._failures = 0
            self._next_restart = 0.0
            return True
        now = time.monotonic()
        if now < self._next_restart:
            return False
        self._failures += 1
        delay = min(self.restart_backoff * 2 ** (self._failures - 1), self.max_restart_backoff)
        self._next_restart = now + delay
        logger.warning("network side is down; restarting it (next try in %.0fs if this fails)", delay)
        try:
            self.transport.restart()
        except Exception as exc:  # the loop must keep training whatever the network does
            self.errors["restart"] += 1
            logger.warning("network restart failed: %s", exc)
            return False
        return self.transport.is_alive()

    def share(self, step: int, groups: list[SampledGroup]) -> None:
        if not groups or not self._ensure_alive():
            return
        self._pending += to_rollout_groups(self.policy, groups, policy_step=step, temperature=self.temperature,
                                           top_p=self.top_p)
        if len(self._pending) > self.max_pending_groups:
            self.groups_dropped += len(self._pending) - self.max_pending_groups
            self._pending = self._pending[-self.max_pending_groups:]
        now = time.monotonic()
        if now - self._last_publish < self.transport.min_publish_interval():
            return
        self._last_publish = now
        batch = RolloutBatch(swarm_id=self.swarm_id, author=self.identity.public_key, address=(),
                             epoch=self.transport.current_epoch(), seq=self.seq, created_at=time.time(),
                             groups=tuple(self._pending))
        self._pending = []
        self.seq += 1
        self.groups_shared += len(batch.groups)
        try:
            self.transport.publish(batch)
        except Exception as exc:
            self.errors["publish"] += 1
            logger.warning("publishing batch %d failed: %s", batch.seq, exc)
        crash_point("publish")

    def observe_own(self, groups: list[TrainGroup]) -> None:
        """The node's own sampled groups: what a peer's text is held to (``node.exchange.plausibility``)."""
        self.ingestor.observe_own(groups)

    def screen_bounds(self) -> PeerScreen | None:
        """The bounds this step's training holds peers' tokens to (None with ``ingest.screen`` off)."""
        return self.ingestor.screen_bounds()

    def read_reference(self, groups: list[TrainGroup]) -> None:
        """The screen's reference read of the peer groups a step is about to train on (``ScreenBook.read_base``)."""
        self.ingestor.book.read_base(groups)

    def record_screened(self, by_peer: dict[str, list[float]], step: int) -> None:
        """What training step ``step`` kept out of each author's text; an author whose text keeps failing is
        paused."""
        self.ingestor.record_screened(by_peer, step)

    def screen_state(self) -> dict[str, Any]:
        """The screen's profile and verdicts, for the node's checkpoint (``ScreenBook.state``)."""
        return self.ingestor.book.state()

    def load_screen_state(self, state: dict[str, Any]) -> None:
        self.ingestor.book.load_state(state)

    def paused(self, peer_id: str) -> bool:
        """Whether this node's screen has paused ``peer_id`` (its text keeps failing the screen's bounds)."""
        return self.ingestor.paused(peer_id)

    def receive(self, step: int, max_groups: int | None = None) -> list[TrainGroup]:
        """Peers' groups arrived since the last call, at most ``max_groups`` (what the step can use).

        Everything that arrived is drained either way, so nothing piles up in memory.
        """
        if not self._ensure_alive():
            return []
        try:
            batches = [b for b in self.transport.collect() if b.author != self.identity.public_key]
        except Exception as exc:
            self.errors["collect"] += 1
            logger.warning("collecting peer batches failed: %s", exc)
            return []
        if max_groups is None:
            max_groups = sum(len(b.groups) for b in batches)
        groups = self.ingestor.ingest_batches(batches, max_groups)
        for group in groups:
            self.peers_seen[group.peer_id] = None
            self.peers_seen.move_to_end(group.peer_id)
        while len(self.peers_seen) > _MAX_PEERS_REMEMBERED:
            self.peers_seen.popitem(last=False)
        return groups

    def metrics(self) -> dict[str, Any]:
        stats = self.transport.stats()
        rejected = dict(stats.get("batches_rejected", {}) or {})
        return {
            "peers_seen": int(stats.get("peers_seen", len(self.peers_seen))),
            "batches_published": int(stats.get("batches_published", self.seq)),
            "batches_accepted": int(stats.get("batches_accepted", 0)),
            "batches_rejected": rejected,
            "handoffs_sent": int(stats.get("handoffs_sent", 0)),
            "handoffs_held": int(stats.get("handoffs_held", 0)),
            "groups_pending": len(self._pending),
            "groups_dropped": self.groups_dropped,
            **self._connection(),
            "exchange_errors": dict(self.errors),
            **{k: v for k, v in stats.items() if k in _TRANSPORT_METRICS},
            **self.ingestor.metrics(),
        }

    def _connection(self) -> dict[str, Any]:
        """``connected`` (at least one peer answered: ``NetworkStatus.connected``, the definition the API,
        the dashboard, ``swarm-node status`` and the daemon's output use too), the DHT neighbours and whether
        the network side runs at all; a change of ``connected`` is logged once."""
        status = self.transport.network_status()
        if status.connected != self._connected:
            if status.connected:
                logger.info("connected: %d peer(s) answered (%s)", len(status.neighbours), status.reason)
            elif self._connected:
                logger.warning("not connected any more: %s", status.reason)
            else:
                logger.info("not connected yet: %s", status.reason)
            self._connected = status.connected
        return {"connected": status.connected, "dht_neighbours": len(status.neighbours),
                "network_running": bool(self.transport.is_alive())}

    def close(self) -> None:
        try:
            self.transport.close()
        finally:
            if self.ingestor.scorer is not None:
                self.ingestor.scorer.close()


_TRANSPORT_METRICS = ("offences", "peers_banned", "inbox_bytes", "pulls_stalled", "stalls_forgiven", "stalls_retried",
                      "pulls_failed", "poll_key_timeouts", "pulls_unreachable", "dht_store_bytes", "duplicate_groups",
                      "wire_encode_seconds", "wire_verify_seconds", "polls", "poll_ms", "publish_failed", "store_retries",
                      "bytes_in", "bytes_out", "batches_served", "handoff_failed", "handoffs_refused",
                      "dht_find_requests", "dht_find_keys", "dht_store_requests")
"""Transport counters copied into the node's metrics next to the batch counts (``wire_*``: the in-process
hub's time spent encoding and signing, and verifying and screening)."""
