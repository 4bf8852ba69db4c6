"""``SwarmCore``: the async side of one node, composed of its jobs (``join``, ``publish``, ``pull``,
``serve``, ``health``, ``reach``; a host's ``census`` too); here it is started (``create``), run (``run``: the
loops until stopped or one fails) and shut down (``shutdown``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping

from hivemind.dht.node import DHTNode
from hivemind.p2p import P2P

from protocol.identity import Identity
from protocol.limits import Limits
from swarm.core.base import NETWORK_ERRORS, describe_error, order_maddrs
from swarm.core.census import CensusMixin
from swarm.core.health import HealthMixin
from swarm.core.join import JoinMixin
from swarm.core.publish import PublishMixin
from swarm.core.pull import PullMixin
from swarm.core.reach import ReachMixin, reach_handler_name
from swarm.core.serve import ServeMixin
from swarm.core.shutdown import cancel_all, shutdown_p2p
from swarm.hivemind_compat import count_dht_requests, own_session_p2pd, p2pd_flags, p2pd_pid
from swarm.settings import SwarmSettings
from swarm.state import SharedState
from swarm.validator import ManifestValidator
from swarm.watchdog import P2pdWatchdog

logger = logging.getLogger(__name__)


class SwarmCore(JoinMixin, PublishMixin, PullMixin, CensusMixin, ReachMixin, ServeMixin, HealthMixin):
    """One node's P2P, DHT node and background loops. Build with ``await SwarmCore.create(...)``."""

    @classmethod
    async def create(
        cls,
        settings: SwarmSettings,
        identity: Identity,
        limits: Limits,
        shared: SharedState,
        validator: ManifestValidator,
        p2pd_options: Mapping[str, object] | None = None,
    ) -> SwarmCore:
        """Start p2pd (in its own session, with an orphan watchdog; ``p2pd_options``: more of its flags, e.g.
        a host's connection limits) and a DHT node; joining peers happens in ``run``. A Ctrl-C at the node's
        terminal reaches the node, not p2pd: the node shuts it down."""
        own_session_p2pd()
        client = settings.starts_as_client  # ``auto`` starts in client mode too, until a peer dials it back
        with shared.lock:  # a restarted network side checks again
            shared.client, shared.reachable_at, shared.reach = client, [], ""
        relayed = settings.client_mode is True and settings.nat_sharing == "relay"
        with p2pd_flags(p2pd_options or {}):
            p2p = await cls._start_p2pd(settings, client=client, relayed=relayed)
        pid = p2pd_pid(p2p)
        watchdog = P2pdWatchdog(pid) if pid is not None else None
        started = False
        try:  # p2pd must not outlive a failure (or cancellation) below
            dht = await DHTNode.create(
                p2p=p2p,
                client_mode=client,
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
            if not client:
                if settings.accept_handoffs:
                    await p2p.add_binary_stream_handler(self._put_handler, self.rpc_put_batch)
                await p2p.add_binary_stream_handler(reach_handler_name(settings.swarm_id), self.rpc_reach)
            try:
                maddrs = order_maddrs([str(m) for m in await p2p.get_visible_maddrs()], relayed)
            except ValueError:  # behind NAT with a relay: no address until a reservation is made
                maddrs = []
            started = True
        finally:
            if not started:
                await shutdown_p2p(p2p, watchdog, timeout=settings.request_timeout)
        with shared.lock:
            shared.visible_maddrs = maddrs
        shared.trace.event("start", client=client)
        if settings.client_mode == "auto" and client:
            logger.info("network side started in client mode until a peer can dial this node back (client_mode: "
                        "auto); not connected until a peer answers")
        elif client:  # dials out only: nobody can join through this node
            logger.info("network side started in client mode (dials out only; not connected until a peer answers)")
        else:
            logger.info("network side listening (not connected until a peer answers); others can join with: %s",
                        " ".join(maddrs))
        return self

    @staticmethod
    async def _start_p2pd(settings: SwarmSettings, *, client: bool, relayed: bool) -> P2P:
        """p2pd, listening and announcing as ``settings`` say; a DHT server unless in client mode (``auto``:
        libp2p's own DHT follows what its AutoNAT finds)."""
        auto = settings.client_mode == "auto"
        return await P2P.create(
            host_maddrs=settings.host_maddrs,
            announce_maddrs=settings.announce_maddrs or None,
            dht_mode="auto" if auto else "client" if client else "server",
            startup_timeout=settings.startup_timeout,
            identity_path=settings.p2p_identity_path,
            check_if_identity_free=False,
            # Behind NAT with a relay: reserve a slot on the initial peers (trusted, static relays) at once
            # instead of waiting for AutoNAT to find out that nobody can dial in.
            # A reachable node says so at once, which also starts its relay service for such peers.
            use_auto_relay=relayed,
            force_reachability="private" if relayed else (None if client or auto else "public"),
            trusted_relays=settings.initial_peers if relayed else None,
        )

    # -- lifecycle ----------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Run the background loops until ``stop`` is set or one of them fails (p2pd died, a bug)."""
        loops = [
            asyncio.create_task(self._join_loop(), name="swarm-join"),
            asyncio.create_task(self._publish_loop(), name="swarm-publish"),
            asyncio.create_task(self._collect_loop(), name="swarm-collect"),
            asyncio.create_task(self._health_loop(), name="swarm-health"),
            asyncio.create_task(self._reach_loop(), name="swarm-reach"),
        ]
        if self.shared.members is not None:  # a host: count what it missed while it was away
            loops.append(asyncio.create_task(self._census_loop(), name="swarm-census"))
        stopper = asyncio.create_task(stop.wait(), name="swarm-stop")
        try:
            done, _ = await asyncio.wait([*loops, stopper], return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                exc = None if task is stopper or task.cancelled() else task.exception()
                if exc is not None:
                    logger.error("swarm network loop %s failed: %r", task.get_name(), exc)
                    self.shared.set_error(describe_error(exc))
        finally:
            await cancel_all([*loops, stopper, *self._pulls, *self._background], self.settings.request_timeout)

    async def shutdown(self) -> None:
        """Stop the DHT node and p2pd (bounded); kill p2pd if it does not exit."""
        self.shared.set_network(up=False, dht_peers=[])
        with contextlib.suppress(*NETWORK_ERRORS):
            await asyncio.wait_for(self.dht.shutdown(), self.settings.request_timeout)
        await shutdown_p2p(self.p2p, self.watchdog, timeout=self.settings.request_timeout)
