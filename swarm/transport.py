"""``SwarmTransport``: the synchronous facade the node's training loop talks to.

All network work happens in one daemon thread with its own asyncio loop (``swarm.core.SwarmCore``: one
p2pd and one hivemind ``DHTNode``, no child process and no pipe). Every public method is thread-safe and
returns quickly: ``publish`` signs in the caller's thread and hands the bytes to the loop without
waiting; ``collect`` drains what the loop has already verified. A network that is down, or bootstrap
peers that do not answer, never raise here: the loop keeps retrying in the background and ``stats()``
says so. If the network side dies (p2pd exited), ``is_alive()`` turns False and ``restart()`` brings up a
fresh one; counters, dedup state and bans survive the restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import TypeVar

from hivemind.p2p.p2p_daemon_bindings.utils import P2PDaemonError
from hivemind.utils import get_dht_time

from protocol.codec import encode_batch, encode_manifest, make_manifest
from protocol.errors import ProtocolError
from protocol.identity import Identity
from protocol.limits import DEFAULT_LIMITS, Limits
from protocol.records import RolloutBatch
from swarm.core import PublishItem, SwarmCore, describe_error
from swarm.core.base import libp2p_ids, parse_peer_maddr
from swarm.hivemind_compat import p2pd_pid
from swarm.keys import SLOTS_PER_AUTHOR, epoch_at, manifest_key, manifest_subkey, shard_of
from swarm.members import MemberTable
from swarm.peer_book import PeerRow
from swarm.settings import SwarmSettings
from swarm.state import NetworkStatus, SharedState, initial_peers_note, network_reason
from swarm.validator import ManifestValidator
from swarm.watchdog import kill_process

__all__ = ["SwarmTransport"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")
_START_ERRORS = (P2PDaemonError, OSError, asyncio.TimeoutError, ValueError)
StatValue = int | float | dict[str, int]


class SwarmTransport:
    """One node's connection to a swarm: ``start``, ``publish``, ``collect``, ``stats``, ``close``."""

    def __init__(self, settings: SwarmSettings, identity: Identity, limits: Limits = DEFAULT_LIMITS, *,
                 members: MemberTable | None = None, p2pd_options: Mapping[str, object] | None = None) -> None:
        """``members``: a table to feed with every manifest read and batch handed over (a host's);
        ``p2pd_options``: more flags for p2pd (a host's connection and relay limits)."""
        self.settings = settings
        self.identity = identity
        self.limits = limits
        self._shared = SharedState.from_settings(settings)
        self._shared.members = members
        self._p2pd_options = dict(p2pd_options or {})
        self._initial_ids = set(libp2p_ids(tuple(settings.initial_peers)))
        self._validator = ManifestValidator(
            settings.swarm_id,
            epoch_seconds=settings.epoch_seconds,
            max_ttl=settings.max_manifest_ttl,
            limits=limits,
            max_store_bytes=settings.max_dht_store_bytes,
            max_foreign_bytes=settings.max_foreign_dht_bytes,
            shards=settings.key_shards,
        )
        self._lifecycle = threading.Lock()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._core: SwarmCore | None = None
        # Consecutive batches get consecutive sequence numbers, so they take the author's DHT subkey slots
        # in turn (``swarm.keys``) and a manifest is overwritten only SLOTS_PER_AUTHOR batches later;
        # starting from the clock in milliseconds keeps them increasing across process restarts.
        self._seq = int(time.time() * 1000)

    # -- lifecycle ----------------------------------------------------------------------------------

    def start(self, wait: bool = False) -> None:
        """Start the network thread (idempotent). Never raises because peers are unreachable.

        With ``wait=True``, waits up to ``settings.startup_timeout`` for the network to be up (DHT
        running and, if initial peers are configured, joined); returns either way (see ``stats()``).
        """
        with self._lifecycle:
            if self._thread is not None and self._thread.is_alive():
                return
            ready = threading.Event()
            thread = threading.Thread(
                target=self._thread_main,
                args=(ready,),
                name=f"swarm-net-{self.identity.peer_id[:8]}",
                daemon=True,
            )
            thread.start()
            ready.wait(timeout=10.0)
            self._thread = thread
        if wait and not self.wait_until_up(self.settings.startup_timeout):
            logger.warning(
                "swarm network not up after %.0f s; retrying in the background", self.settings.startup_timeout
            )

    def wait_until_up(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds until the network is up; returns whether it is."""
        return self._shared.up_event.wait(timeout)

    def is_alive(self) -> bool:
        """True while the network thread runs (even if it is still joining)."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    def restart(self) -> None:
        """Stop the network side (if any) and start a fresh one; counters and bans are kept."""
        self._shared.add("restarts")
        self._stop_network()
        self.start()

    def close(self) -> None:
        """Shut the DHT node and p2pd down and stop the thread (bounded; idempotent)."""
        self._stop_network()
        self._shared.trace.close()

    def _stop_network(self) -> None:
        with self._lifecycle:
            thread, loop, stop, core = self._thread, self._loop, self._stop, self._core
            self._thread = None
        if thread is None:
            return
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop already closed: nothing to signal
                loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=3 * self.settings.request_timeout + 10.0)
        if thread.is_alive():
            logger.error("swarm network thread did not stop in time; killing p2pd")
            pid = p2pd_pid(core.p2p) if core is not None else None
            if pid is not None:
                kill_process(pid)
        self._shared.set_network(up=False, dht_peers=[])

    def _thread_main(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        stop = asyncio.Event()
        self._loop, self._stop = loop, stop
        ready.set()
        try:
            loop.run_until_complete(self._network_main(stop))
        except Exception as exc:
            logger.exception("swarm network thread crashed")
            self._shared.set_error(describe_error(exc))
        finally:
            self._shared.set_network(up=False, dht_peers=[])
            _cancel_leftovers(loop)
            loop.close()

    async def _network_main(self, stop: asyncio.Event) -> None:
        """Start the core (retrying with backoff until it starts or ``stop``), run it, shut it down."""
        delay = self.settings.join_retry_seconds
        while not stop.is_set():
            try:
                core = await asyncio.wait_for(
                    SwarmCore.create(
                        self.settings, self.identity, self.limits, self._shared, self._validator, self._p2pd_options
                    ),
                    self.settings.startup_timeout + 2 * self.settings.request_timeout,
                )
            except _START_ERRORS as exc:
                self._shared.add("start_failures")
                self._shared.set_error(describe_error(exc))
                logger.warning("could not start the swarm network (%r); retrying in %.1f s", exc, delay)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
                delay = min(2 * delay, self.settings.join_retry_max_seconds)
                continue
            self._core = core
            self._shared.clear_error()
            try:
                await core.run(stop)
            finally:
                await core.shutdown()
                self._core = None
            return

    def _call_on_loop(self, fn: Callable[[SwarmCore], _T], timeout: float = 10.0) -> _T:
        """Run ``fn(core)`` on the network loop and return its result (for tests and tools)."""
        loop, core = self._loop, self._core
        if loop is None or core is None:
            raise RuntimeError("the swarm network is not running")

        async def call() -> _T:
            return fn(core)

        return asyncio.run_coroutine_threadsafe(call(), loop).result(timeout)

    def _await_on_loop(self, fn: Callable[[SwarmCore], Awaitable[_T]], timeout: float = 30.0) -> _T:
        """Await ``fn(core)`` on the network loop and return its result (for tests and tools)."""
        loop, core = self._loop, self._core
        if loop is None or core is None:
            raise RuntimeError("the swarm network is not running")

        async def call() -> _T:
            return await fn(core)

        return asyncio.run_coroutine_threadsafe(call(), loop).result(timeout)

    # -- the training loop's calls ------------------------------------------------------------------

    def current_epoch(self) -> int:
        """``floor(dht_time / epoch_seconds)``."""
        return epoch_at(get_dht_time(), self.settings.epoch_seconds)

    def min_publish_interval(self) -> float:
        """Seconds to leave between two batches so that no honest batch is refused: peers accept at most
        ``max_batches_per_peer_epoch`` batches of an author per epoch, and an author's manifests share
        ``SLOTS_PER_AUTHOR`` DHT subkeys (a faster author overwrites manifests before peers read them).

        Also no less than publishing a batch takes here (hand-offs from behind NAT on a slow uplink can
        take longer than that): the caller then sends fewer, larger batches instead of a growing queue."""
        s = self.settings
        with self._shared.lock:
            busy = self._shared.publish_seconds
        return max(s.epoch_seconds / min(s.max_batches_per_peer_epoch, SLOTS_PER_AUTHOR), busy)

    def publish(self, batch: RolloutBatch) -> str | None:
        """Sign and share a batch of this node's rollouts; returns its batch id without waiting.

        Fills ``swarm_id``, ``address``, ``epoch``, ``seq`` and ``created_at``; ``batch.author`` must
        be this node's public key. Returns None (and logs why) if the network is not running yet or the
        batch is one peers would reject (too large); the manifest is stored in the background (bounded
        by ``publish_timeout``) and the batch is served to peers from memory.
        """
        loop, core = self._loop, self._core
        with self._shared.lock:
            maddrs = list(self._shared.visible_maddrs)
        if loop is None or core is None or not maddrs:
            self._shared.add("publish_skipped")
            logger.info("swarm network not running; batch not published")
            return None
        item = self._prepare(batch, maddrs)
        if item is None:
            return None
        try:
            loop.call_soon_threadsafe(core.enqueue_publish, item)
        except RuntimeError:  # the loop closed between the check and the call
            self._shared.add("publish_skipped")
            return None
        return item.batch_id

    def _prepare(self, batch: RolloutBatch, maddrs: list[str]) -> PublishItem | None:
        now = get_dht_time()
        with self._lifecycle:
            self._seq += 1
            seq = self._seq
        holders = self._holders(seq)
        batch = replace(
            batch,
            swarm_id=self.settings.swarm_id,
            address=tuple([*holders, *maddrs][: self.limits.max_addresses]),
            epoch=epoch_at(now, self.settings.epoch_seconds),
            seq=seq,
            created_at=now,
        )
        try:
            data = encode_batch(batch, self.identity, self.limits)
            manifest = make_manifest(batch, data, expires_at=now + self.settings.manifest_ttl)
            manifest_data = encode_manifest(manifest, self.identity, self.limits)
        except ProtocolError as exc:
            self._shared.add("publish_invalid")
            logger.warning("not publishing a batch peers would reject: %s", exc)
            return None
        return PublishItem(
            batch_id=manifest.batch_id,
            data=data,
            manifest_data=manifest_data,
            key=manifest_key(self.settings.swarm_id, batch.epoch, shard_of(self.identity.peer_id, self.settings.key_shards)),
            subkey=manifest_subkey(self.identity.peer_id, seq),
            expires_at=manifest.expires_at,
            holders=tuple(holders),
            created_at=now,
        )

    def _holders(self, seq: int) -> list[str]:
        """In client mode with ``nat_sharing: handoff``: where a batch is handed (and listed first in its signed
        address list): ``handoff_copies`` peers and one spare in case a holder refuses, among the DHT servers
        and initial peers that answered this node most recently (the swarm's hosts and its reachable
        members, ``swarm.addresses``), rotated by ``seq`` to spread the load; the initial peers until any
        answered. Empty otherwise."""
        s = self.settings
        with self._shared.lock:
            if not (self._shared.client and s.nat_sharing == "handoff"):
                return []
            servers = {*self._shared.dht_peers, *self._initial_ids}
            chosen = self._shared.book.holders(servers, s.handoff_copies + 1, seq)
        if chosen or not s.initial_peers:
            return chosen
        k = seq % len(s.initial_peers)
        rotated = [*s.initial_peers[k:], *s.initial_peers[:k]]
        return rotated[: s.handoff_copies + 1]

    def collect(self) -> list[RolloutBatch]:
        """Peers' batches verified since the last call (signature, hash, limits, quotas, dedup)."""
        return self._shared.drain()

    def penalize(self, peer_id: str, reason: str) -> None:
        """Count an offence found in an author's accepted batch (e.g. rollouts that fail the node's own
        checks) and ban the author with backoff, exactly as for invalid bytes."""
        with self._shared.lock:
            length = self._shared.peer_book.penalize(peer_id, reason, time.monotonic())
        logger.debug("banned %s for %.0f s: %s", peer_id[:12], length, reason)

    def peers(self) -> list[str]:
        """libp2p ids of this node's current DHT neighbours."""
        with self._shared.lock:
            return list(self._shared.dht_peers)

    def add_bootstrap_peers(self, maddrs: list[str]) -> None:
        """Peers met while running (full multiaddrs), dialed with the initial peers whenever every neighbour is
        gone: a member's way back in when every host of its swarm is down (at most 64, the newest kept)."""
        with self._shared.lock:
            known = self._shared.bootstrap_peers
            self._shared.bootstrap_peers = list(dict.fromkeys([*maddrs, *known]))[:64]

    def remembered_maddrs(self) -> list[str]:
        """Full multiaddrs of the peers this node reached at an address and heard back from (``swarm.addresses``:
        hosts, holders, members that accept connections), the live ones first: worth remembering to join
        again when every host is gone. Never a member behind NAT."""
        with self._shared.lock:
            return self._shared.book.remembered()

    def ping(self, maddr: str) -> float | None:
        """Dial ``maddr`` (a full multiaddr) and ping it over the DHT protocol: the round trip in seconds, or
        None if it does not answer within ``request_timeout`` (or the network side is not running)."""

        async def answered(core: SwarmCore) -> float | None:
            parsed = parse_peer_maddr(maddr)
            if parsed is None:
                return None
            started = time.monotonic()
            ok = await asyncio.wait_for(core._dial_and_ping(*parsed), 2 * self.settings.request_timeout)
            return time.monotonic() - started if ok else None

        try:
            return self._await_on_loop(answered, 2 * self.settings.request_timeout + 1)
        except (RuntimeError, TimeoutError, *_START_ERRORS):
            return None

    def libp2p_id(self) -> str | None:
        """This node's libp2p peer id (what ``/p2p/`` addresses name it by) while the network side runs."""
        core = self._core
        return None if core is None else core.p2p.peer_id.to_base58()

    def p2pd_pid(self) -> int | None:
        """The pid of this node's p2pd while the network side runs, else None (for tools and tests)."""
        core = self._core
        return None if core is None else p2pd_pid(core.p2p)

    def visible_multiaddrs(self) -> list[str]:
        """Full multiaddrs (with ``/p2p/<id>``) other nodes can use as initial peers; empty until up."""
        with self._shared.lock:
            return list(self._shared.visible_maddrs)

    def network_status(self) -> NetworkStatus:
        """Up or not, and why, with the current DHT neighbours (libp2p ids)."""
        alive, running = self.is_alive(), self._core is not None
        shared = self._shared
        with shared.lock:
            counters = shared.counters
            lost_for = None if shared.lost_at is None or shared.dht_peers else time.time() - shared.lost_at
            # the peers met that joining dials besides the initial ones (by peer, not address), read only while
            # joining: the one reason that names them
            met = set() if shared.network_up else set(libp2p_ids(tuple(shared.met_peers()))) - self._initial_ids
            reason = network_reason(
                alive=alive, running=running, up=shared.network_up, neighbours=len(shared.dht_peers),
                initial_peers=len(self.settings.initial_peers), join_failures=counters["join_failures"],
                start_failures=counters["start_failures"], error=shared.error, lost_for=lost_for,
                retry_cap=self.settings.retry_cap, remembered=len(met))
            if running and shared.reach:
                reason += f"; {shared.reach}"
            if running and (note := initial_peers_note(time.time(), shared.initial_lost_at, shared.initial_back)):
                reason += f"; {note}"
            return NetworkStatus(
                up=shared.network_up, reason=reason, neighbours=tuple(shared.dht_peers), restarts=counters["restarts"],
                last_error=shared.last_error, client=shared.client, reach=shared.reach,
                lost_at=None if lost_for is None else shared.lost_at, connections=shared.connections,
                initial_lost_at=shared.initial_lost_at, initial_back=shared.initial_back)

    def peer_stats(self) -> list[PeerRow]:
        """Per-peer counters (``PeerBook.peer_table``), with ``last_seen`` and ``banned_until`` as wall-clock
        Unix times."""
        with self._shared.lock:
            mono = time.monotonic()
            rows = self._shared.peer_book.peer_table(mono)
        offset = time.time() - mono
        return [
            replace(
                row,
                last_seen=row.last_seen + offset,
                banned_until=None if row.banned_until is None else row.banned_until + offset,
            )
            for row in rows
        ]

    def stats(self) -> dict[str, StatValue]:
        """A snapshot of counters; ``batches_rejected`` maps reason to count (DHT records: ``record_*``)."""
        shared = self._shared
        records = self._validator.snapshot()
        with shared.lock:
            book = shared.peer_book
            rejected = dict(book.rejected)
            for reason, n in records.items():
                rejected[reason] = rejected.get(reason, 0) + n
            counters = shared.counters
            return {
                "network_up": int(shared.network_up),
                "network_alive": int(self.is_alive()),
                "peers_connected": len(shared.dht_peers),
                "connections": shared.connections,
                "client": int(shared.client),
                "peers_seen": book.authors_seen(),
                "peers_banned": len(book.banned(time.monotonic())),
                "batches_published": counters["batches_published"],
                "publish_failed": counters["publish_failed"],
                "store_retries": counters["store_retries"],
                "publish_dropped": counters["publish_dropped"],
                "publish_skipped": counters["publish_skipped"] + counters["publish_invalid"],
                "batches_accepted": book.accepted,
                "batches_rejected": rejected,
                "batches_served": counters["batches_served"],
                "handoffs_sent": counters["handoffs_sent"],
                "handoff_failed": counters["handoff_failed"],
                "handoffs_held": counters["handoffs_held"],
                "handoffs_refused": counters["handoffs_refused"],
                "bytes_in": counters["bytes_in"],
                "bytes_out": counters["bytes_out"],
                "inbox": len(shared.inbox),
                "inbox_bytes": shared.inbox_bytes,
                "offences": dict(book.offences),
                "pulls_failed": counters["pulls_failed"],
                "pulls_stalled": counters["pulls_stalled"],
                "stalls_forgiven": book.stalls_forgiven,
                "stalls_retried": counters["stalls_retried"],
                "pulls_unreachable": counters["pulls_unreachable"],
                "serve_failed": counters["serve_failed"],
                "poll_failed": counters["poll_failed"],
                "poll_key_timeouts": counters["poll_key_timeouts"],
                "poll_key_failures": counters["poll_key_failures"],
                "polls": counters["polls"],
                "poll_ms": counters["poll_ms"],
                "dht_find_requests": counters["dht_find_requests"],
                "dht_find_keys": counters["dht_find_keys"],
                "dht_store_requests": counters["dht_store_requests"],
                "duplicate_groups": counters["duplicate_groups"],
                "dht_store_bytes": self._validator.stored_bytes,
                "join_attempts": counters["join_attempts"],
                "join_failures": counters["join_failures"],
                "census_new": counters["census_new"],
                "start_failures": counters["start_failures"],
                "epoch": self.current_epoch(),
            }


def _cancel_leftovers(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel what hivemind left running on the loop (DHT traversals, timers) and let it unwind."""
    pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in pending:
        task.cancel()
    with contextlib.suppress(RuntimeError, asyncio.TimeoutError):
        if pending:
            gather = asyncio.gather(*pending, return_exceptions=True)
            loop.run_until_complete(asyncio.wait_for(gather, 5.0))
        loop.run_until_complete(loop.shutdown_asyncgens())
