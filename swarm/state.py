"""``SharedState``: what the network thread and the caller's threads share, behind one lock.

The network thread writes (accepted batches, counters, peers, addresses); the facade reads and drains.
Nothing here blocks on I/O while holding the lock.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from dataclasses import dataclass, field

from protocol.records import RolloutBatch
from swarm.peer_book import PeerBook, RejectReason
from swarm.settings import SwarmSettings

__all__ = ["SharedState", "peer_book_for"]


def peer_book_for(settings: SwarmSettings) -> PeerBook:
    """A fresh peer book with the quotas, staleness window and bans of ``settings``."""
    return PeerBook(
        max_batches_per_peer_epoch=settings.max_batches_per_peer_epoch,
        max_bytes_per_peer_epoch=settings.max_bytes_per_peer_epoch,
        read_epochs=settings.read_epochs,
        ban_seconds=settings.ban_seconds,
        ban_backoff=settings.ban_backoff,
        max_ban_seconds=settings.max_ban_seconds,
        max_pull_attempts=settings.max_pull_attempts,
    )


@dataclass
class SharedState:
    """Counters, the inbox of verified batches and the network's visible state."""

    peer_book: PeerBook
    max_inbox: int
    lock: threading.Lock = field(default_factory=threading.Lock)
    inbox: deque[RolloutBatch] = field(default_factory=deque)
    counters: Counter[str] = field(default_factory=Counter)
    network_up: bool = False
    dht_peers: list[str] = field(default_factory=list)
    visible_maddrs: list[str] = field(default_factory=list)
    last_error: str = ""
    up_event: threading.Event = field(default_factory=threading.Event)

    @classmethod
    def from_settings(cls, settings: SwarmSettings) -> SharedState:
        return cls(peer_book=peer_book_for(settings), max_inbox=settings.max_inbox_batches)

    def push_batch(self, batch: RolloutBatch) -> None:
        """Queue a verified batch for ``collect()``; the oldest is dropped (and counted) when full."""
        with self.lock:
            self.inbox.append(batch)
            while len(self.inbox) > self.max_inbox:
                self.inbox.popleft()
                self.peer_book.count(RejectReason.DROPPED_INBOX_FULL)

    def drain(self) -> list[RolloutBatch]:
        with self.lock:
            batches = list(self.inbox)
            self.inbox.clear()
        return batches

    def set_network(self, *, up: bool, dht_peers: list[str] | None = None) -> None:
        with self.lock:
            self.network_up = up
            if dht_peers is not None:
                self.dht_peers = dht_peers
        if up:
            self.up_event.set()
        else:
            self.up_event.clear()

    def add(self, name: str, n: int = 1) -> None:
        with self.lock:
            self.counters[name] += n
