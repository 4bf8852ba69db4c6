"""Serving: ``rpc_get_batch`` answers a batch by id with its signed bytes; ``rpc_put_batch`` takes a batch
handed over by a node behind NAT, verifies it and holds it within quotas (``swarm.handoff``)."""

from __future__ import annotations

import asyncio
import logging
import time

from hivemind.p2p.p2p_daemon_bindings.datastructures import StreamInfo
from hivemind.utils import get_dht_time

from protocol.codec import batch_id, batch_payload_size, decode_batch
from protocol.errors import ProtocolError
from protocol.identity import peer_id_from_public_key
from swarm.core.base import ID_BYTES, LEN_BYTES, NETWORK_ERRORS, CoreBase
from swarm.handoff import HandoffStatus
from swarm.keys import epoch_at

logger = logging.getLogger(__name__)

# Hand-offs being received and verified at once; more are refused (busy). Over a lossy home link one takes
# seconds, and 6 NATed nodes handing off to 2 holders had a quarter of theirs refused at 2 (wan_swarm.py).
_MAX_HANDOFFS_IN_FLIGHT = 8


class ServeMixin(CoreBase):
    """The two handlers ``SwarmCore`` answers the network with."""

    async def rpc_get_batch(
        self, info: StreamInfo, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Serve one batch by id: read 64 hex chars, answer a length prefix and the signed bytes."""
        timeout = self.settings.request_timeout
        try:
            raw = await asyncio.wait_for(reader.readexactly(ID_BYTES), timeout)
            data = self._local(raw.decode("ascii", errors="replace")) or b""
            writer.write(len(data).to_bytes(LEN_BYTES, "big"))
            writer.write(data)
            await asyncio.wait_for(writer.drain(), self.transfer_seconds(len(data)) if data else timeout)
            if data:
                with self.shared.lock:
                    self.shared.counters["bytes_out"] += len(data)
                    self.shared.counters["batches_served"] += 1
                    self.shared.peer_book.served(info.peer_id.to_base58(), len(data), time.monotonic())
        except NETWORK_ERRORS as exc:
            self.shared.add("serve_failed")
            logger.debug("serving a batch failed: %r", exc)
        finally:
            writer.close()

    async def rpc_put_batch(
        self, info: StreamInfo, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Take a batch handed over by a peer behind NAT: hold and serve it if valid and within quotas."""
        timeout = self.settings.request_timeout
        reserved = False
        try:
            header = await asyncio.wait_for(reader.readexactly(ID_BYTES + LEN_BYTES), timeout)
            bid = header[:ID_BYTES].decode("ascii", errors="replace")
            size = int.from_bytes(header[ID_BYTES:], "big")
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
        except NETWORK_ERRORS as exc:
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
        status = self.handoffs.add(bid, data, author, batch.epoch, current)
        if status == HandoffStatus.OK and self.shared.members is not None:
            self.shared.members.batch_seen(bid, batch, time.time(), handed_off=True)
        return status

    def _count_handoff(self, status: int) -> None:
        if status == HandoffStatus.OK:
            self.shared.add("handoffs_held")
        elif status not in (HandoffStatus.GO, HandoffStatus.HAVE):
            self.shared.add("handoffs_refused")

