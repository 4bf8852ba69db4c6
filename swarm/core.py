"""``SwarmCore``: the async side of one node, living in the network thread's event loop.

It owns one p2pd (hivemind ``P2P``), one ``DHTNode`` on top of it, the ``rpc_get_batch`` handler that
serves signed batches by id, and four background loops:

* join: dial the initial peers until the DHT has a neighbour, retrying with exponential backoff; and
  again whenever every neighbour is gone;
* publish: store queued manifests in the DHT (a failed store tried again, all of it bounded by
  ``publish_timeout``; a client-mode node's own storage never counts);
* collect: poll the manifest keys of the recent epochs (each key on its own, every entry checked again
  by the validator), screen new manifests with the peer book, pull the batches from their authors (a
  few at a time per author, newcomers at most ``newcomer_share`` of the slots, each pull bounded in total
  time), verify them (size, hash, expanded size charged before decoding, signature, manifest match,
  content not seen before) and queue them; the screening and verification steps are ``swarm.intake``'s,
  shared with the in-process hub;
* health: watch p2pd, refresh the peer list and this node's visible addresses, prune old state.

Behind NAT (``client_mode``) a node cannot be dialed; ``settings.nat_sharing`` picks how its batches still
reach the swarm: ``handoff`` pushes each batch to reachable holders (``rpc_put_batch``, ``swarm.handoff``)
before its manifest is stored, ``relay`` makes p2pd reserve a circuit-relay slot with the initial peers
and announce the relayed address first.

Every network await is bounded by a timeout. CPU-heavy decoding runs in the default executor, one batch
at a time, not on the loop. Held batches and the inbox are bounded in bytes as well as in count. Peer
input that fails a check is counted in the peer book and logged at debug level; when it shows intent
(bytes that are not what their author signed for, stalled pulls) the author is banned.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Any

from hivemind.dht.node import DHTNode
from hivemind.p2p import P2P, PeerID
from hivemind.p2p.p2p_daemon_bindings.datastructures import StreamInfo
from hivemind.p2p.p2p_daemon_bindings.utils import ControlFailure, P2PDaemonError
from hivemind.utils import get_dht_time
from hivemind.utils.multiaddr import Multiaddr

from protocol.codec import batch_id, batch_payload_size, decode_batch
from protocol.errors import ProtocolError
from protocol.identity import Identity, peer_id_from_public_key
from protocol.limits import Limits
from protocol.records import Manifest
from swarm.handoff import HandoffStatus, HandoffStore
from swarm.hivemind_compat import (
    count_dht_requests,
    dht_neighbours,
    dial,
    disconnect,
    own_session_p2pd,
    p2pd_exited,
    p2pd_pid,
    p2pd_process,
)
from swarm.intake import (
    DEFER,
    KNOWN,
    check_bytes,
    check_decoded,
    decode_with_digests,
    decoded_cost,
    fresh_groups,
    screen,
    settle,
)
from swarm.keys import epoch_at, epochs_to_read, manifest_key, shards_to_read
from swarm.peer_book import RejectReason
from swarm.settings import SwarmSettings
from swarm.state import SharedState
from swarm.validator import ManifestValidator
from swarm.watchdog import P2pdWatchdog

__all__ = ["PublishItem", "SwarmCore", "decoded_cost", "describe_error", "handler_name", "put_handler_name"]

logger = logging.getLogger(__name__)

_ID_BYTES = 64  # a batch id on the wire: 64 ASCII hex chars
_LEN_BYTES = 8  # big-endian length prefix of a served batch; 0 means "not held here"
_HEALTH_PERIOD = 1.0
_MADDR_REFRESH_TICKS = 5  # health ticks between two refreshes of this node's visible addresses
_MAX_PULL_SOURCES = 4  # listed peers tried for one pull
# Hand-offs being received and verified at once; more are refused (busy). Over a lossy home link one takes
# seconds, and 6 NATed nodes handing off to 2 holders had a quarter of theirs refused at 2 (wan_swarm.py).
_MAX_HANDOFFS_IN_FLIGHT = 8
_CHUNK = 64 * 1024  # bytes read at a time from a batch stream
_PUBLISH_EWMA = 0.3  # weight of the latest publish's duration in the running estimate
_CANCEL_AGAIN_SECONDS = 0.2  # on shutdown, how often a task that is still running is cancelled again
_STORE_RETRY_SECONDS = 0.5  # first wait before a failed manifest store is tried again (doubled each time)
_CIRCUIT = "/p2p-circuit"
_NETWORK_ERRORS = (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ControlFailure, P2PDaemonError)


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


@dataclass
class _PullProgress:
    """Where a pull stands, so a time-out can tell a stalling author from an unreachable one."""

    reading_author: bool = False  # a stream to the author's address is open
    stalled: bool = False  # the author's address took a stream and did not deliver
    peer: PeerID | None = None  # the listed peer last read from
    source: str = ""  # where the bytes came from: "local" (held here), "listed" (a listed address), "neighbour"
    error: str = ""  # why the last source failed (dial, open, not_held, read, pace, bound), for the trace


class _NetworkDiedError(Exception):
    """p2pd exited under us; the core stops so the facade can restart it."""


def _parse_peer_maddr(maddr: str) -> tuple[PeerID, Multiaddr] | None:
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


def _libp2p_ids(maddrs: tuple[str, ...]) -> list[str]:
    """The libp2p peer ids named by full multiaddrs (``.../p2p/<id>``); others are skipped."""
    return [parsed[0].to_base58() for parsed in map(_parse_peer_maddr, maddrs) if parsed is not None]


def _by_peer(maddrs: tuple[str, ...] | list[str]) -> dict[PeerID, list[Multiaddr]]:
    """Parsed addresses grouped by peer, in the order peers first appear."""
    grouped: dict[PeerID, list[Multiaddr]] = {}
    for parsed in map(_parse_peer_maddr, maddrs):
        if parsed is not None:
            grouped.setdefault(parsed[0], []).append(parsed[1])
    return grouped


def _order_maddrs(maddrs: list[str], relayed_first: bool) -> list[str]:
    """Relayed (circuit) addresses first when behind NAT with a relay: the direct ones cannot be dialed."""
    return sorted(maddrs, key=lambda m: _CIRCUIT not in m) if relayed_first else maddrs


class SwarmCore:
    """One node's P2P, DHT node and background loops. Build with ``await SwarmCore.create(...)``."""

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
        self._relayed = settings.client_mode and settings.nat_sharing == "relay"

    @classmethod
    async def create(
        cls,
        settings: SwarmSettings,
        identity: Identity,
        limits: Limits,
        shared: SharedState,
        validator: ManifestValidator,
    ) -> SwarmCore:
        """Start p2pd (in its own session, with an orphan watchdog) and a DHT node; joining peers happens
        in ``run``. A Ctrl-C at the node's terminal reaches the node, not p2pd: the node shuts it down."""
        own_session_p2pd()
        relayed = settings.client_mode and settings.nat_sharing == "relay"
        p2p = await P2P.create(
            host_maddrs=settings.host_maddrs,
            announce_maddrs=settings.announce_maddrs or None,
            dht_mode="client" if settings.client_mode else "server",
            startup_timeout=settings.startup_timeout,
            identity_path=settings.p2p_identity_path,
            check_if_identity_free=False,
            # Behind NAT with a relay: reserve a slot on the initial peers (trusted, static relays) at once
            # instead of waiting for AutoNAT to find out that nobody can dial in.
            # A reachable node says so at once, which also starts its relay service for such peers.
            use_auto_relay=relayed,
            force_reachability="private" if relayed else (None if settings.client_mode else "public"),
            trusted_relays=settings.initial_peers if relayed else None,
        )
        pid = p2pd_pid(p2p)
        watchdog = P2pdWatchdog(pid) if pid is not None else None
        started = False
        try:  # p2pd must not outlive a failure (or cancellation) below
            dht = await DHTNode.create(
                p2p=p2p,
                client_mode=settings.client_mode,
                record_validator=validator,
                wait_timeout=settings.request_timeout,
                ensure_bootstrap_success=False,
                # Only the replicas a manifest was stored at answer with it. Each node caching what it
                # reads (hivemind's default) makes every node near a key answer every lookup of it with
                # the key's whole dictionary of manifests: up to 20 copies a key a poll (docs/scaling.md).
                cache_locally=False,
                cache_nearest=0,
            )
            self = cls(settings, identity, limits, shared, validator, p2p, dht, watchdog)
            count_dht_requests(dht, shared.add)
            await p2p.add_binary_stream_handler(self._handler, self.rpc_get_batch)
            if settings.accept_handoffs and not settings.client_mode:
                await p2p.add_binary_stream_handler(self._put_handler, self.rpc_put_batch)
            try:
                maddrs = _order_maddrs([str(m) for m in await p2p.get_visible_maddrs()], relayed)
            except ValueError:  # behind NAT with a relay: no address until a reservation is made
                maddrs = []
            started = True
        finally:
            if not started:
                await _shutdown_p2p(p2p, watchdog, timeout=settings.request_timeout)
        with shared.lock:
            shared.visible_maddrs = maddrs
        if settings.client_mode:  # dials out only: nobody can join through this node
            logger.info("network side started in client mode (dials out only; not connected until a peer answers)")
        else:
            logger.info("network side listening (not connected until a peer answers); others can join with: %s",
                        " ".join(maddrs))
        return self

    # -- lifecycle ----------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Run the background loops until ``stop`` is set or one of them fails (p2pd died, a bug)."""
        loops = [
            asyncio.create_task(self._join_loop(), name="swarm-join"),
            asyncio.create_task(self._publish_loop(), name="swarm-publish"),
            asyncio.create_task(self._collect_loop(), name="swarm-collect"),
            asyncio.create_task(self._health_loop(), name="swarm-health"),
        ]
        stopper = asyncio.create_task(stop.wait(), name="swarm-stop")
        try:
            done, _ = await asyncio.wait([*loops, stopper], return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                exc = None if task is stopper or task.cancelled() else task.exception()
                if exc is not None:
                    logger.error("swarm network loop %s failed: %r", task.get_name(), exc)
                    self.shared.set_error(describe_error(exc))
        finally:
            await _cancel_all([*loops, stopper, *self._pulls, *self._background], self.settings.request_timeout)

    async def shutdown(self) -> None:
        """Stop the DHT node and p2pd (bounded); kill p2pd if it does not exit."""
        self.shared.set_network(up=False, dht_peers=[])
        with contextlib.suppress(*_NETWORK_ERRORS):
            await asyncio.wait_for(self.dht.shutdown(), self.settings.request_timeout)
        await _shutdown_p2p(self.p2p, self.watchdog, timeout=self.settings.request_timeout)

    # -- join ---------------------------------------------------------------------------------------

    def _neighbours(self) -> list[str]:
        return [peer.to_base58() for peer in dht_neighbours(self.dht)]

    async def _join_loop(self) -> None:
        delay = self.settings.join_retry_seconds
        warned = False
        initial_ids = {p[0].to_base58() for p in map(_parse_peer_maddr, self.settings.initial_peers) if p is not None}
        rejoin_delay, next_rejoin = self.settings.join_retry_seconds, 0.0
        joined = False
        while True:
            neighbours = self._neighbours()
            if neighbours and not joined:
                joined = True
                self.shared.trace.event("up", neighbours=len(neighbours))
            if neighbours or not self.settings.initial_peers:
                self.shared.set_network(up=True, dht_peers=neighbours)
                delay, warned = self.settings.join_retry_seconds, False
                if not initial_ids or initial_ids & set(neighbours):
                    rejoin_delay = self.settings.join_retry_seconds
                elif time.monotonic() >= next_rejoin:
                    # Neighbours, but none of the initial peers: after a partition the ones left may all be
                    # on this side of it. Dial the initial peers again (with backoff) so the sides rejoin.
                    self.shared.add("rejoin_attempts")
                    await self._join_once()
                    next_rejoin = time.monotonic() + rejoin_delay
                    rejoin_delay = min(rejoin_delay * 2, self.settings.join_retry_max_seconds)
                await asyncio.sleep(_HEALTH_PERIOD)
                continue
            self.shared.set_network(up=False, dht_peers=[])
            self.shared.add("join_attempts")
            if await self._join_once():
                logger.info("joined the swarm through the initial peers")
                continue
            self.shared.add("join_failures")
            log = logger.debug if warned else logger.warning
            log(
                "none of %d initial peers answered; training goes on locally, retrying in %.1f s",
                len(self.settings.initial_peers),
                delay,
            )
            warned = True
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.settings.join_retry_max_seconds)

    async def _join_once(self) -> bool:
        targets = [p for p in map(_parse_peer_maddr, self.settings.initial_peers) if p is not None]
        results = await asyncio.gather(*(self._dial_and_ping(peer, addr) for peer, addr in targets))
        if not any(results):
            return False
        with contextlib.suppress(*_NETWORK_ERRORS):  # fill the routing table; best effort
            await asyncio.wait_for(
                self.dht.find_nearest_nodes([self.dht.node_id]), self.settings.request_timeout
            )
        return True

    async def _dial(self, peer_id: PeerID, addrs: list[Multiaddr]) -> bool:
        """Connect to ``peer_id`` (at once if already connected; its addresses are tried together)."""
        try:
            await asyncio.wait_for(dial(self.p2p, peer_id, addrs), self.settings.request_timeout)
        except _NETWORK_ERRORS as exc:
            logger.debug("could not dial %s at %s: %r", peer_id, addrs, exc)
            return False
        return True

    async def _dial_and_ping(self, peer_id: PeerID, addr: Multiaddr) -> bool:
        if not await self._dial(peer_id, [addr]):
            return False
        return await self.dht.protocol.call_ping(peer_id) is not None

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

    # -- publish ------------------------------------------------------------------------------------

    def hold(self, bid: str, data: bytes) -> None:
        """Keep signed batch bytes to serve; the least recently added go first (bounded in count and bytes)."""
        previous = self.held.pop(bid, None)
        self.held_bytes -= len(previous) if previous is not None else 0
        self.held[bid] = data
        self.held_bytes += len(data)
        while len(self.held) > self.settings.max_held_batches or self.held_bytes > self.settings.max_held_bytes:
            _, dropped = self.held.popitem(last=False)
            self.held_bytes -= len(dropped)

    def enqueue_publish(self, item: PublishItem) -> None:
        """Called on the loop (via ``call_soon_threadsafe``): hold the batch and queue its manifest."""
        self.hold(item.batch_id, item.data)
        while self.publish_queue.qsize() >= self.settings.max_publish_queue:
            self.publish_queue.get_nowait()
            self.shared.add("publish_dropped")
        self.publish_queue.put_nowait(item)

    async def _publish_loop(self) -> None:
        while True:
            item = await self.publish_queue.get()
            started = time.monotonic()
            # Behind NAT the batch goes to its holders first, so it can be pulled once announced. A batch no
            # holder took is not announced: pullers would find it nowhere and count its author unreachable.
            held = await self._hand_off(item) if item.holders else 0
            stored = time.monotonic()
            ok = await self._store_manifest(item) if held or not item.holders else False
            self.shared.add("batches_published" if ok else "publish_failed")
            self.shared.note_publish_seconds(time.monotonic() - started, _PUBLISH_EWMA)
            self.shared.trace.event("pub", id=item.batch_id[:16], created=round(item.created_at, 4),
                                    bytes=len(item.data), ok=bool(ok), handoffs=held,
                                    handoff_s=round(stored - started, 4), store_s=round(time.monotonic() - stored, 4))

    async def _store_manifest(self, item: PublishItem) -> bool:
        """Store ``item``'s manifest in the DHT, trying again after a failure, within ``publish_timeout``.

        A node in client mode is asked by nobody, so its own storage does not count: hivemind would store
        there too and call the store a success when no server took it (a slow or lost reply under load), and
        the batch would be announced to no one. One failed store is not the end either: a server's reply can
        be late once, and a batch whose manifest is lost is lost to the swarm.
        """
        deadline = time.monotonic() + self.settings.publish_timeout
        delay = _STORE_RETRY_SECONDS
        while True:
            left = deadline - time.monotonic()
            try:
                ok = await asyncio.wait_for(
                    self.dht.store(item.key, item.manifest_data, item.expires_at, subkey=item.subkey,
                                   exclude_self=self.settings.client_mode),
                    left,
                )
            except _NETWORK_ERRORS as exc:
                ok = False
                logger.debug("storing manifest of %s failed: %r", item.batch_id[:12], exc)
            if ok:
                return True
            if deadline - time.monotonic() < delay:
                return False
            self.shared.add("store_retries")
            await asyncio.sleep(delay)
            delay *= 2

    async def _hand_off(self, item: PublishItem) -> int:
        """Push ``item`` to ``handoff_copies`` of its listed holders at once (the spare replaces one that
        refuses or fails). Returns as soon as one holds it (1), so the manifest can go out, or when all
        failed (0); the other copies go on in the background. On a lossy link each TCP connection is
        slow on its own, so copies in parallel take about as long as one."""
        first = asyncio.Event()
        task = asyncio.create_task(self._copy_to_holders(item, first))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        await first.wait()
        return 1 if task.done() is False or task.result() > 0 else 0

    async def _copy_to_holders(self, item: PublishItem, first: asyncio.Event) -> int:
        """Hand ``item`` to its holders, ``handoff_copies`` at a time; ``first`` is set once one holds it
        (or none can). Returns how many hold it."""
        waiting = [parsed for parsed in map(_parse_peer_maddr, item.holders) if parsed is not None]
        running: set[asyncio.Task[bool]] = set()
        held = 0
        try:
            while waiting or running:
                while waiting and held + len(running) < self.settings.handoff_copies:
                    running.add(asyncio.create_task(self._put_one(*waiting.pop(0), item)))
                if not running:
                    break
                done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                held += sum(1 for task in done if task.result())
                if held:
                    first.set()
        finally:
            for task in running:
                task.cancel()
            first.set()
        self.shared.add("handoffs_sent", held)
        if held == 0:
            self.shared.add("handoff_failed")
        return held

    async def _put_one(self, peer_id: PeerID, addr: Multiaddr, item: PublishItem) -> bool:
        """Dial one holder and hand ``item`` over; whether it holds it now."""
        if not await self._dial(peer_id, [addr]):
            return False
        status = await self._put_to(peer_id, item)
        if status not in (HandoffStatus.OK, HandoffStatus.HAVE):
            logger.debug("holder %s refused %s: %s", peer_id, item.batch_id[:12], status)
            return False
        return True

    async def _put_to(self, peer_id: PeerID, item: PublishItem) -> int | None:
        """One hand-off (see ``swarm.handoff`` for the exchange): the holder's status, or None."""
        timeout = self.settings.request_timeout
        try:
            _, reader, writer = await asyncio.wait_for(
                self.p2p.call_binary_stream_handler(peer_id, self._put_handler), timeout
            )
        except _NETWORK_ERRORS as exc:
            logger.debug("could not open a hand-off stream to %s: %r", peer_id, exc)
            return None
        try:
            writer.write(item.batch_id.encode("ascii") + len(item.data).to_bytes(_LEN_BYTES, "big"))
            await asyncio.wait_for(writer.drain(), timeout)
            status = int((await asyncio.wait_for(reader.readexactly(1), timeout))[0])
            if status != HandoffStatus.GO:
                return status
            # The holder reads at its pace (``_read_paced``), then verifies: allow the transfer's time.
            transfer = self.transfer_seconds(len(item.data)) + timeout
            writer.write(item.data)
            await asyncio.wait_for(writer.drain(), transfer)
            return int((await asyncio.wait_for(reader.readexactly(1), transfer))[0])
        except _NETWORK_ERRORS as exc:
            logger.debug("hand-off of %s to %s failed: %r", item.batch_id[:12], peer_id, exc)
            return None
        finally:
            writer.close()

    async def rpc_put_batch(
        self, info: StreamInfo, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Take a batch handed over by a peer behind NAT: hold and serve it if valid and within quotas."""
        timeout = self.settings.request_timeout
        reserved = False
        try:
            header = await asyncio.wait_for(reader.readexactly(_ID_BYTES + _LEN_BYTES), timeout)
            bid = header[:_ID_BYTES].decode("ascii", errors="replace")
            size = int.from_bytes(header[_ID_BYTES:], "big")
            status = self.handoffs.precheck(bid, size, self.limits.max_compressed_bytes)
            if status == HandoffStatus.GO and self._handoffs_in_flight >= _MAX_HANDOFFS_IN_FLIGHT:
                status = self.handoffs.refuse(HandoffStatus.BUSY)
            if status == HandoffStatus.GO:
                self._handoffs_in_flight += 1
                reserved = True
            self._count_handoff(status)
            writer.write(bytes([status]))
            await asyncio.wait_for(writer.drain(), timeout)
            if status != HandoffStatus.GO:
                return
            data = await self._read_paced(reader, size, asyncio.get_running_loop().time())
            status = await self._take_handoff(bid, data)
            self._count_handoff(status)
            writer.write(bytes([status]))
            await asyncio.wait_for(writer.drain(), timeout)
        except _NETWORK_ERRORS as exc:
            logger.debug("receiving a hand-off from %s failed: %r", info.peer_id, exc)
        finally:
            if reserved:
                self._handoffs_in_flight -= 1
            writer.close()

    async def _take_handoff(self, bid: str, data: bytes) -> int:
        """Verify a handed-over batch (hash, expanded size, signature, swarm, ban list); store it within quotas."""
        if batch_id(data) != bid:
            return self.handoffs.refuse(HandoffStatus.INVALID)
        try:  # the expanded size, from the frame header, is checked before anything is decoded
            payload = batch_payload_size(data)
        except ProtocolError:
            return self.handoffs.refuse(HandoffStatus.INVALID)
        if payload > min(self.settings.max_batch_payload_bytes, self.limits.max_decompressed_bytes):
            return self.handoffs.refuse(HandoffStatus.TOO_LARGE)
        loop = asyncio.get_running_loop()
        async with self._decode_slot:  # shares the one decode slot with pulls: bounded memory
            try:
                batch = await loop.run_in_executor(None, decode_batch, data, self.limits)
            except ProtocolError:
                return self.handoffs.refuse(HandoffStatus.INVALID)
        author = peer_id_from_public_key(batch.author)
        with self.shared.lock:
            banned = self.shared.peer_book.is_banned(author, time.monotonic())
        if batch.swarm_id != self.settings.swarm_id or banned:
            return self.handoffs.refuse(HandoffStatus.INVALID)
        current = epoch_at(get_dht_time(), self.settings.epoch_seconds)
        return self.handoffs.add(bid, data, author, batch.epoch, current)

    def _count_handoff(self, status: int) -> None:
        if status == HandoffStatus.OK:
            self.shared.add("handoffs_held")
        elif status not in (HandoffStatus.GO, HandoffStatus.HAVE):
            self.shared.add("handoffs_refused")


    # -- collect ------------------------------------------------------------------------------------

    async def _collect_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.collect_interval)
            await self.poll_once()

    async def poll_once(self) -> None:
        """Read the recent manifest keys once and start pulls for new, admissible batches.

        Every entry read is re-validated here: hivemind validates what peers send, not what it reads
        from its own storage.
        """
        started = time.monotonic()
        current = epoch_at(get_dht_time(), self.settings.epoch_seconds)
        where = {
            manifest_key(self.settings.swarm_id, epoch, shard): (epoch, shard)
            for epoch in epochs_to_read(current, self.settings.read_epochs)
            for shard in shards_to_read(self.identity.peer_id, epoch, self.settings.key_shards,
                                        self.settings.read_shards)
        }
        found = await self._lookup(list(where))
        with self.shared.lock:
            self.shared.counters["polls"] += 1
            self.shared.counters["poll_ms"] += int(1000 * (time.monotonic() - started))
        for key, result in found.items():
            if result is None or not isinstance(result.value, dict):
                continue
            epoch, shard = where[key]
            for subkey, entry in result.value.items():
                self._consider(epoch, shard, subkey, entry.value, entry.expiration_time, current)

    async def _lookup(self, keys: list[str]) -> dict[str, Any]:
        """Look every key up on its own: one whose lookup fails or hangs costs only itself (bounded)."""
        timeout = self.settings.request_timeout
        try:
            futures = await asyncio.wait_for(
                self.dht.get_many(keys, sufficient_expiration_time=float("inf"), return_futures=True), timeout
            )
        except _NETWORK_ERRORS as exc:
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

    def _consider(self, epoch: int, shard: int, subkey: object, value: object, expiration: float,
                  current: int) -> None:
        """Check an entry read from the DHT once, and screen (and pull) the batch it announces."""
        if not isinstance(value, bytes):
            token = (epoch, shard, repr(subkey)[:128], repr(expiration))  # counted once, not every poll
            if token not in self._bad_entries:
                self._bad_entries[token] = epoch
                self.validator.read_entry(epoch, shard, subkey, value, expiration)
            return
        if value in self._seen_manifests:
            return
        manifest = self._deferred.pop(value, None) or self.validator.read_entry(
            epoch, shard, subkey, value, expiration
        )
        if manifest is None or manifest.author == self.identity.public_key:
            self._seen_manifests[value] = (current, "")
        elif self._screen_and_pull(manifest, current):
            self._seen_manifests[value] = (current, manifest.batch_id)
        else:
            self._deferred[value] = manifest  # asked again at the next poll, without decoding it again

    def _screen_and_pull(self, manifest: Manifest, current: int) -> bool:
        """Screen an announced batch and start its pull; False if it must be asked about again later.

        A batch id is known only once bytes hashing to it were accepted. While another manifest naming
        the same id is being pulled, or no pull slot is free for this author, the decision waits.
        """
        author = peer_id_from_public_key(manifest.author)
        book = self.shared.peer_book
        with self.shared.lock:
            now = time.monotonic()
            if not book.is_known(manifest.batch_id) and not book.in_flight(manifest.batch_id):
                book.note_addresses(author, _libp2p_ids(manifest.address), now)
            newcomer = not book.is_established(author)
            reason = screen(book, manifest, self.limits, current_epoch=current, now=now,
                            may_start=self._slot_free)
        if reason == DEFER:
            return False
        if reason is not None:
            if reason != KNOWN:
                logger.debug("skipped batch %s of %s: %s", manifest.batch_id[:12], author[:12], reason)
            return True
        self._running_pulls[author] += 1
        if newcomer:
            self._newcomer_pulls += 1
        task = asyncio.create_task(self._pull(manifest, author, newcomer))
        self._pulls.add(task)
        task.add_done_callback(self._pulls.discard)
        return True

    def _slot_free(self, author: str, newcomer: bool) -> bool:
        """Whether a pull for ``author`` may start: a bounded number per author and for newcomers."""
        total = self.settings.max_concurrent_pulls
        if sum(self._running_pulls.values()) >= total:
            return False
        if newcomer and self._newcomer_pulls >= max(1, int(total * self.settings.newcomer_share)):
            return False
        return self._running_pulls[author] < self.settings.max_pulls_per_author

    async def _pull(self, manifest: Manifest, author: str, newcomer: bool) -> None:
        try:
            await self._pull_and_verify(manifest, author)
        finally:
            self._running_pulls[author] -= 1
            if self._running_pulls[author] <= 0:
                del self._running_pulls[author]
            if newcomer:
                self._newcomer_pulls -= 1

    async def _pull_and_verify(self, manifest: Manifest, author: str) -> None:
        started = time.monotonic()
        for attempt in range(2):
            progress = _PullProgress()
            data, from_author = await self._bounded_fetch(manifest, progress)
            if data is not None or not progress.stalled:
                break
            if not await self._reachable(manifest, progress.peer):
                # A fresh connection cannot even be made: a partition, a crash or a frozen process, not a
                # stall aimed at us. Banning it would keep its batches out long after the network heals.
                progress.stalled = False
                self.shared.add("pulls_unreachable")
                break
            if attempt == 0:
                # The stream may have died with its connection: after a partition heals, a TCP connection
                # opened before it can sit in retransmission back-off for seconds. So the pull is tried
                # once more over the fresh connection; a peer that stalls that one too does it on purpose.
                self.shared.add("stalls_retried")
        book = self.shared.peer_book
        if data is None:
            with self.shared.lock:
                retry = book.pull_failed(author, manifest.batch_id, manifest.epoch, manifest.byte_size,
                                         stalled=progress.stalled, now=time.monotonic())
            self.shared.add("pulls_stalled" if progress.stalled else "pulls_failed")
            self.shared.trace.event("fail", author=author[:16], id=manifest.batch_id[:16], stalled=progress.stalled,
                                    retry=retry, why=progress.error, pull_s=round(time.monotonic() - started, 4))
            logger.debug("pull of %s from %s failed (stalled: %s, retry: %s)", manifest.batch_id[:12],
                         author[:12], progress.stalled, retry)
            if retry:
                self._forget_manifest(manifest)
            return
        pulled = time.monotonic() - started
        reason, offence, groups = await self._verify(manifest, author, data, from_author)
        self.shared.trace.event(
            "acc" if reason is None else "rej", author=author[:16], id=manifest.batch_id[:16], seq=manifest.seq,
            epoch=manifest.epoch, created=round(manifest.created_at, 4), bytes=len(data), pull_s=round(pulled, 4),
            src=progress.source, **({} if reason is None else {"reason": reason, "offence": offence}))
        with self.shared.lock:
            self.shared.counters["bytes_in"] += len(data)  # pulled, whatever the checks say of it
            book.received(author, len(data), time.monotonic())
            settle(book, manifest, len(data), reason, offence=offence, now=time.monotonic(), groups=groups)
        if reason is not None:
            logger.debug("rejected batch %s of %s: %s", manifest.batch_id[:12], author[:12], reason)

    async def _bounded_fetch(self, manifest: Manifest, progress: _PullProgress) -> tuple[bytes | None, bool]:
        """``_fetch`` within one bound on the whole pull (every source), however the peers pace their bytes:
        the time one transfer of the announced size may take (``transfer_seconds``) and ``pull_timeout``
        more for dialing the sources."""
        bound = self.transfer_seconds(min(manifest.byte_size, self.limits.max_compressed_bytes)) + self.settings.pull_timeout
        try:
            return await asyncio.wait_for(self._fetch(manifest, progress), bound)
        except asyncio.TimeoutError:
            progress.stalled = progress.stalled or progress.reading_author
            progress.error = "bound"
            return None, False

    def _forget_manifest(self, manifest: Manifest) -> None:
        """Let the next poll see this manifest again (a pull to retry)."""
        stale = [raw for raw, (_, bid) in self._seen_manifests.items() if bid == manifest.batch_id]
        for raw in stale:
            del self._seen_manifests[raw]

    async def _verify(
        self, manifest: Manifest, author: str, data: bytes, from_author: bool
    ) -> tuple[str | None, bool, int]:
        """``(None, False, groups queued)`` if ``data`` is the batch ``manifest`` announced (then it is held
        and queued), else ``(reason, whether it is an offence of the manifest's author, 0)``.

        The steps are ``swarm.intake``'s (``verify_now`` composes the same ones without an event loop);
        here decoding runs in the executor, one batch at a time.
        """
        reason, offence, payload = check_bytes(manifest, data, self.settings, self.limits, from_author=from_author)
        if reason is None:
            with self.shared.lock:
                reason = self.shared.peer_book.charge_payload(author, manifest.epoch, payload)
        if reason is not None:
            return reason, offence, 0
        loop = asyncio.get_running_loop()
        async with self._decode_slot:  # one decode at a time: bounded memory, and the GIL allows no more
            try:
                batch, digests = await loop.run_in_executor(None, decode_with_digests, data, self.limits)
            except ProtocolError as exc:
                return exc.reason, True, 0
        reason = check_decoded(manifest, batch, swarm_id=self.settings.swarm_id)
        if reason is not None:
            return reason, True, 0
        fresh, dropped = fresh_groups(batch, digests, self._digests, manifest.epoch)
        if fresh is None:
            return RejectReason.DUPLICATE_CONTENT, False, 0
        if dropped:
            self.shared.add("duplicate_groups", dropped)
        self.hold(manifest.batch_id, data)
        self.shared.push_batch(fresh, decoded_cost(payload))
        return None, False, len(fresh.groups)

    def _local(self, bid: str) -> bytes | None:
        """A batch this node already holds (collected before, or handed over to it), else None."""
        data = self.held.get(bid)
        return data if data is not None else self.handoffs.get(bid)

    async def _fetch(self, manifest: Manifest, progress: _PullProgress) -> tuple[bytes | None, bool]:
        """A batch's bytes: held here already, else pulled from the peers its signed address list names
        (the author, or the holders it handed the batch to: its delegates), else from a few DHT neighbours.

        Returns ``(data or None, whether it came from a listed address or from here)``.
        """
        local = self._local(manifest.batch_id)
        if local is not None:
            progress.source = "local"
            return local, True
        limit = min(manifest.byte_size, self.limits.max_compressed_bytes)
        listed = _by_peer(manifest.address)
        for peer_id, addrs in list(listed.items())[:_MAX_PULL_SOURCES]:
            if not await self._dial(peer_id, addrs):
                progress.error = "dial"
                continue
            data = await self._fetch_from(peer_id, manifest.batch_id, limit, progress, author=True)
            if data is not None:
                progress.source = "listed"
                return data, True
            if progress.stalled:
                return None, False
        others = [p for p in dht_neighbours(self.dht) if p not in listed]
        for peer_id in random.sample(others, min(2, len(others))):
            data = await self._fetch_from(peer_id, manifest.batch_id, limit, progress, author=False)
            if data is not None:
                progress.source = "neighbour"
                return data, False
        return None, False

    async def _fetch_from(
        self, peer_id: PeerID, bid: str, limit: int, progress: _PullProgress, *, author: bool
    ) -> bytes | None:
        timeout = self.settings.request_timeout
        started = asyncio.get_running_loop().time()
        try:
            _, reader, writer = await asyncio.wait_for(
                self.p2p.call_binary_stream_handler(peer_id, self._handler), timeout
            )
        except _NETWORK_ERRORS as exc:
            logger.debug("could not open a stream to %s: %r", peer_id, exc)
            progress.error = "open"
            return None
        progress.reading_author = author
        if author:
            progress.peer = peer_id
        try:
            writer.write(bid.encode("ascii"))
            await asyncio.wait_for(writer.drain(), timeout)
            size = int.from_bytes(await asyncio.wait_for(reader.readexactly(_LEN_BYTES), timeout), "big")
            if size == 0:
                progress.error = "not_held"
                return None
            size = min(size, limit + 1)  # more than announced is read just far enough to be rejected
            return await self._read_paced(reader, size, started)
        except _NETWORK_ERRORS as exc:
            # The author's address took the stream and then did not deliver: a stall, whatever the cause.
            progress.stalled = progress.stalled or author
            progress.error = "pace" if "transfer below" in str(exc) else "read"
            logger.debug("pull of %s from %s failed: %r", bid[:12], peer_id, exc)
            return None
        finally:
            progress.reading_author = False
            writer.close()

    async def _reachable(self, manifest: Manifest, peer_id: PeerID | None) -> bool:
        """After a stalled pull: whether ``peer_id`` can still be reached over a fresh connection.

        The old connection is dropped and the peer dialed again at its listed addresses. A peer that
        takes a new connection and then stalled our stream did it on purpose; one that cannot be dialed
        any more is on the other side of a partition, crashed or frozen (its stall is no offence).
        """
        if peer_id is None:
            return True
        with contextlib.suppress(*_NETWORK_ERRORS):
            await asyncio.wait_for(disconnect(self.p2p, peer_id), self.settings.request_timeout)
        return await self._dial(peer_id, _by_peer(manifest.address).get(peer_id, []))

    async def rpc_get_batch(
        self, info: StreamInfo, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Serve one batch by id: read 64 hex chars, answer a length prefix and the signed bytes."""
        timeout = self.settings.request_timeout
        try:
            raw = await asyncio.wait_for(reader.readexactly(_ID_BYTES), timeout)
            data = self._local(raw.decode("ascii", errors="replace")) or b""
            writer.write(len(data).to_bytes(_LEN_BYTES, "big"))
            writer.write(data)
            await asyncio.wait_for(writer.drain(), self.transfer_seconds(len(data)) if data else timeout)
            if data:
                with self.shared.lock:
                    self.shared.counters["bytes_out"] += len(data)
                    self.shared.counters["batches_served"] += 1
                    self.shared.peer_book.served(info.peer_id.to_base58(), len(data), time.monotonic())
        except _NETWORK_ERRORS as exc:
            self.shared.add("serve_failed")
            logger.debug("serving a batch failed: %r", exc)
        finally:
            writer.close()

    # -- health -------------------------------------------------------------------------------------

    async def _health_loop(self) -> None:
        last_epoch = -1
        tick = 0
        while True:
            await asyncio.sleep(_HEALTH_PERIOD)
            if p2pd_exited(self.p2p):
                raise _NetworkDiedError("p2pd exited")
            tick += 1
            if tick % _MADDR_REFRESH_TICKS == 0:
                await self._refresh_maddrs()
            current = epoch_at(get_dht_time(), self.settings.epoch_seconds)
            if current != last_epoch:
                last_epoch = current
                oldest = current - self.settings.read_epochs
                self._seen_manifests = {m: v for m, v in self._seen_manifests.items() if v[0] >= oldest}
                self._deferred = {m: v for m, v in self._deferred.items() if v.epoch >= oldest}
                self._bad_entries = {k: e for k, e in self._bad_entries.items() if e >= oldest}
                self._digests = {d: e for d, e in self._digests.items() if e >= oldest}
                self.handoffs.prune(current)
                with self.shared.lock:
                    self.shared.peer_book.prune(current, time.monotonic())

    async def _refresh_maddrs(self) -> None:
        """Ask p2pd for this node's addresses again (a relay reservation adds a circuit address)."""
        try:
            found = await asyncio.wait_for(self.p2p.get_visible_maddrs(latest=True), self.settings.request_timeout)
        except (*_NETWORK_ERRORS, ValueError) as exc:
            logger.debug("refreshing visible addresses failed: %r", exc)
            return
        maddrs = _order_maddrs([str(m) for m in found], self._relayed)
        with self.shared.lock:
            self.shared.visible_maddrs = maddrs


async def _cancel_all(tasks: list[asyncio.Task[Any]], timeout: float) -> None:
    """Cancel ``tasks`` and wait for them, cancelling again those still running every short while.

    One cancellation is not always enough on Python 3.11: ``asyncio.wait_for`` drops it when its inner
    awaitable finishes at the same moment, and a loop that goes on after that would keep the network
    thread (and its p2pd) alive until it is killed. Bounded by ``timeout``; what is left then is named.
    """
    pending = {task for task in tasks if not task.done()}
    deadline = time.monotonic() + timeout
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=_CANCEL_AGAIN_SECONDS)
        if pending and time.monotonic() > deadline:
            logger.warning("network tasks still running after cancellation: %s",
                           ", ".join(sorted(task.get_name() for task in pending)))
            return
    for task in tasks:  # retrieve their exceptions (they were logged where they matter)
        if not task.cancelled():
            task.exception()


async def _shutdown_p2p(p2p: P2P, watchdog: P2pdWatchdog | None, *, timeout: float) -> None:
    child = p2pd_process(p2p)
    with contextlib.suppress(*_NETWORK_ERRORS):
        await asyncio.wait_for(p2p.shutdown(), timeout)
    if child is not None and child.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            child.kill()
        with contextlib.suppress(*_NETWORK_ERRORS):
            await asyncio.wait_for(child.wait(), timeout)
    if watchdog is not None:
        watchdog.stop()
