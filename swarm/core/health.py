"""Health: watch p2pd, refresh this node's visible addresses (a relay reservation adds a circuit
address), and once an epoch prune what the other jobs keep per epoch."""

from __future__ import annotations

import asyncio
import logging
import time

from hivemind.utils import get_dht_time

from swarm.core.base import HEALTH_PERIOD, NETWORK_ERRORS, CoreBase, order_maddrs
from swarm.hivemind_compat import p2pd_exited
from swarm.keys import epoch_at

logger = logging.getLogger(__name__)

_MADDR_REFRESH_TICKS = 5  # health ticks between two refreshes of this node's visible addresses


class NetworkDiedError(Exception):
    """p2pd exited under us; the core stops so the facade can restart it."""


class HealthMixin(CoreBase):
    """The health loop of ``SwarmCore``."""

    async def _health_loop(self) -> None:
        last_epoch = -1
        tick = 0
        while True:
            await asyncio.sleep(HEALTH_PERIOD)
            if p2pd_exited(self.p2p):
                raise NetworkDiedError("p2pd exited")
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
        """Ask p2pd for this node's addresses again (a relay reservation adds a circuit address; the address a
        peer reached this node at stays first) and for the peers it has a connection with."""
        try:
            found = await asyncio.wait_for(self.p2p.get_visible_maddrs(latest=True), self.settings.request_timeout)
            peers = await asyncio.wait_for(self.p2p.list_peers(), self.settings.request_timeout)
        except (*NETWORK_ERRORS, ValueError) as exc:
            logger.debug("refreshing visible addresses failed: %r", exc)
            return
        maddrs = order_maddrs([str(m) for m in found], self._relayed)
        neighbours = set(self._neighbours())
        with self.shared.lock:
            self.shared.visible_maddrs = list(dict.fromkeys([*self.shared.reachable_at, *maddrs]))
            self.shared.connections = len({info.peer_id for info in peers})
            if self.shared.client:
                # Nobody dials a node in client mode: every connection it has, it opened, at the address the
                # peer listens on. Its DHT neighbours' are where it hands its batches when its hosts are gone.
                now = time.time()
                for info in peers:
                    peer = info.peer_id.to_base58()
                    if peer in neighbours:
                        self.shared.book.confirmed([f"{a}/p2p/{peer}" for a in info.addrs], now)

