"""Joining the swarm: dial the initial peers until the DHT has a neighbour, retrying with exponential
backoff, and again whenever every neighbour is gone; after a partition, dial the initial peers again
(with backoff) so the two sides rejoin."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from hivemind.p2p import PeerID
from hivemind.utils.multiaddr import Multiaddr

from swarm.core.base import HEALTH_PERIOD, NETWORK_ERRORS, CoreBase, parse_peer_maddr
from swarm.hivemind_compat import dht_neighbours

logger = logging.getLogger(__name__)


class JoinMixin(CoreBase):
    """The join loop of ``SwarmCore``."""

    def _neighbours(self) -> list[str]:
        return [peer.to_base58() for peer in dht_neighbours(self.dht)]

    async def _join_loop(self) -> None:
        delay = self.settings.join_retry_seconds
        warned = False
        initial_ids = {p[0].to_base58() for p in map(parse_peer_maddr, self.settings.initial_peers) if p is not None}
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
                await asyncio.sleep(HEALTH_PERIOD)
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
        """Dial the initial peers and the peers met while running (``SharedState.bootstrap_peers``) at once;
        whether any answered. When every host of a swarm is gone, the members it met still are."""
        with self.shared.lock:
            met = [m for m in self.shared.bootstrap_peers if m not in self.settings.initial_peers]
        targets = [p for p in map(parse_peer_maddr, [*self.settings.initial_peers, *met]) if p is not None]
        results = await asyncio.gather(*(self._dial_and_ping(peer, addr) for peer, addr in targets))
        if not any(results):
            return False
        with contextlib.suppress(*NETWORK_ERRORS):  # fill the routing table; best effort
            await asyncio.wait_for(
                self.dht.find_nearest_nodes([self.dht.node_id]), self.settings.request_timeout
            )
        return True

    async def _dial_and_ping(self, peer_id: PeerID, addr: Multiaddr) -> bool:
        if not await self._dial(peer_id, [addr]):
            return False
        return await self.dht.protocol.call_ping(peer_id) is not None
