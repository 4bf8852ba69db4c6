"""``SwarmCore``: the async side of one node, living in the network thread's event loop.

It owns one p2pd (hivemind ``P2P``), one ``DHTNode`` on top of it, the ``rpc_get_batch`` handler that
serves signed batches by id, and four background loops:

* join: dial the initial peers until the DHT has a neighbour, retrying with exponential backoff; and
  again whenever every neighbour is gone;
* publish: store queued manifests in the DHT (each store bounded by ``publish_timeout``);
* collect: poll the manifest keys of the recent epochs, screen new manifests with the peer book, pull
  the batches from their authors, verify them (size, hash, signature, manifest match) and queue them;
  the screening and verification steps are ``swarm.intake``'s, shared with the in-process hub;
* health: watch p2pd, refresh the peer list, prune old state.

Every network await is bounded by a timeout. CPU-heavy decoding runs in the default executor, not on
the loop. Peer input that fails a check is counted in the peer book and logged at debug level.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import OrderedDict
from dataclasses import dataclass
from functools import partial

from hivemind.dht.node import DHTNode
from hivemind.p2p import P2P, PeerID
from hivemind.p2p.p2p_daemon_bindings.datastructures import StreamInfo
from hivemind.p2p.p2p_daemon_bindings.utils import ControlFailure, P2PDaemonError
from hivemind.utils import get_dht_time
from hivemind.utils.multiaddr import Multiaddr

from protocol.identity import Identity, peer_id_from_public_key
from protocol.limits import Limits
from protocol.records import Manifest
from swarm.hivemind_compat import dht_neighbours, dial, p2pd_exited, p2pd_pid, p2pd_process
from swarm.intake import KNOWN, read_manifest, screen, settle, verify_batch
from swarm.keys import KEY_SHARDS, epoch_at, epochs_to_read, manifest_key
from swarm.settings import SwarmSettings
from swarm.state import SharedState
from swarm.validator import ManifestValidator
from swarm.watchdog import P2pdWatchdog

__all__ = ["PublishItem", "SwarmCore", "handler_name"]

logger = logging.getLogger(__name__)

_ID_BYTES = 64  # a batch id on the wire: 64 ASCII hex chars
_LEN_BYTES = 8  # big-endian length prefix of a served batch; 0 means "not held here"
_HEALTH_PERIOD = 1.0
_NETWORK_ERRORS = (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ControlFailure, P2PDaemonError)


def handler_name(swarm_id: str) -> str:
    """The libp2p protocol name of a swarm's batch handler."""
    return f"/swarm-node/{swarm_id}/get_batch/1"


@dataclass(frozen=True)
class PublishItem:
    """A batch ready to go out: signed bytes, signed manifest bytes and where the manifest goes."""

    batch_id: str
    data: bytes
    manifest_data: bytes
    key: str
    subkey: str
    expires_at: float


class _NetworkDiedError(Exception):
    """p2pd exited under us; the core stops so the facade can restart it."""


