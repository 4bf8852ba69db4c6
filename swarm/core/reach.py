"""Reachability: whether peers can dial this node, found out by asking one to try (``client_mode: auto``).

A node in ``auto`` starts in client mode. Once joined, it asks a peer or two (its initial peers first: a
swarm's hosts) over ``/swarm-node/<swarm>/reach/1`` to dial it back. The asked peer opens a plain TCP
connection to the address the request came from, at the listen ports the node names, and answers which
address took it. That is what any other peer would have to do, and it dials only the asker's own IP, so
nobody can use it to make a peer connect elsewhere. If every peer that answered could dial it, the node
becomes a full member in place (``hivemind_compat.become_dht_server``, the hand-off handler, the address
it was reached at listed first in its batches); otherwise it stays a client and asks again much later.

The wire exchange (integers big-endian)::

    asker:  n (1 byte, at most 4) + n listen ports (2 bytes each)
    peer:   status (1 byte: 0 not reachable, 1 reachable, 2 busy) + length (2 bytes) + the address dialed
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from hivemind.p2p import PeerID
from hivemind.p2p.p2p_daemon_bindings.datastructures import StreamInfo

from swarm.core.base import HEALTH_PERIOD, NETWORK_ERRORS, parse_peer_maddr
from swarm.core.serve import ServeMixin
from swarm.hivemind_compat import become_dht_server, dht_neighbours

logger = logging.getLogger(__name__)

_MAX_PORTS = 4
_ASK = 2  # peers asked at once
_MIN_GAP_SECONDS = 5.0  # between two checks for one asker
_MAX_CHECKS = 4  # checks run at once for others
_RECHECK_SECONDS = 600.0  # after an answer "not reachable" (a router changed?), or once nobody could answer
NO, YES, BUSY = 0, 1, 2


def reach_handler_name(swarm_id: str) -> str:
    return f"/swarm-node/{swarm_id}/reach/1"


def remote_ip(addr: object) -> tuple[str, str] | None:
    """``("ip4" | "ip6", address)`` of the peer at the far end of a connection, None if relayed or unknown."""
    parts = str(addr).split("/")
    if "p2p-circuit" in parts or len(parts) < 3 or parts[1] not in ("ip4", "ip6"):
        return None
    return parts[1], parts[2]


def listen_ports(maddrs: list[str]) -> list[int]:
    """The TCP ports of this node's own addresses (``/ip4/.../tcp/P/...``), each once, at most ``_MAX_PORTS``."""
    ports: list[int] = []
    for maddr in maddrs:
        parts = maddr.split("/")
        for proto, value in zip(parts, parts[1:]):
            if proto == "tcp" and value.isdigit() and int(value) and int(value) not in ports:
                ports.append(int(value))
    return ports[:_MAX_PORTS]


