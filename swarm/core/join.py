"""Joining the swarm: dial the initial peers until the DHT has a neighbour, retrying with exponential
backoff, and again whenever every neighbour is gone; after a partition, or while every initial peer (a
swarm's hosts) is away, dial them again (with backoff) so the two sides rejoin. Every wait is capped by
``SwarmSettings.retry_cap`` (a quarter epoch at most), so a node is back within an epoch of its peers.

Besides the initial peers, a node dials the peers it met (``SharedState.bootstrap_peers``, what the daemon
remembered in the run dir) and those it reached while running (``swarm.addresses``): its way back in
when every host is gone. Losing every neighbour, and getting one back, is logged and traced.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from hivemind.p2p import PeerID
from hivemind.utils.multiaddr import Multiaddr

from swarm.core.base import HEALTH_PERIOD, NETWORK_ERRORS, CoreBase, parse_peer_maddr

logger = logging.getLogger(__name__)


class JoinMixin(CoreBase):
    """The join loop of ``SwarmCore``."""

    async def _join_loop(self) -> None:
        s = self.settings
        delay = s.join_retry_seconds
        warned = False
        initial_ids = {p[0].to_base58() for p in map(parse_peer_maddr, s.initial_peers) if p is not None}
        rejoin_delay, next_rejoin = s.join_retry_seconds, 0.0
        had: list[str] = []  # the neighbours at the last look
        had_initial = False
        while True:
            neighbours = self._neighbours()
            self._note_change(had, neighbours)
            with_initial = bool(initial_ids & set(neighbours))
            if with_initial != had_initial:
                self._note_initial(with_initial, sorted(p[:16] for p in initial_ids & set(neighbours)))
            had, had_initial = neighbours, with_initial
            if neighbours or not self._bootstrap_targets():
                self.shared.set_network(up=True, dht_peers=neighbours)
                delay, warned = s.join_retry_seconds, False
                if not initial_ids or with_initial or not neighbours:
                    rejoin_delay = s.join_retry_seconds
                elif time.monotonic() >= next_rejoin:
                    # Neighbours, but none of the initial peers: after a partition the ones left may all be
                    # on this side of it, or the swarm's hosts were down. Dial them again (with backoff).
                    self.shared.add("rejoin_attempts")
                    await self._join_once()
                    next_rejoin = time.monotonic() + rejoin_delay
                    rejoin_delay = min(rejoin_delay * 2, s.retry_cap)
                await asyncio.sleep(HEALTH_PERIOD)
                continue
            self.shared.set_network(up=False, dht_peers=[])
            self.shared.add("join_attempts")
            if await self._join_once():
                logger.info("joined the swarm through the initial or remembered peers")
                continue
            self.shared.add("join_failures")
            log = logger.debug if warned else logger.warning
            log("none of %d initial and remembered peers answered; training goes on locally, retrying in %.1f s",
                len(self._bootstrap_targets()), delay)
            warned = True
            await asyncio.sleep(delay)
            delay = min(delay * 2, s.retry_cap)

    def _note_change(self, had: list[str], neighbours: list[str]) -> None:
        """Log and trace losing every neighbour, and getting one back."""
        if had and not neighbours:
            with self.shared.lock:
                self.shared.lost_at = time.time()
            self.shared.trace.event("lost", had=len(had))
            logger.warning("lost every peer (had %d DHT neighbours); dialing the initial and remembered peers "
                           "again, every %.0f s at most; training goes on locally", len(had), self.settings.retry_cap)
        elif neighbours and not had:
            with self.shared.lock:
                lost_at, self.shared.lost_at = self.shared.lost_at, None
            self.shared.trace.event("up", neighbours=len(neighbours))
            if lost_at is not None:
                logger.warning("connected again after %.0f s: %d DHT neighbours", time.time() - lost_at,
                               len(neighbours))

    def _note_initial(self, with_initial: bool, peers: list[str]) -> None:
        """Log, trace and keep (for status pages) every initial peer going away, and one coming back: a member's
        initial peers are its swarm's hosts."""
        now = time.time()
        with self.shared.lock:
            lost_at = self.shared.initial_lost_at
            if not with_initial:
                self.shared.initial_lost_at = now
            elif lost_at is not None:
                self.shared.initial_lost_at, self.shared.initial_back = None, (now, now - lost_at)
        if not with_initial:
            self.shared.trace.event("initial_lost")
            logger.warning("no initial peer (the swarm's hosts) is a DHT neighbour any more; dialing them again, every "
                           "%.0f s at most", self.settings.retry_cap)
            return
        self.shared.trace.event("initial", peers=peers)
        if lost_at is not None:
            logger.warning("an initial peer (a host of the swarm) is back after %.0f s away", now - lost_at)

    def _bootstrap_targets(self) -> list[str]:
        """Full multiaddrs to dial when joining: the initial peers, the peers met before (remembered), and
        those reached while running; each once."""
        with self.shared.lock:
            met = self.shared.met_peers()
        return list(dict.fromkeys([*self.settings.initial_peers, *met]))

    async def _join_once(self) -> bool:
        """Dial every bootstrap target at once; whether any answered. When every host of a swarm is gone,
        the members it met still are."""
        maddrs = self._bootstrap_targets()
        targets = [(m, p) for m, p in zip(maddrs, map(parse_peer_maddr, maddrs)) if p is not None]
        results = await asyncio.gather(*(self._dial_and_ping(peer, addr) for _, (peer, addr) in targets))
        answered = [m for (m, _), ok in zip(targets, results) if ok]
        for (_, (peer, _)), ok in zip(targets, results):
            if not ok:
                self._unreachable(peer)
        if not answered:
            return False
        self._confirm(answered)
        with contextlib.suppress(*NETWORK_ERRORS):  # fill the routing table; best effort
            await asyncio.wait_for(
                self.dht.find_nearest_nodes([self.dht.node_id]), self.settings.request_timeout
            )
        return True

    async def _dial_and_ping(self, peer_id: PeerID, addr: Multiaddr) -> bool:
        if await self._port_closed(addr):
            return False
        if not await self._dial(peer_id, [addr]):
            return False
        return await self.dht.protocol.call_ping(peer_id) is not None