def _parse_peer_maddr(maddr: str) -> tuple[PeerID, Multiaddr] | None:
    """``(peer id, address without /p2p)`` of a full multiaddr, or None if it does not parse."""
    try:
        full = Multiaddr(maddr)
        peer_id = PeerID.from_base58(full["p2p"])
        return peer_id, full.decapsulate(Multiaddr(f"/p2p/{full['p2p']}"))
    except (ValueError, LookupError, TypeError):
        return None


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
        self.publish_queue: asyncio.Queue[PublishItem] = asyncio.Queue()
        self._seen_manifests: dict[bytes, tuple[int, str]] = {}  # raw manifest -> (epoch seen, batch id)
        self._pulls: set[asyncio.Task[None]] = set()
        self._pull_slots = asyncio.Semaphore(settings.max_concurrent_pulls)
        self._handler = handler_name(settings.swarm_id)

    @classmethod
    async def create(
        cls,
        settings: SwarmSettings,
        identity: Identity,
        limits: Limits,
        shared: SharedState,
        validator: ManifestValidator,
    ) -> SwarmCore:
        """Start p2pd (with an orphan watchdog) and a DHT node; joining peers happens in ``run``."""
        p2p = await P2P.create(
            host_maddrs=settings.host_maddrs,
            announce_maddrs=settings.announce_maddrs or None,
            dht_mode="client" if settings.client_mode else "server",
            startup_timeout=settings.startup_timeout,
            identity_path=settings.p2p_identity_path,
            check_if_identity_free=False,
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
            )
            self = cls(settings, identity, limits, shared, validator, p2p, dht, watchdog)
            await p2p.add_binary_stream_handler(self._handler, self.rpc_get_batch)
            maddrs = [str(m) for m in await p2p.get_visible_maddrs()]
            started = True
        finally:
            if not started:
                await _shutdown_p2p(p2p, watchdog, timeout=settings.request_timeout)
        with shared.lock:
            shared.visible_maddrs = maddrs
        logger.info("swarm network up; others can join with: %s", " ".join(maddrs))
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
                if task is not stopper and not task.cancelled() and task.exception() is not None:
                    exc = task.exception()
                    logger.error("swarm network loop %s failed: %r", task.get_name(), exc)
                    with self.shared.lock:
                        self.shared.last_error = repr(exc)
        finally:
            for task in [*loops, stopper, *self._pulls]:
                task.cancel()
            await asyncio.gather(*loops, stopper, *self._pulls, return_exceptions=True)

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
        while True:
            neighbours = self._neighbours()
            if neighbours or not self.settings.initial_peers:
                self.shared.set_network(up=True, dht_peers=neighbours)
                delay, warned = self.settings.join_retry_seconds, False
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

    async def _dial(self, peer_id: PeerID, addr: Multiaddr) -> bool:
        try:
            await asyncio.wait_for(dial(self.p2p, peer_id, [addr]), self.settings.request_timeout)
        except _NETWORK_ERRORS as exc:
            logger.debug("could not dial %s at %s: %r", peer_id, addr, exc)
            return False
        return True

    async def _dial_and_ping(self, peer_id: PeerID, addr: Multiaddr) -> bool:
        if not await self._dial(peer_id, addr):
            return False
        return await self.dht.protocol.call_ping(peer_id) is not None

    # -- publish ------------------------------------------------------------------------------------

    def hold(self, bid: str, data: bytes) -> None:
        """Keep signed batch bytes to serve; the least recently added go first."""
        self.held[bid] = data
        self.held.move_to_end(bid)
        while len(self.held) > self.settings.max_held_batches:
            self.held.popitem(last=False)

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
            try:
                ok = await asyncio.wait_for(
                    self.dht.store(item.key, item.manifest_data, item.expires_at, subkey=item.subkey),
                    self.settings.publish_timeout,
                )
            except _NETWORK_ERRORS as exc:
                logger.debug("storing manifest of %s failed: %r", item.batch_id[:12], exc)
                ok = False
            self.shared.add("batches_published" if ok else "publish_failed")

    # -- collect ------------------------------------------------------------------------------------

    async def _collect_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.collect_interval)
            await self.poll_once()

    async def poll_once(self) -> None:
        """Read the recent manifest keys once and start pulls for new, admissible batches."""
        current = epoch_at(get_dht_time(), self.settings.epoch_seconds)
        keys = [
            manifest_key(self.settings.swarm_id, epoch, shard)
            for epoch in epochs_to_read(current, self.settings.read_epochs)
            for shard in range(KEY_SHARDS)
        ]
        try:
            found = await asyncio.wait_for(
                self.dht.get_many(keys, sufficient_expiration_time=float("inf")),
                self.settings.request_timeout,
            )
        except _NETWORK_ERRORS as exc:
            logger.debug("reading manifests failed: %r", exc)
            return
        for result in found.values():
            if result is None or not hasattr(result.value, "items"):
                continue
            for _subkey, entry in result.value.items():
                manifest = self._new_manifest(entry.value, current)
                if manifest is not None:
                    self._screen_and_pull(manifest, current)

    def _new_manifest(self, value: object, current: int) -> Manifest | None:
        """Decode a manifest not seen before (already-seen bytes are skipped without decoding)."""
        if not isinstance(value, bytes) or value in self._seen_manifests:
            return None
        with self.shared.lock:  # bad bytes are counted in the peer book
            manifest = read_manifest(self.shared.peer_book, value, self.limits,
                                     own_key=self.identity.public_key, swarm_id=self.settings.swarm_id)
        self._seen_manifests[value] = (current, manifest.batch_id if manifest is not None else "")
        return manifest

    def _screen_and_pull(self, manifest: Manifest, current: int) -> None:
        author = peer_id_from_public_key(manifest.author)
        with self.shared.lock:
            reason = screen(self.shared.peer_book, manifest, self.limits, current_epoch=current,
                            now=time.monotonic())
        if reason is not None:
            if reason != KNOWN:
                logger.debug("skipped batch %s of %s: %s", manifest.batch_id[:12], author[:12], reason)
            return
        task = asyncio.create_task(self._pull(manifest, author))
        self._pulls.add(task)
        task.add_done_callback(self._pulls.discard)

    async def _pull(self, manifest: Manifest, author: str) -> None:
        async with self._pull_slots:
            data, from_author = await self._fetch(manifest)
        book = self.shared.peer_book
        if data is None:
            with self.shared.lock:
                retry = book.pull_failed(author, manifest.batch_id, manifest.epoch, manifest.byte_size)
            logger.debug("pull of %s from %s failed (retry: %s)", manifest.batch_id[:12], author[:12], retry)
            if retry:
                self._forget_manifest(manifest)
            return
        reason = await self._verify(manifest, data)
        with self.shared.lock:
            if reason is None:
                self.shared.counters["bytes_in"] += len(data)
            settle(book, manifest, len(data), reason, offence=from_author, now=time.monotonic())
        if reason is not None:
            logger.debug("rejected batch %s of %s: %s", manifest.batch_id[:12], author[:12], reason)

    def _forget_manifest(self, manifest: Manifest) -> None:
        """Let the next poll see this manifest again (a pull to retry)."""
        stale = [raw for raw, (_, bid) in self._seen_manifests.items() if bid == manifest.batch_id]
        for raw in stale:
            del self._seen_manifests[raw]

    async def _verify(self, manifest: Manifest, data: bytes) -> str | None:
        """None if ``data`` is the batch ``manifest`` announced (then it is held and queued), else why not."""
        loop = asyncio.get_running_loop()
        batch, reason = await loop.run_in_executor(
            None, partial(verify_batch, manifest, data, self.limits, swarm_id=self.settings.swarm_id)
        )
        if batch is None:
            return reason
        self.hold(manifest.batch_id, data)
        self.shared.push_batch(batch)
        return None

    async def _fetch(self, manifest: Manifest) -> tuple[bytes | None, bool]:
        """Pull a batch's bytes from its author's addresses, else from a few DHT neighbours.

        Returns ``(data or None, whether it came from the author's address)``.
        """
        limit = min(manifest.byte_size, self.limits.max_compressed_bytes)
        author_peers = [p for p in map(_parse_peer_maddr, manifest.address) if p is not None]
        for peer_id, addr in author_peers[:4]:
            if await self._dial(peer_id, addr):
                data = await self._fetch_from(peer_id, manifest.batch_id, limit)
                if data is not None:
                    return data, True
        others = [p for p in dht_neighbours(self.dht) if p not in dict(author_peers)]
        for peer_id in random.sample(others, min(2, len(others))):
            data = await self._fetch_from(peer_id, manifest.batch_id, limit)
            if data is not None:
                return data, False
        return None, False

    async def _fetch_from(self, peer_id: PeerID, bid: str, limit: int) -> bytes | None:
        timeout = self.settings.request_timeout
        try:
            _, reader, writer = await asyncio.wait_for(
                self.p2p.call_binary_stream_handler(peer_id, self._handler), timeout
            )
        except _NETWORK_ERRORS as exc:
            logger.debug("could not open a stream to %s: %r", peer_id, exc)
            return None
        try:
            writer.write(bid.encode("ascii"))
            await asyncio.wait_for(writer.drain(), timeout)
            size = int.from_bytes(await asyncio.wait_for(reader.readexactly(_LEN_BYTES), timeout), "big")
            if size == 0:
                return None
            size = min(size, limit + 1)  # more than announced is read just far enough to be rejected
            return await asyncio.wait_for(reader.readexactly(size), timeout)
        except _NETWORK_ERRORS as exc:
            logger.debug("pull of %s from %s failed: %r", bid[:12], peer_id, exc)
            return None
        finally:
            writer.close()

    async def rpc_get_batch(
        self, _info: StreamInfo, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Serve one batch by id: read 64 hex chars, answer a length prefix and the signed bytes."""
        timeout = self.settings.request_timeout
        try:
            raw = await asyncio.wait_for(reader.readexactly(_ID_BYTES), timeout)
            data = self.held.get(raw.decode("ascii", errors="replace"), b"")
            writer.write(len(data).to_bytes(_LEN_BYTES, "big"))
            writer.write(data)
            await asyncio.wait_for(writer.drain(), timeout)
            if data:
                self.shared.add("bytes_out", len(data))
                self.shared.add("batches_served")
        except _NETWORK_ERRORS as exc:
            logger.debug("serving a batch failed: %r", exc)
        finally:
            writer.close()

    # -- health -------------------------------------------------------------------------------------

    async def _health_loop(self) -> None:
        last_epoch = -1
        while True:
            await asyncio.sleep(_HEALTH_PERIOD)
            if p2pd_exited(self.p2p):
                raise _NetworkDiedError("p2pd exited")
            current = epoch_at(get_dht_time(), self.settings.epoch_seconds)
            if current != last_epoch:
                last_epoch = current
                oldest = current - self.settings.read_epochs
                self._seen_manifests = {m: v for m, v in self._seen_manifests.items() if v[0] >= oldest}
                with self.shared.lock:
                    self.shared.peer_book.prune(current, time.monotonic())


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
