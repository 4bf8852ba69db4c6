"""``SharedState``: what the network thread and the caller's threads share, behind one lock.

The network thread writes (accepted batches, counters, peers, addresses); the facade reads and drains.
Nothing here blocks on I/O while holding the lock.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from dataclasses import dataclass, field

from protocol.records import RolloutBatch
from swarm.addresses import AddressBook
from swarm.members import MemberTable
from swarm.peer_book import PeerBook, RejectReason
from swarm.settings import SwarmSettings
from swarm.trace import TraceLog

__all__ = ["NetworkStatus", "SharedState", "initial_peers_note", "network_reason", "peer_book_for"]


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
        stall_grace=settings.stall_grace,
        max_batches_per_epoch=settings.max_batches_per_epoch,
        max_bytes_per_epoch=settings.max_bytes_per_epoch,
        max_payload_bytes_per_peer_epoch=settings.max_payload_bytes_per_peer_epoch,
        newcomer_share=settings.newcomer_share,
        max_peers=settings.max_peers_tracked,
    )


@dataclass(frozen=True)
class NetworkStatus:
    """Whether the network side is up and, in words, why (not); a copy safe to hand to any thread."""

    up: bool
    reason: str
    neighbours: tuple[str, ...]
    restarts: int
    last_error: str
    """Why the network side last failed (a start failure or a loop that died); "" if it never did."""
    client: bool = False
    """Whether the node is in client mode now (dials out only); ``client_mode: auto`` leaves it once a peer
    could dial it back."""
    reach: str = ""
    """``client_mode: auto`` only: ``checking``, ``reachable at <address>``, ``unreachable`` or ``unknown``."""
    lost_at: float | None = None
    """Unix time this node lost its last DHT neighbour, while it has none again; else None."""
    connections: int = 0
    """Peers with an open connection to this node (clients included, which are never DHT neighbours)."""
    initial_lost_at: float | None = None
    """Unix time every initial peer (a member's: the swarm's hosts) stopped being a DHT neighbour, while none is
    back; else None."""
    initial_back: tuple[float, float] | None = None
    """``(Unix time, seconds away)`` of the last return of an initial peer after every one had gone; else None."""

    @property
    def connected(self) -> bool:
        """The one meaning of "connected" everywhere a node reports it: at least one peer answered (the
        network side is up with at least one DHT neighbour). A node that only listens is not connected."""
        return self.up and bool(self.neighbours)


def network_reason(
    *,
    alive: bool,
    running: bool,
    up: bool,
    neighbours: int,
    initial_peers: int,
    join_failures: int,
    start_failures: int,
    error: str,
    lost_for: float | None = None,
    retry_cap: float | None = None,
    remembered: int = 0,
) -> str:
    """One line saying what the network side is doing, from its state (pure, for ``NetworkStatus``).
    ``initial_peers`` and ``remembered``: the peers joining dials, the configured ones and those met before."""
    if not alive:
        return f"stopped: {error}" if error else "stopped"
    if not running:
        if start_failures and error:
            return f"starting failed {start_failures} times, retrying: {error}"
        return "starting"
    if error:  # a loop failed (p2pd died): the network side is shutting down
        return f"stopped: {error}"
    if not up:
        if lost_for is not None:
            every = f" every {retry_cap:.0f} s at most" if retry_cap else ""
            return (f"lost every peer {lost_for:.0f} s ago; dialing the initial and remembered peers again{every} "
                    f"({join_failures} attempts failed)")
        if join_failures:
            dialed = f"{initial_peers} initial and {remembered} remembered" if remembered else f"{initial_peers} initial"
            return f"joining: none of {dialed} peers answered ({join_failures} attempts failed)"
        return "joining"
    if neighbours:
        return f"joined: {neighbours} DHT neighbour{'s' if neighbours != 1 else ''}"
    return "listening, no peer has answered yet (others join through this node's address)"


def initial_peers_note(now: float, lost_at: float | None, back: tuple[float, float] | None) -> str:
    """What a status line adds about the initial peers (a member's: the swarm's hosts) once every one went away:
    since when they are gone, or when one came back and after how long (pure; "" when they never went)."""
    if lost_at is not None:
        return f"every initial peer (host) gone {max(0.0, now - lost_at):.0f} s ago"
    if back is not None:
        return f"initial peers (hosts) back {max(0.0, now - back[0]):.0f} s ago, after {back[1]:.0f} s away"
    return ""


@dataclass
class SharedState:
    """Counters, the inbox of verified batches and the network's visible state."""

    peer_book: PeerBook
    max_inbox: int
    max_inbox_bytes: int
    lock: threading.Lock = field(default_factory=threading.Lock)
    inbox: deque[tuple[RolloutBatch, int]] = field(default_factory=deque)  # (batch, estimated bytes)
    inbox_bytes: int = 0
    counters: Counter[str] = field(default_factory=Counter)
    network_up: bool = False
    dht_peers: list[str] = field(default_factory=list)
    visible_maddrs: list[str] = field(default_factory=list)
    error: str = ""
    """Why the network side is not running now ("" once it starts)."""
    last_error: str = ""
    """The most recent failure, kept after recovery (for status pages)."""
    up_event: threading.Event = field(default_factory=threading.Event)
    publish_seconds: float = 0.0
    """Running estimate of how long publishing one batch takes (hand-offs included); 0 before the first."""
    trace: TraceLog = field(default_factory=lambda: TraceLog(None))
    """Optional JSON-lines event record (``swarm.trace_path``), written by the network thread."""
    members: MemberTable | None = None
    """A host's view of the swarm's members (``swarm.members``), fed with every new manifest read and every
    batch verified or handed over (a host's verified batches go there instead of the inbox); None on a
    training node."""
    bootstrap_peers: list[str] = field(default_factory=list)
    """Peers met while running (full multiaddrs), dialed with the initial peers when every neighbour is gone."""
    book: AddressBook = field(default_factory=AddressBook)
    """The peers this node reached at an address (``swarm.addresses``): hand-off holders, remembered peers."""
    client: bool = False
    """Client mode now (``SwarmSettings.starts_as_client`` at start; ``auto`` leaves it once reachable)."""
    reach: str = ""
    """``client_mode: auto``: where the reachability check stands (see ``NetworkStatus.reach``)."""
    reachable_at: list[str] = field(default_factory=list)
    """Addresses a peer dialed this node back at (``auto``), listed first in its batches."""
    lost_at: float | None = None
    """Unix time every DHT neighbour was lost, while none is back; None otherwise."""
    initial_lost_at: float | None = None
    """Unix time no initial peer (a member's: the swarm's hosts) was a DHT neighbour any more after one had been,
    while none is back; None otherwise."""
    initial_back: tuple[float, float] | None = None
    """``(Unix time, seconds away)`` of the last return of an initial peer after every one had gone."""
    connections: int = 0
    """Peers with an open connection now (p2pd's list), refreshed by the health loop."""

    @classmethod
    def from_settings(cls, settings: SwarmSettings) -> SharedState:
        return cls(peer_book=peer_book_for(settings), max_inbox=settings.max_inbox_batches,
                   max_inbox_bytes=settings.max_inbox_bytes, trace=TraceLog(settings.trace_path),
                   client=settings.starts_as_client)

    def push_batch(self, batch: RolloutBatch, nbytes: int) -> None:
        """Queue a verified batch (``nbytes``: its estimated memory) for ``collect()``.

        The oldest are dropped (and counted) while the inbox holds too many batches or bytes.
        """
        with self.lock:
            self.inbox.append((batch, nbytes))
            self.inbox_bytes += nbytes
            while len(self.inbox) > self.max_inbox or self.inbox_bytes > self.max_inbox_bytes:
                _, dropped = self.inbox.popleft()
                self.inbox_bytes -= dropped
                self.peer_book.count(RejectReason.DROPPED_INBOX_FULL)

    def drain(self) -> list[RolloutBatch]:
        with self.lock:
            batches = [batch for batch, _ in self.inbox]
            self.inbox.clear()
            self.inbox_bytes = 0
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

    def met_peers(self) -> list[str]:
        """The peers met before (remembered in the run dir, or reached while running) that joining dials
        besides the initial ones; the caller holds ``lock``."""
        return [*self.bootstrap_peers, *self.book.remembered()]

    def set_error(self, message: str) -> None:
        with self.lock:
            self.error = self.last_error = message

    def clear_error(self) -> None:
        with self.lock:
            self.error = ""

    def note_publish_seconds(self, seconds: float, weight: float) -> None:
        """One more batch went out (hand-offs and DHT store) in ``seconds``: update the running estimate."""
        with self.lock:
            previous = self.publish_seconds
            self.publish_seconds = seconds if previous <= 0 else (1 - weight) * previous + weight * seconds

    def add(self, name: str, n: int = 1) -> None:
        with self.lock:
            self.counters[name] += n
