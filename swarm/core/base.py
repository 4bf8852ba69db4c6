"""What every part of ``SwarmCore`` shares: the state it holds, the wire constants, address parsing,
dialing a peer and paced transfers, and the batches held here to serve.

``CoreBase`` carries the state; each job (``join``, ``publish``, ``pull``, ``serve``, ``health``) is a
mixin on top of it, and ``SwarmCore`` (``swarm.core.lifecycle``) composes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Any

from hivemind.dht.node import DHTNode
from hivemind.p2p import P2P, PeerID
from hivemind.p2p.p2p_daemon_bindings.utils import ControlFailure, P2PDaemonError
from hivemind.utils.multiaddr import Multiaddr

from protocol.identity import Identity
from protocol.limits import Limits
from protocol.records import Manifest
from swarm.addresses import met_addresses
from swarm.handoff import HandoffStore
from swarm.hivemind_compat import dht_neighbours, dial
from swarm.settings import SwarmSettings
from swarm.state import SharedState
from swarm.validator import ManifestValidator
from swarm.watchdog import P2pdWatchdog

logger = logging.getLogger(__name__)

ID_BYTES = 64  # a batch id on the wire: 64 ASCII hex chars
LEN_BYTES = 8  # big-endian length prefix of a served batch; 0 means "not held here"
HEALTH_PERIOD = 1.0
_CHUNK = 64 * 1024  # bytes read at a time from a batch stream
_CIRCUIT = "/p2p-circuit"
_DIRECT = ("ip4", "ip6", "dns", "dns4", "dns6")
_MET_REFRESH_SECONDS = 30.0  # how often a pulled-from peer's connection address is asked of p2pd again
NETWORK_ERRORS = (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ControlFailure, P2PDaemonError)


def handler_name(swarm_id: str) -> str:
    """The libp2p protocol name of a swarm's batch handler."""
    return f"/swarm-node/{swarm_id}/get_batch/1"


def put_handler_name(swarm_id: str) -> str:
    """The libp2p protocol name of a swarm's hand-off handler."""
    return f"/swarm-node/{swarm_id}/put_batch/1"


@dataclass(frozen=True)
class PublishItem:
    """A batch ready to go out: signed bytes, signed manifest bytes and where the manifest goes."""

    batch_id: str
    data: bytes
    manifest_data: bytes
    key: str
    subkey: str
    expires_at: float
    holders: tuple[str, ...] = ()
    """Full multiaddrs of the peers to hand the batch to before its manifest is stored (NAT hand-off)."""
    created_at: float = 0.0
    """The batch's ``created_at`` (DHT time), for the trace."""



def parse_peer_maddr(maddr: str) -> tuple[PeerID, Multiaddr] | None:
    """``(peer id, address to dial)`` of a full multiaddr, or None if it does not parse.

    The peer is the last ``/p2p/`` component, so a relayed address
    ``/ip4/R/tcp/P/p2p/<relay>/p2p-circuit/p2p/<peer>`` is dialed through the relay.
    """
    head, sep, peer = maddr.rpartition("/p2p/")
    if not sep or not head or "/" in peer:
        return None
    try:
        return PeerID.from_base58(peer), Multiaddr(head)
    except (ValueError, LookupError, TypeError):
        return None


def describe_error(exc: BaseException) -> str:
    """An exception as one short line for status pages (``p2pd exited``, ``TimeoutError``)."""
    return str(exc) or type(exc).__name__


def libp2p_ids(maddrs: tuple[str, ...]) -> list[str]:
    """The libp2p peer ids named by full multiaddrs (``.../p2p/<id>``); others are skipped."""
    return [parsed[0].to_base58() for parsed in map(parse_peer_maddr, maddrs) if parsed is not None]


def by_peer(maddrs: tuple[str, ...] | list[str]) -> dict[PeerID, list[Multiaddr]]:
    """Parsed addresses grouped by peer, in the order peers first appear."""
    grouped: dict[PeerID, list[Multiaddr]] = {}
    for parsed in map(parse_peer_maddr, maddrs):
        if parsed is not None:
            grouped.setdefault(parsed[0], []).append(parsed[1])
    return grouped


def order_maddrs(maddrs: list[str], relayed_first: bool) -> list[str]:
    """Relayed (circuit) addresses first when behind NAT with a relay: the direct ones cannot be dialed."""
    return sorted(maddrs, key=lambda m: _CIRCUIT not in m) if relayed_first else maddrs


