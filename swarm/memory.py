"""An in-process hub that carries the same ``RolloutBatch`` records as the hivemind transport.

For experiments that isolate learning from the network (``scripts/bench_sapo.py``) and for tests of the
node's exchange logic: every batch a member publishes is delivered to every other member's inbox, with
no loss and no delay. Epochs are advanced by the caller (``hub.epoch``), not by a clock.
"""

from __future__ import annotations

import time
from collections import deque

from protocol.identity import peer_id_from_public_key
from protocol.records import RolloutBatch
from swarm.peer_book import PeerRow
from swarm.state import NetworkStatus


class InMemoryHub:
    """Connects ``InMemoryTransport``s; ``epoch`` is shared by all members."""

    def __init__(self) -> None:
        self.members: list[InMemoryTransport] = []
        self.epoch = 0

    def join(self) -> InMemoryTransport:
        member = InMemoryTransport(self)
        self.members.append(member)
        return member

    def _deliver(self, sender: InMemoryTransport, batch: RolloutBatch) -> None:
        for member in self.members:
            if member is not sender and not member.closed:
                member.inbox.append(batch)


class InMemoryTransport:
    """The ``BatchTransport`` interface of the node's exchange, over an ``InMemoryHub``."""

    def __init__(self, hub: InMemoryHub) -> None:
        self.hub = hub
        self.inbox: deque[RolloutBatch] = deque()
        self.closed = False
        self.published = 0
        self.accepted = 0
        self._by_author: dict[str, tuple[int, int, float]] = {}  # peer id -> (batches, groups, last seen)

    def publish(self, batch: RolloutBatch) -> str | None:
        self.published += 1
        self.hub._deliver(self, batch)
        return None

    def collect(self) -> list[RolloutBatch]:
        out = list(self.inbox)
        self.inbox.clear()
        self.accepted += len(out)
        now = time.time()
        for batch in out:
            author = peer_id_from_public_key(batch.author)
            batches, groups, _ = self._by_author.get(author, (0, 0, now))
            self._by_author[author] = (batches + 1, groups + len(batch.groups), now)
        return out

    def current_epoch(self) -> int:
        return self.hub.epoch

    def min_publish_interval(self) -> float:
        return 0.0  # no quotas in memory: every batch is delivered

    def stats(self) -> dict[str, int | float | dict[str, int]]:
        return {
            "peers_seen": len(self.hub.members) - 1,
            "batches_published": self.published,
            "batches_accepted": self.accepted,
            "batches_rejected": {},
        }

    def network_status(self) -> NetworkStatus:
        others = len(self.hub.members) - 1
        return NetworkStatus(up=not self.closed, reason="closed" if self.closed else f"in-memory hub, {others} others",
                             neighbours=(), restarts=0, last_error="")

    def peer_stats(self) -> list[PeerRow]:
        return [PeerRow(peer_id=author, published=True, batches_accepted=b, groups_accepted=g, rejected={},
                        bytes_in=0, bytes_out=0, last_seen=seen, banned_until=None, libp2p_ids=())
                for author, (b, g, seen) in self._by_author.items()]

    def is_alive(self) -> bool:
        return not self.closed

    def restart(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True
