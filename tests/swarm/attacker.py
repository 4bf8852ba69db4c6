"""A hostile peer for the adversarial tests: raw hivemind, none of the project's transport.

``Attacker`` runs its own ``P2P`` (p2pd) and ``DHTNode`` (no record validator) in a thread with its own
event loop, stores whatever it likes straight into a victim's DHT storage (``call_store`` to the
victim's peer id, bypassing every check of its own), and answers the swarm's batch protocol with a raw
stream handler whose behaviour the test picks: serve bytes, stall (always or once), trickle, or serve slowly
at a steady rate (``slow``, ``rate`` bytes a second: an honest peer on a slow link).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

from hivemind.dht.node import DHTNode
from hivemind.dht.routing import DHTID
from hivemind.p2p import P2P, PeerID
from hivemind.p2p.p2p_daemon_bindings.datastructures import StreamInfo
from hivemind.utils import MSGPackSerializer, get_dht_time

from protocol.codec import encode_batch, encode_manifest, make_manifest
from protocol.identity import Identity
from protocol.records import RolloutBatch
from swarm.core import handler_name
from swarm.hivemind_compat import p2pd_pid
from swarm.keys import manifest_key, manifest_subkey, shard_of
from swarm.transport import SwarmTransport
from tests.swarm.conftest import _P2PD_PIDS

_T = TypeVar("_T")


def peer_id_of(transport: SwarmTransport) -> PeerID:
    """The libp2p id of a running transport (from its visible multiaddr)."""
    return PeerID.from_base58(transport.visible_multiaddrs()[0].rsplit("/", 1)[1])


class Attacker:
    """One hostile peer; ``close()`` always (fixtures do)."""

    def __init__(self, swarm_id: str, initial_peers: list[str]) -> None:
        self.swarm_id = swarm_id
        self.mode = "serve"  # serve | stall | stall_once (then serve) | stall_twice (then serve) | trickle | slow
        self.rate = 64 * 1024  # ``slow``: bytes a second
        self.batches: dict[str, bytes] = {}
        self.requests = 0
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="attacker", daemon=True)
        self._thread.start()
        self.p2p: P2P = self.call(P2P.create(host_maddrs=["/ip4/127.0.0.1/tcp/0"], initial_peers=initial_peers))
        self.pid = p2pd_pid(self.p2p)
        if self.pid is not None:
            _P2PD_PIDS.add(self.pid)  # the session's leak check covers it
        self.dht: DHTNode = self.call(DHTNode.create(p2p=self.p2p, initial_peers=initial_peers,
                                                     ensure_bootstrap_success=False))
        self.call(self.p2p.add_binary_stream_handler(handler_name(swarm_id), self._serve))
        self.maddrs = [str(m) for m in self.call(self.p2p.get_visible_maddrs())]

    def call(self, coro: Awaitable[_T], timeout: float = 60.0) -> _T:
        async def run() -> _T:
            return await coro

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.call(self.dht.shutdown(), 10)
        with contextlib.suppress(Exception):
            self.call(self.p2p.shutdown(), 10)
        with contextlib.suppress(Exception):  # stalled handlers and hivemind's timers, unwound on this loop
            self.call(_cancel_others(), 10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self.loop.close()

    # -- raw DHT writes ---------------------------------------------------------------------------------

    def store(self, victim: PeerID, key: str, value: bytes, expiration: float, subkey: Any = None) -> bool | None:
        """Ask ``victim`` to store one record as is (``value`` already serialized); its answer."""
        ok = self.call(self.dht.protocol.call_store(victim, [DHTID.generate(source=key)], [value], expiration,
                                                    subkeys=[subkey]))
        return None if ok is None else bool(ok[0])

    def store_many(self, victim: PeerID, records: list[tuple[str, bytes, float, Any]]) -> list[bool] | None:
        keys = [DHTID.generate(source=k) for k, _, _, _ in records]
        ok = self.call(self.dht.protocol.call_store(victim, keys, [v for _, v, _, _ in records],
                                                    [e for _, _, e, _ in records],
                                                    subkeys=[s for _, _, _, s in records]))
        return None if ok is None else [bool(x) for x in ok]

    def manifest_record(self, author: Identity, batch: RolloutBatch, *, data: bytes | None = None,
                        epoch: int, owner: str | None = None, byte_size: int | None = None,
                        batch_id: str | None = None, ttl: float = 20.0,
                        address: tuple[str, ...] | None = None) -> tuple[str, bytes, float, str]:
        """``(key, value, expiration, subkey)`` of a manifest signed by ``author`` for ``batch``.

        ``batch`` gets the attacker's address (or ``address``), the epoch and ``created_at`` now; the
        manifest can lie about ``byte_size`` or ``batch_id`` and be filed under ``owner``'s subkey.
        """
        now = get_dht_time()
        batch = _with(batch, address=self.maddrs if address is None else address, epoch=epoch, created_at=now)
        data = encode_batch(batch, author) if data is None else data
        manifest = make_manifest(batch, data, expires_at=now + ttl)
        if byte_size is not None or batch_id is not None:
            manifest = _with(manifest, byte_size=manifest.byte_size if byte_size is None else byte_size,
                             batch_id=manifest.batch_id if batch_id is None else batch_id)
        self.batches[manifest.batch_id] = data
        owner = owner or author.peer_id
        key = manifest_key(self.swarm_id, epoch, shard_of(owner))
        return key, MSGPackSerializer.dumps(encode_manifest(manifest, author)), now + ttl, \
            manifest_subkey(owner, batch.seq)

    # -- the raw batch handler -------------------------------------------------------------------------

    async def _serve(self, _info: StreamInfo, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.requests += 1
        try:
            raw = await reader.readexactly(64)
            if self.mode in ("stall", "stall_once", "stall_twice"):
                self.mode = {"stall_once": "serve", "stall_twice": "stall_once"}.get(self.mode, self.mode)
                await asyncio.sleep(3600)
            data = self.batches.get(raw.decode("ascii", errors="replace"), b"")
            writer.write(len(data).to_bytes(8, "big"))
            if self.mode == "trickle":
                for i in range(len(data)):
                    writer.write(data[i : i + 1])
                    await writer.drain()
                    await asyncio.sleep(0.5)
            if self.mode == "slow":
                chunk = max(1, int(self.rate / 10))
                for i in range(0, len(data), chunk):
                    writer.write(data[i : i + chunk])
                    await writer.drain()
                    await asyncio.sleep(0.1)
                data = b""
            writer.write(data)
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


async def _cancel_others() -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _with(record: Any, **changes: Any) -> Any:
    import dataclasses

    return dataclasses.replace(record, **changes)


def wait_until(predicate: Any, timeout: float = 20.0, period: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(period)
    return bool(predicate())
