"""The node's side of the swarm: publish our groups as signed batches, ingest what peers published.

``SwarmExchange`` works over any ``BatchTransport``: the hivemind ``swarm.transport.SwarmTransport`` in a
daemon, or ``InMemoryHub`` transports (the same signed bytes and checks, carried in memory) for
experiments that isolate learning from the network. It never
blocks the training loop: publishing queues, collecting returns what has arrived, and a dead transport is
restarted with backoff while the node keeps training on its own groups.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

from node.ingest import Ingestor
from node.outbound import to_rollout_groups
from node.policy.model import Policy
from node.rollouts import SampledGroup
from node.tasks import TaskSource
from node.train.groups import TrainGroup
from protocol.identity import Identity
from protocol.records import RolloutBatch

logger = logging.getLogger(__name__)


class BatchTransport(Protocol):
    def publish(self, batch: RolloutBatch) -> str | None: ...

    def collect(self) -> list[RolloutBatch]: ...

    def current_epoch(self) -> int: ...

    def stats(self) -> dict[str, Any]: ...

    def is_alive(self) -> bool: ...

    def restart(self) -> None: ...

    def close(self) -> None: ...


class SwarmExchange:
    """Implements the node loop's ``Exchange`` over a ``BatchTransport``."""

    def __init__(self, policy: Policy, source: TaskSource, transport: BatchTransport, identity: Identity, *,
                 swarm_id: str, temperature: float, top_p: float, max_completion_tokens: int,
                 restart_backoff: float = 5.0, max_restart_backoff: float = 300.0) -> None:
        self.policy = policy
        self.transport = transport
        self.identity = identity
        self.swarm_id = swarm_id
        self.temperature = temperature
        self.top_p = top_p
        self.ingestor = Ingestor(policy, source, temperature=temperature, max_completion_tokens=max_completion_tokens)
        self.seq = 0
        self.restart_backoff = restart_backoff
        self.max_restart_backoff = max_restart_backoff
        self._next_restart = 0.0
        self._failures = 0
        self.peers_seen: set[str] = set()

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
            logger.warning("network restart failed: %s", exc)
            return False
        return self.transport.is_alive()

    def share(self, step: int, groups: list[SampledGroup]) -> None:
        if not groups or not self._ensure_alive():
            return
        records = to_rollout_groups(self.policy, groups, policy_step=step, temperature=self.temperature,
                                    top_p=self.top_p)
        batch = RolloutBatch(swarm_id=self.swarm_id, author=self.identity.public_key, address=(),
                             epoch=self.transport.current_epoch(), seq=self.seq, created_at=time.time(),
                             groups=tuple(records))
        self.seq += 1
        try:
            self.transport.publish(batch)
        except Exception as exc:
            logger.warning("publishing batch %d failed: %s", batch.seq, exc)

    def receive(self, step: int) -> list[TrainGroup]:
        if not self._ensure_alive():
            return []
        try:
            batches = self.transport.collect()
        except Exception as exc:
            logger.warning("collecting peer batches failed: %s", exc)
            return []
        groups: list[TrainGroup] = []
        for batch in batches:
            if batch.author == self.identity.public_key:
                continue
            new = self.ingestor.ingest(batch)
            if new:
                self.peers_seen.add(new[0].peer_id)
            groups.extend(new)
        return groups

    def metrics(self) -> dict[str, Any]:
        stats = self.transport.stats()
        rejected = dict(stats.get("batches_rejected", {}) or {})
        return {
            "peers_seen": int(stats.get("peers_seen", len(self.peers_seen))),
            "batches_published": int(stats.get("batches_published", self.seq)),
            "batches_accepted": int(stats.get("batches_accepted", 0)),
            "batches_rejected": rejected,
            "network_up": bool(self.transport.is_alive()),
            **{k: float(v) for k, v in stats.items() if k.startswith("wire_")},  # in-process hub: encode/verify time
            **self.ingestor.metrics(),
        }

    def close(self) -> None:
        self.transport.close()