class CoreBase:
    """The state of one node's network side, and the steps its jobs share."""

    def __init__(
        self,
        settings: SwarmSettings,
        identity: Identity,
        limits: Limits,
        shared: SharedState,
        validator: ManifestValidator,
        p2p: P2P,
        dht: DHTNode,
        watchdog: P2pdWatchdog | None,
    ) -> None:
        self.settings = settings
        self.identity = identity
        self.limits = limits
        self.shared = shared
        self.validator = validator
        self.p2p = p2p
        self.dht = dht
        self.watchdog = watchdog
        self.held: OrderedDict[str, bytes] = OrderedDict()
        self.held_bytes = 0
        self.handoffs = HandoffStore(
            max_per_author_epoch=settings.max_handoffs_per_author_epoch,
            max_bytes_per_author_epoch=settings.max_handoff_bytes_per_author_epoch,
            max_total_bytes=settings.max_handoff_bytes,
            read_epochs=settings.read_epochs,
        )
        self._handoffs_in_flight = 0
        self.publish_queue: asyncio.Queue[PublishItem] = asyncio.Queue()
        self._seen_manifests: dict[bytes, tuple[int, str]] = {}  # raw manifest -> (epoch seen, batch id)
        self._deferred: dict[bytes, Manifest] = {}  # checked manifests whose pull waits for a slot
        self._bad_entries: dict[tuple[int, int, str, str], int] = {}  # unreadable DHT entries -> epoch
        self._digests: dict[bytes, int] = {}  # content hash of every accepted group -> epoch
        self._pulls: set[asyncio.Task[None]] = set()
        self._background: set[asyncio.Task[Any]] = set()  # hand-off copies still going after the first landed
        self._running_pulls: Counter[str] = Counter()  # author -> pulls in progress
        self._newcomer_pulls = 0
        self._decode_slot = asyncio.Semaphore(1)
        self._handler = handler_name(settings.swarm_id)
        self._put_handler = put_handler_name(settings.swarm_id)
        self._relayed = settings.client_mode is True and settings.nat_sharing == "relay"
        self._reach_checks = 0  # reachability checks running for others (``swarm.core.reach``)
        self._reach_asked: dict[str, float] = {}  # asker -> when its last check started (loop clock)

    def _neighbours(self) -> list[str]:
        """libp2p ids of the DHT neighbours (the servers in the routing table)."""
        return [peer.to_base58() for peer in dht_neighbours(self.dht)]

    def _confirm(self, maddrs: list[str]) -> None:
        """These peers answered at these addresses just now (``swarm.addresses``)."""
        with self.shared.lock:
            self.shared.book.confirmed(maddrs, time.time())

    async def _confirm_met(self, peer: PeerID, dialed: list[Multiaddr]) -> None:
        """``peer`` answered after being dialed at ``dialed`` (its listed addresses, tried together): keep the one
        its connection goes to (``swarm.addresses.met_addresses``; p2pd is asked at most every
        ``_MET_REFRESH_SECONDS`` a peer)."""
        name = peer.to_base58()
        now = time.time()
        with self.shared.lock:
            if self.shared.book.confirmed_since(name, now - _MET_REFRESH_SECONDS):
                self.shared.book.confirmed(self.shared.book.maddrs(name), now)
                return
        connected: list[str] = []
        with contextlib.suppress(*NETWORK_ERRORS, ValueError):
            infos = await asyncio.wait_for(self.p2p.list_peers(), self.settings.request_timeout)
            connected = [str(a) for info in infos if info.peer_id == peer for a in info.addrs]
        met = met_addresses([str(a) for a in dialed], connected)
        self._confirm([f"{a}/p2p/{name}" for a in met])

    def _unreachable(self, peer: PeerID) -> None:
        """Dialing ``peer`` failed just now: no holder until it answers again."""
        with self.shared.lock:
            self.shared.book.failed(peer.to_base58(), time.time())

    async def _port_closed(self, addr: Multiaddr) -> bool:
        """Whether nothing takes a plain TCP connection at ``addr`` (a direct ``/ip4|ip6|dns*/.../tcp/P``
        address; False for any other, which is dialed as it is). Checked before p2pd dials a peer that may
        be gone (a host or holder): every failed p2pd dial lengthens libp2p's back-off for that address (5 s
        + 1 s x failures squared, up to 5 minutes), during which even a peer that is back is not dialed, so
        a host down for minutes was reached again only minutes after its return. A closed port costs p2pd
        no failure."""
        parts = str(addr).strip("/").split("/")
        if len(parts) != 4 or parts[0] not in _DIRECT or parts[2] != "tcp" or not parts[3].isdigit():
            return False
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(parts[1], int(parts[3])),
                                               self.settings.request_timeout)
        except (OSError, asyncio.TimeoutError):
            return True
        writer.close()
        with contextlib.suppress(OSError, asyncio.TimeoutError):
            await asyncio.wait_for(writer.wait_closed(), 1.0)
        return False

    async def _dial(self, peer_id: PeerID, addrs: list[Multiaddr]) -> bool:
        """Connect to ``peer_id`` (at once if already connected; its addresses are tried together)."""
        try:
            await asyncio.wait_for(dial(self.p2p, peer_id, addrs), self.settings.request_timeout)
        except NETWORK_ERRORS as exc:
            logger.debug("could not dial %s at %s: %r", peer_id, addrs, exc)
            return False
        return True

    async def _lookup(self, keys: list[str]) -> dict[str, Any]:
        """Look every key up on its own: one whose lookup fails or hangs costs only itself (bounded)."""
        timeout = self.settings.request_timeout
        try:
            futures = await asyncio.wait_for(
                self.dht.get_many(keys, sufficient_expiration_time=float("inf"), return_futures=True), timeout
            )
        except NETWORK_ERRORS as exc:
            self.shared.add("poll_failed")
            logger.debug("reading manifests failed: %r", exc)
            return {}
        if not futures:
            return {}
        done, pending = await asyncio.wait(list(futures.values()), timeout=timeout)
        for future in pending:
            future.cancel()  # stops hivemind's search for that key
        found: dict[str, Any] = {}
        for key, future in futures.items():
            if future not in done:
                self.shared.add("poll_key_timeouts")
            elif future.cancelled() or future.exception() is not None:
                self.shared.add("poll_key_failures")
                logger.debug("looking up %s failed: %r", key, None if future.cancelled() else future.exception())
            else:
                found[key] = future.result()
        return found

    # -- transfers ------------------------------------------------------------------------------------

    def transfer_seconds(self, nbytes: int) -> float:
        """The longest a transfer of ``nbytes`` batch bytes may take: ``pull_timeout`` to get going, then
        at least ``pull_min_rate`` bytes a second."""
        return self.settings.pull_timeout + nbytes / self.settings.pull_min_rate

    async def _read_paced(self, reader: asyncio.StreamReader, size: int, started: float) -> bytes:
        """``size`` bytes of a batch transfer that began at ``started`` (the loop's clock).

        No read may wait longer than ``request_timeout`` (no progress at all: a stall), and the transfer
        must keep its pace: by ``started + pull_timeout + k / pull_min_rate`` it has delivered ``k`` bytes.
        So a large batch over a slow link gets the time it needs, while a peer that trickles bytes to hold
        a pull slot is cut off about ``pull_timeout`` after the stream opened. Raises ``TimeoutError`` or
        ``IncompleteReadError``.
        """
        loop = asyncio.get_running_loop()
        s = self.settings
        buf = bytearray()
        while len(buf) < size:
            wait = min(s.request_timeout, started + s.pull_timeout + (len(buf) + 1) / s.pull_min_rate - loop.time())
            if wait <= 0:
                raise asyncio.TimeoutError(f"transfer below {s.pull_min_rate:.0f} B/s after {len(buf)} bytes")
            chunk = await asyncio.wait_for(reader.read(min(_CHUNK, size - len(buf))), wait)
            if not chunk:
                raise asyncio.IncompleteReadError(bytes(buf), size)
            buf += chunk
        return bytes(buf)

    # -- batches held here ----------------------------------------------------------------------------

    def hold(self, bid: str, data: bytes) -> None:
        """Keep signed batch bytes to serve; the least recently added go first (bounded in count and bytes)."""
        previous = self.held.pop(bid, None)
        self.held_bytes -= len(previous) if previous is not None else 0
        self.held[bid] = data
        self.held_bytes += len(data)
        while len(self.held) > self.settings.max_held_batches or self.held_bytes > self.settings.max_held_bytes:
            _, dropped = self.held.popitem(last=False)
            self.held_bytes -= len(dropped)

    def _local(self, bid: str) -> bytes | None:
        """A batch this node already holds (collected before, or handed over to it), else None."""
        data = self.held.get(bid)
        return data if data is not None else self.handoffs.get(bid)
