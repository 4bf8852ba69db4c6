"""Publishing: hold the batch to serve it, store its manifest in the DHT (a failed store tried again,
all of it bounded by ``publish_timeout``; a client-mode node's own storage never counts), and behind NAT
with ``nat_sharing: handoff`` first push the batch to reachable holders (``rpc_put_batch`` on their side,
``swarm.handoff``)."""

from __future__ import annotations

import asyncio
import logging
import time

from hivemind.p2p import PeerID
from hivemind.utils.multiaddr import Multiaddr

from swarm.core.base import LEN_BYTES, NETWORK_ERRORS, CoreBase, PublishItem, parse_peer_maddr
from swarm.handoff import HandoffStatus

logger = logging.getLogger(__name__)

_PUBLISH_EWMA = 0.3  # weight of the latest publish's duration in the running estimate
_STORE_RETRY_SECONDS = 0.5  # first wait before a failed manifest store is tried again (doubled each time)


class PublishMixin(CoreBase):
    """The publish loop of ``SwarmCore`` and the sending side of a hand-off."""

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
                                   exclude_self=self.shared.client),
                    left,
                )
            except NETWORK_ERRORS as exc:
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
        waiting = [parsed for parsed in map(parse_peer_maddr, item.holders) if parsed is not None]
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
        if await self._port_closed(addr) or not await self._dial(peer_id, [addr]):
            self._unreachable(peer_id)
            return False
        status = await self._put_to(peer_id, item)
        if status is None:  # it cannot take hand-offs (any more): no holder until it answers again
            self._unreachable(peer_id)
        if status not in (HandoffStatus.OK, HandoffStatus.HAVE):
            logger.debug("holder %s refused %s: %s", peer_id, item.batch_id[:12], status)
            return False
        self._confirm([f"{addr}/p2p/{peer_id.to_base58()}"])
        self.shared.trace.event("handoff", id=item.batch_id[:16], to=peer_id.to_base58()[:16])
        return True

    async def _put_to(self, peer_id: PeerID, item: PublishItem) -> int | None:
        """One hand-off (see ``swarm.handoff`` for the exchange): the holder's status, or None."""
        timeout = self.settings.request_timeout
        try:
            _, reader, writer = await asyncio.wait_for(
                self.p2p.call_binary_stream_handler(peer_id, self._put_handler), timeout
            )
        except NETWORK_ERRORS as exc:
            logger.debug("could not open a hand-off stream to %s: %r", peer_id, exc)
            return None
        try:
            writer.write(item.batch_id.encode("ascii") + len(item.data).to_bytes(LEN_BYTES, "big"))
            await asyncio.wait_for(writer.drain(), timeout)
            status = int((await asyncio.wait_for(reader.readexactly(1), timeout))[0])
            if status != HandoffStatus.GO:
                return status
            # The holder reads at its pace (``_read_paced``), then verifies: allow the transfer's time.
            transfer = self.transfer_seconds(len(item.data)) + timeout
            writer.write(item.data)
            await asyncio.wait_for(writer.drain(), transfer)
            return int((await asyncio.wait_for(reader.readexactly(1), transfer))[0])
        except NETWORK_ERRORS as exc:
            logger.debug("hand-off of %s to %s failed: %r", item.batch_id[:12], peer_id, exc)
            return None
        finally:
            writer.close()