class ReachMixin(ServeMixin):
    """Both sides of the reachability check: ``rpc_reach`` (a full member answering) and ``_reach_loop``."""

    async def rpc_reach(self, info: StreamInfo, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Dial the asker back at its listen ports, from its own IP only; answer the address that took it."""
        timeout = self.settings.request_timeout
        asker = info.peer_id.to_base58()
        try:
            head = await asyncio.wait_for(reader.readexactly(1), timeout)
            n = min(head[0], _MAX_PORTS)
            raw = await asyncio.wait_for(reader.readexactly(2 * n), timeout)
            ports = [int.from_bytes(raw[2 * i:2 * i + 2], "big") for i in range(n)]
            now = time.monotonic()
            status, found = BUSY, ""
            if self._reach_checks < _MAX_CHECKS and now - self._reach_asked.get(asker, -1e9) >= _MIN_GAP_SECONDS:
                self._reach_asked = {p: t for p, t in self._reach_asked.items() if now - t < _MIN_GAP_SECONDS}
                self._reach_asked[asker] = now
                self._reach_checks += 1
                try:
                    found = await self._dial_back(info.addr, ports)
                finally:
                    self._reach_checks -= 1
                status = YES if found else NO
            body = found.encode()
            writer.write(bytes([status]) + len(body).to_bytes(2, "big") + body)
            await asyncio.wait_for(writer.drain(), timeout)
        except NETWORK_ERRORS as exc:
            logger.debug("answering a reachability check of %s failed: %r", asker, exc)
        finally:
            writer.close()

    async def _dial_back(self, addr: object, ports: list[int]) -> str:
        """The first ``/ipX/<asker's IP>/tcp/<port>`` that takes a TCP connection within the time-out, or ""."""
        where = remote_ip(addr)
        if where is None:
            return ""
        family, ip = where
        for port in ports:
            if not 0 < port < 65536:
                continue
            try:
                _, conn = await asyncio.wait_for(asyncio.open_connection(ip, port), self.settings.request_timeout)
            except (OSError, asyncio.TimeoutError):
                continue
            conn.close()
            with contextlib.suppress(OSError, asyncio.TimeoutError):
                await asyncio.wait_for(conn.wait_closed(), 1.0)
            return f"/{family}/{ip}/tcp/{port}"
        return ""

    # -- the asking side (client_mode: auto) -----------------------------------------------------------

    async def _reach_loop(self) -> None:
        """``auto`` only: once joined, ask until a peer could answer; become a full member if reachable. Then
        (or at once, in any other mode) wait to be cancelled with the other loops."""
        if self.settings.client_mode == "auto" and self.shared.client:
            await self._find_reach()
        await asyncio.Event().wait()

    async def _find_reach(self) -> None:
        self._set_reach("checking")
        delay = 5.0
        while True:
            while not self._neighbours():
                await asyncio.sleep(HEALTH_PERIOD)
            verdict, address = await self._ask_reach()
            if verdict:
                await self._promote(address)
                return
            self._set_reach("unknown" if verdict is None else "unreachable")
            if verdict is False:
                logger.info("peers cannot dial this node: it stays in client mode (its batches are handed to "
                            "reachable peers); asking again in %.0f s", _RECHECK_SECONDS)
                delay = _RECHECK_SECONDS
            else:
                delay = min(2 * delay, _RECHECK_SECONDS)
            await asyncio.sleep(delay)

    def _set_reach(self, reach: str) -> None:
        with self.shared.lock:
            self.shared.reach = reach

    async def _ask_reach(self) -> tuple[bool | None, str]:
        """Ask up to ``_ASK`` peers (initial peers first); ``(True, address)`` if every one that answered
        could dial this node, ``(False, "")`` if one could not, ``(None, "")`` if none answered."""
        with self.shared.lock:
            ports = listen_ports(self.shared.visible_maddrs)
        if not ports:
            return None, ""
        initial = [p[0] for p in map(parse_peer_maddr, self.settings.initial_peers) if p is not None]
        servers = dht_neighbours(self.dht)
        candidates = list(dict.fromkeys([*(p for p in initial if p in servers), *servers]))[:_ASK]
        answers = await asyncio.gather(*(self._ask_one(peer, ports) for peer in candidates))
        heard = [a for a in answers if a is not None]
        if not heard:
            return None, ""
        if all(heard):
            return True, heard[0]
        return False, ""

    async def _ask_one(self, peer: PeerID, ports: list[int]) -> str | None:
        """One peer's answer: the address it dialed ("" if none took it), None if it gave none."""
        timeout = self.settings.request_timeout
        try:
            _, reader, writer = await asyncio.wait_for(
                self.p2p.call_binary_stream_handler(peer, reach_handler_name(self.settings.swarm_id)), timeout)
        except NETWORK_ERRORS as exc:
            logger.debug("%s cannot check reachability: %r", peer, exc)
            return None
        try:
            writer.write(bytes([len(ports)]) + b"".join(p.to_bytes(2, "big") for p in ports))
            await asyncio.wait_for(writer.drain(), timeout)
            head = await asyncio.wait_for(reader.readexactly(3), 2 * timeout + len(ports) * timeout)
            body = await asyncio.wait_for(reader.readexactly(min(int.from_bytes(head[1:], "big"), 256)), timeout)
        except NETWORK_ERRORS as exc:
            logger.debug("reachability check by %s failed: %r", peer, exc)
            return None
        finally:
            writer.close()
        if head[0] == BUSY:
            return None
        address = body.decode("ascii", errors="replace")
        return address if head[0] == YES and address.startswith("/ip") else ""

    async def _promote(self, address: str) -> None:
        """Become a full member now: a DHT server, holding hand-offs, answering checks; listed at ``address``."""
        await become_dht_server(self.dht)
        if self.settings.accept_handoffs:
            await self.p2p.add_binary_stream_handler(self._put_handler, self.rpc_put_batch)
        await self.p2p.add_binary_stream_handler(reach_handler_name(self.settings.swarm_id), self.rpc_reach)
        mine = f"{address}/p2p/{self.p2p.peer_id.to_base58()}"
        with self.shared.lock:
            self.shared.client = False
            self.shared.reach = f"reachable at {address}"
            self.shared.reachable_at = [mine]
            self.shared.visible_maddrs = list(dict.fromkeys([mine, *self.shared.visible_maddrs]))
        self.shared.trace.event("reachable", address=address)
        logger.info("peers can dial this node at %s: it is a full member now (a DHT server; it serves its own "
                    "batches and holds those of members behind NAT)", address)
        for peer in dht_neighbours(self.dht):  # so that they add it to their routing tables now
            with contextlib.suppress(*NETWORK_ERRORS):
                await asyncio.wait_for(self.dht.protocol.call_ping(peer), self.settings.request_timeout)
        with contextlib.suppress(*NETWORK_ERRORS):
            await asyncio.wait_for(self.dht.find_nearest_nodes([self.dht.node_id]), self.settings.request_timeout)
