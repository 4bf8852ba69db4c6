"""An in-process swarm whose members exchange the same signed bytes as the hivemind transport.

For experiments that isolate learning from the network (``scripts/bench/bench_sapo.py``) and for tests of the
node's exchange logic. A member's ``publish`` encodes and signs the batch and its manifest exactly as
``SwarmTransport`` does; the hub hands both byte strings to every other member, with no loss and no
delay; a member's ``collect`` passes each through ``swarm.intake`` -- manifest signature, the peer book's
screening (dedup, bans, staleness window, per-author and global quotas), then size, hash, payload caps,
batch signature, limits, the manifest match and content dedup -- before the batch reaches the node, and
offences found later in its rollouts ban the author (``penalize``), as on the hivemind path. What is missing against a real swarm is only the
carrying: the DHT, libp2p streams, p2pd, and the timing and loss they bring.

Epochs are advanced by the caller (``hub.epoch``), not by a clock. Each member times its own encoding
and verification (``stats()["wire_encode_seconds"]`` / ``["wire_verify_seconds"]``).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import replace

from protocol.codec import encode_batch, encode_manifest, make_manifest
from protocol.errors import ProtocolError
from protocol.identity import Identity, peer_id_from_public_key
from protocol.limits import DEFAULT_LIMITS, Limits
from protocol.records import RolloutBatch
from swarm.intake import read_manifest, screen, settle, verify_now
from swarm.peer_book import PeerRow
from swarm.settings import SwarmSettings
from swarm.state import NetworkStatus, peer_book_for

__all__ = ["InMemoryHub", "InMemoryTransport"]

StatValue = int | float | dict[str, int]


class InMemoryHub:
    """Connects ``InMemoryTransport``s; ``epoch`` is shared by all members."""

    def __init__(self, limits: Limits = DEFAULT_LIMITS) -> None:
        self.members: list[InMemoryTransport] = []
        self.epoch = 0
        self.limits = limits

    def join(self, settings: SwarmSettings, identity: Identity) -> InMemoryTransport:
        """A new member (the node's ``TransportFactory``: ``Node(cfg, transport=hub.join)``)."""
        member = InMemoryTransport(self, settings, identity)
        self.members.append(member)
        return member

    def announce(self, sender: InMemoryTransport, manifest_data: bytes, data: bytes) -> None:
        """Hand a signed manifest and the signed batch it points at to every other open member."""
        for member in self.members:
            if member is not sender and not member.closed:
                member.pending.append((manifest_data, data))


class InMemoryTransport:
    """The ``BatchTransport`` interface of the node's exchange, over an ``InMemoryHub``."""

    def __init__(self, hub: InMemoryHub, settings: SwarmSettings, identity: Identity) -> None:
        self.hub = hub
        self.settings = settings
        self.identity = identity
        self.book = peer_book_for(settings)
        self.pending: deque[tuple[bytes, bytes]] = deque()  # (manifest bytes, batch bytes) not yet collected
        self.closed = False
        self.published = 0
        self.encode_seconds = 0.0
        self.verify_seconds = 0.0
        self._seq = 0
        self._pruned_epoch = -1
        self._digests: dict[bytes, int] = {}  # content hash of every accepted group -> epoch

    def publish(self, batch: RolloutBatch) -> str | None:
        """Sign ``batch`` and its manifest as ``SwarmTransport`` does and announce both to the hub."""
        started = time.perf_counter()
        now = time.time()
        self._seq += 1
        batch = replace(batch, swarm_id=self.settings.swarm_id, address=(), epoch=self.hub.epoch,
                        seq=self._seq, created_at=now)
        try:
            data = encode_batch(batch, self.identity, self.hub.limits)
            manifest = make_manifest(batch, data, expires_at=now + self.settings.manifest_ttl)
            manifest_data = encode_manifest(manifest, self.identity, self.hub.limits)
        except ProtocolError:
            return None
        finally:
            self.encode_seconds += time.perf_counter() - started
        self.published += 1
        self.hub.announce(self, manifest_data, data)
        return manifest.batch_id

    def collect(self) -> list[RolloutBatch]:
        """Peers' batches announced since the last call that pass every check of ``swarm.intake``."""
        started = time.perf_counter()
        epoch, now = self.hub.epoch, time.monotonic()
        if epoch != self._pruned_epoch:
            self.book.prune(epoch, now)
            oldest = epoch - self.settings.read_epochs
            self._digests = {d: e for d, e in self._digests.items() if e >= oldest}
            self._pruned_epoch = epoch
        out = []
        while self.pending:
            manifest_data, data = self.pending.popleft()
            manifest = read_manifest(self.book, manifest_data, self.hub.limits,
                                     own_key=self.identity.public_key, swarm_id=self.settings.swarm_id)
            if manifest is None or screen(self.book, manifest, self.hub.limits, current_epoch=epoch,
                                          now=now) is not None:
                continue
            batch, reason, offence = verify_now(self.book, manifest, data, self.settings, self.hub.limits,
                                               self._digests, from_author=True)  # the author's own bytes
            self.book.received(peer_id_from_public_key(manifest.author), len(data), now)
            settle(self.book, manifest, len(data), reason, offence=offence, now=now,
                   groups=len(batch.groups) if batch is not None else 0)
            if batch is not None:
                out.append(batch)
        self.verify_seconds += time.perf_counter() - started
        return out

    def penalize(self, peer_id: str, reason: str) -> None:
        """An offence found in an accepted batch's rollouts: counted and the author banned."""
        self.book.penalize(peer_id, reason, time.monotonic())

    def current_epoch(self) -> int:
        return self.hub.epoch

    def min_publish_interval(self) -> float:
        return 0.0  # the hub's epochs advance when its owner says, not by the clock: no pacing

    def stats(self) -> dict[str, StatValue]:
        return {
            "peers_seen": self.book.authors_seen(),
            "batches_published": self.published,
            "batches_accepted": self.book.accepted,
            "batches_rejected": dict(self.book.rejected),
            "peers_banned": len(self.book.banned(time.monotonic())),
            "wire_encode_seconds": self.encode_seconds,
            "wire_verify_seconds": self.verify_seconds,
        }

    def network_status(self) -> NetworkStatus:
        others = tuple(m.identity.peer_id for m in self.hub.members if m is not self and not m.closed)
        return NetworkStatus(up=not self.closed,
                             reason="closed" if self.closed else f"in-memory hub, {len(others)} others",
                             neighbours=() if self.closed else others, restarts=0, last_error="")

    def peer_stats(self) -> list[PeerRow]:
        """Per-peer counters of this transport's peer book (``PeerBook.peer_table``), times as Unix times."""
        mono = time.monotonic()
        offset = time.time() - mono
        return [replace(row, last_seen=row.last_seen + offset,
                        banned_until=None if row.banned_until is None else row.banned_until + offset)
                for row in self.book.peer_table(mono)]

    def is_alive(self) -> bool:
        return not self.closed

    def restart(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True
