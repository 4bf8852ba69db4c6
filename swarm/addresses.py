"""``AddressBook``: the peers this node reached at an address, so that it needs no host to find them again.

A peer's address is written here only once this node dialed it there and the peer answered: an initial
or remembered peer that answered a ping, a holder that took a hand-off, an author whose batch was pulled
from the author's own listed address (a batch listed at one peer's addresses only: a member that accepts
connections). So a member behind NAT is never remembered (nobody can dial it), and neither is an address
a peer merely claims. It is the address the peer was met at that is kept (``met_addresses``: of the
addresses dialed, the one the open connection goes to), so a peer met on 127.0.0.1 is remembered there,
not at another interface of its machine that it also lists. What the book is used for:

* ``holders``: where a node behind NAT hands its batches, among the peers that answered most recently
  and are DHT servers now (the swarm's hosts, and members that accept connections), rotated to spread
  the load, so hand-offs go on when every host is gone;
* ``remembered``: what the daemon saves in the run dir (``known_peers.txt``) and dials when every
  neighbour is gone, or at the next start.

Pure bookkeeping (no I/O, no clock); the caller holds ``SharedState.lock``. Bounded: ``max_peers`` peers
(the longest unconfirmed go first), ``max_addrs`` addresses each.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["AddressBook", "met_addresses", "peer_of", "useful_addresses"]

_LOOPBACK = ("/ip4/127.", "/ip6/::1/")


def peer_of(maddr: str) -> str | None:
    """The libp2p peer id a full multiaddr ends with (``.../p2p/<id>``), else None. A relayed address names
    the relay first and the peer last, so it is the last ``/p2p/`` that counts."""
    head, sep, peer = maddr.rpartition("/p2p/")
    return peer if sep and head and peer and "/" not in peer else None


def useful_addresses(maddrs: list[str]) -> list[str]:
    """The addresses worth dialing from elsewhere: not relayed, and not loopback unless that is all there is
    (peers on one machine)."""
    direct = [m for m in maddrs if "/p2p-circuit" not in m]
    public = [m for m in direct if not m.startswith(_LOOPBACK)]
    return public or direct


def _tcp_port(maddr: str) -> str | None:
    head, sep, rest = maddr.partition("/tcp/")
    return rest.split("/", 1)[0] if sep and head else None


def met_addresses(dialed: list[str], connected: list[str]) -> list[str]:
    """Of the addresses a peer was dialed at (all it lists, dialed together), those it was met at: the ones its
    open connection goes to (``connected``: p2pd's remote addresses of the connection), else those at the same
    TCP port (a DNS name dialed, its IP connected), else ``useful_addresses(dialed)`` (nothing known)."""
    exact = [m for m in dialed if m in connected]
    if exact:
        return exact
    ports = {_tcp_port(m) for m in connected} - {None}
    same_port = [m for m in dialed if _tcp_port(m) in ports]
    return same_port or useful_addresses(dialed)


@dataclass
class _Entry:
    maddrs: list[str] = field(default_factory=list)
    ok_at: float = 0.0
    failed_at: float = 0.0


class AddressBook:
    """Full multiaddrs of the peers this node dialed and heard back from; see the module docstring."""

    def __init__(self, *, max_peers: int = 64, max_addrs: int = 4) -> None:
        self.max_peers = max_peers
        self.max_addrs = max_addrs
        self._peers: dict[str, _Entry] = {}

    def __len__(self) -> int:
        return len(self._peers)

    def confirmed(self, maddrs: list[str], now: float) -> None:
        """The peers of ``maddrs`` (full multiaddrs) answered at these addresses just now (each kept as given,
        the first first: the address a peer was met at, loopback included; relayed ones are never kept)."""
        for maddr in reversed(maddrs):  # each one put first in turn: the first given ends first
            if "/p2p-circuit" in maddr:
                continue
            peer = peer_of(maddr)
            if peer is None:
                continue
            entry = self._peers.setdefault(peer, _Entry())
            entry.maddrs = list(dict.fromkeys([maddr, *entry.maddrs]))[: self.max_addrs]
            entry.ok_at = max(entry.ok_at, now)
        while len(self._peers) > self.max_peers:
            oldest = min(self._peers, key=lambda p: self._peers[p].ok_at)
            del self._peers[oldest]

    def failed(self, peer: str, now: float) -> None:
        """Dialing ``peer`` (a libp2p id) failed just now: it is no holder until it answers again."""
        entry = self._peers.get(peer)
        if entry is not None:
            entry.failed_at = max(entry.failed_at, now)

    def live(self) -> list[str]:
        """Peers whose last answer is newer than their last failure, the most recently confirmed first."""
        alive = [p for p, e in self._peers.items() if e.ok_at >= e.failed_at]
        return sorted(alive, key=lambda p: self._peers[p].ok_at, reverse=True)

    def failed_last(self, peer: str) -> bool:
        """Whether the last news of ``peer`` is a failure (it is no holder until it answers again)."""
        entry = self._peers.get(peer)
        return entry is not None and entry.failed_at > entry.ok_at

    def confirmed_since(self, peer: str, since: float) -> bool:
        """Whether ``peer`` answered at a kept address at ``since`` or later."""
        entry = self._peers.get(peer)
        return entry is not None and entry.ok_at >= since and bool(entry.maddrs)

    def maddrs(self, peer: str) -> list[str]:
        entry = self._peers.get(peer)
        return [] if entry is None else list(entry.maddrs)

    def holders(self, servers: set[str], count: int, seq: int) -> list[str]:
        """Addresses of up to ``count`` live peers among ``servers`` (libp2p ids of DHT servers now), one
        peer after another in a stable order rotated by ``seq``, so consecutive batches go to different ones."""
        peers = sorted(p for p in self.live() if p in servers)
        if not peers:
            return []
        k = seq % len(peers)
        chosen = [*peers[k:], *peers[:k]][:count]
        return [m for p in chosen for m in self._peers[p].maddrs[:2]]

    def remembered(self, limit: int = 32) -> list[str]:
        """Addresses to dial when every neighbour is gone (or after a restart): live peers first, then those
        that failed last, each group the most recently confirmed first."""
        failed = sorted((p for p, e in self._peers.items() if e.ok_at < e.failed_at),
                        key=lambda p: self._peers[p].ok_at, reverse=True)
        return [m for p in [*self.live(), *failed] for m in self._peers[p].maddrs][:limit]
