"""``SwarmHost``: a member of a swarm without a model, that others join through.

It runs the same network side as a training node (``SwarmTransport``: one p2pd, a DHT server, the
record validator) and publishes nothing. What makes it a host:

* a stable address: a libp2p key file and a fixed port (``settings.p2p_identity_path``, ``host_maddrs``),
  announced as the swarm's descriptor names it (an IP or a DNS name), so a restarted host is the same peer;
* it holds what members behind NAT hand over (``rpc_put_batch``, within ``swarm.handoff``'s quotas per
  author and in total) and relays connections for them (p2pd's circuit relay service);
* limits in p2pd as well as in the DHT: total connections (the connection manager), relayed circuits per
  peer and reservations in total (``HostLimits``), on top of the DHT storage and hand-off bounds;
* a view of the swarm (``MemberTable``): every manifest it reads and every batch it pulls or is handed,
  for its status page, kept across a restart in a small file (``state_path``, saved within ``save_every``
  seconds of a change, every epoch and at close, so a host killed with ``kill -9`` loses seconds of it); the
  epochs it missed while down, and what it lost of the epoch in progress, are read again from the DHT once
  it has a neighbour (``swarm.core.census``); and the health of the swarm's other hosts, pinged every
  ``health_every`` seconds.

A host is *connected* when members answer it: a peer has a connection open with it (a member in client
mode, which is never a DHT neighbour, included) or is its DHT neighbour.

The batches the network side verifies go to the member table, not to an inbox (the host trains on none:
it only reads who sent them). A thread of its own pings the other hosts and prunes old epochs; every
call here is thread-safe and returns quickly.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from protocol.identity import Identity
from swarm.members import MemberTable
from swarm.settings import SwarmSettings
from swarm.transport import SwarmTransport

__all__ = ["HostLimits", "SwarmHost"]

logger = logging.getLogger(__name__)

_TICK_SECONDS = 1.0


@dataclass(frozen=True)
class HostLimits:
    """What p2pd allows others on a host, beyond the DHT's own bounds."""

    max_connections: int = 512
    """Connections kept open at most (p2pd's connection manager trims to half beyond this)."""
    relay_circuits_per_peer: int = 4
    """Relayed connections open at once through this host, per peer."""
    relay_reservations: int = 128
    """Peers behind NAT that may hold a relay slot here at once."""
    relay_bytes: int = 64 * 1024 * 1024
    """Bytes one relayed connection may carry each way before it is reset."""
    relay_seconds: int = 600
    """How long one relayed connection may stay open."""

    def p2pd_flags(self) -> dict[str, object]:
        return {"connManager": True, "connHi": self.max_connections, "connLo": max(1, self.max_connections // 2),
                "relayService": True, "relayMaxCircuits": self.relay_circuits_per_peer,
                "relayMaxReservations": self.relay_reservations, "relayDataLimit": self.relay_bytes,
                "relayTimeLimit": f"{self.relay_seconds}s"}


@dataclass
class HostHealth:
    """Another host of the swarm, as this one last saw it."""

    address: str
    ok: bool | None = None
    """None until it was checked."""
    rtt_s: float | None = None
    checked_at: float | None = None
    last_ok_at: float | None = None


class SwarmHost:
    """A model-less host: ``start``, ``snapshot`` (for status pages), ``close``."""

    def __init__(self, settings: SwarmSettings, identity: Identity, *, other_hosts: list[str],
                 limits: HostLimits | None = None, health_every: float = 30.0, max_members: int = 1024,
                 state_path: str | os.PathLike[str] | None = None, save_every: float = 5.0) -> None:
        """``state_path``: the file the member table is kept in across restarts (None: not kept), written within
        ``save_every`` seconds of a change."""
        if settings.client_mode is not False:
            raise ValueError("a host accepts connections: client_mode must be false")
        self.settings = settings
        self.identity = identity
        self.limits = limits or HostLimits()
        self.members = MemberTable(max_members=max_members, keep_epochs=max(8, settings.read_epochs + 2))
        self.state_path = None if state_path is None else Path(state_path)
        self._load_state()
        self.transport = SwarmTransport(settings, identity, members=self.members,
                                        p2pd_options=self.limits.p2pd_flags())
        self.health_every = health_every
        self.hosts = [HostHealth(address) for address in other_hosts]
        self.started_at = time.time()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._epoch = -1
        self.save_every = save_every
        self._saved = (self.members.changes, time.monotonic())  # changes at the last save, and when

    def start(self) -> None:
        """Start the network side and the host's own thread (neither waits for peers)."""
        self.transport.start(wait=False)
        self._thread = threading.Thread(target=self._loop, name="swarm-host", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the host's thread and the network side (bounded); save the member table."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.settings.request_timeout + 5)
        self.transport.close()
        self.save_state()

    def _load_state(self) -> None:
        if self.state_path is None:
            return
        try:
            self.members.load_json(json.loads(self.state_path.read_text(encoding="utf-8")))
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            logger.warning("cannot read the member history %s (%s); starting without it", self.state_path, exc)

    def save_state(self) -> None:
        """Write the member table to ``state_path`` (atomically; a failure is logged, the host goes on)."""
        if self.state_path is None:
            return
        tmp = self.state_path.with_name(self.state_path.name + ".tmp")
        self._saved = (self.members.changes, time.monotonic())
        try:
            tmp.write_text(json.dumps(self.members.to_json(), separators=(",", ":")), encoding="utf-8")
            os.replace(tmp, self.state_path)
        except OSError as exc:
            logger.warning("cannot save the member history to %s: %s", self.state_path, exc)
            with contextlib.suppress(OSError):
                tmp.unlink()

    def wait_until_listening(self, timeout: float) -> list[str]:
        """This host's full multiaddrs once p2pd listens (empty if not within ``timeout``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self._stop.is_set():
            addrs = self.transport.visible_multiaddrs()
            if addrs:
                return addrs
            time.sleep(0.1)
        return self.transport.visible_multiaddrs()

    # -- the host's thread ---------------------------------------------------------------------------

    def _loop(self) -> None:
        next_check = time.monotonic()
        while not self._stop.wait(_TICK_SECONDS):
            try:
                self.tick()
                if self.hosts and time.monotonic() >= next_check:
                    self.check_hosts()
                    next_check = time.monotonic() + self.health_every
            except Exception:  # a bug here must not take the host down with it
                logger.exception("host tick failed")

    def tick(self) -> None:
        """Prune the member table's old epochs; save it when it changed ``save_every`` seconds ago or more."""
        current = self.transport.current_epoch()
        if current != self._epoch:
            self._epoch = current
            self.members.prune(current)
        changes, at = self._saved
        if self.members.changes != changes and time.monotonic() - at >= self.save_every:
            self.save_state()

    def check_hosts(self) -> None:
        """Ping every other host of the swarm once (each bounded by ``2 * request_timeout``)."""
        for host in self.hosts:
            if self._stop.is_set():
                return
            rtt = self.transport.ping(host.address)
            with self._lock:
                host.ok, host.rtt_s, host.checked_at = rtt is not None, rtt, time.time()
                if rtt is not None:
                    host.last_ok_at = host.checked_at

    # -- what a status page shows -----------------------------------------------------------------------

    def snapshot(self, epochs: int = 4, history: int = 60) -> dict[str, Any]:
        """The host, the swarm's members and the other hosts, as plain data (JSON-ready); ``history``: how many
        epochs of the swarm's totals."""
        network = self.transport.network_status()
        stats = self.transport.stats()
        with self._lock:
            hosts = [{"address": h.address, "ok": h.ok, "rtt_s": None if h.rtt_s is None else round(h.rtt_s, 4),
                      "checked_at": h.checked_at, "last_ok_at": h.last_ok_at} for h in self.hosts]
        current = self.transport.current_epoch()
        seconds = self.settings.epoch_seconds
        keys = ("peers_connected", "connections", "batches_accepted", "batches_served", "handoffs_held",
                "handoffs_refused", "bytes_in", "bytes_out", "dht_store_bytes", "peers_banned", "offences",
                "batches_rejected", "census_new")
        alive = self.transport.is_alive()
        answering = network.up and (bool(network.neighbours) or network.connections > 0)
        reason = network.reason
        members = self.members.rows(current, epochs, seconds)
        if network.up and not network.neighbours and network.connections:
            reason = f"{network.connections} peer(s) connected, none a DHT server (members in client mode)"
        return {
            "swarm_id": self.settings.swarm_id, "peer_id": self.identity.peer_id,
            "addresses": self.transport.visible_multiaddrs(), "started_at": self.started_at, "time": time.time(),
            "epoch": current, "epoch_seconds": seconds, "epoch_start": current * seconds,
            "network": {"up": network.up, "connected": alive and answering, "reason": reason,
                        "neighbours": len(network.neighbours), "connections": network.connections,
                        "restarts": network.restarts, "last_error": network.last_error, "alive": alive},
            "counters": {k: stats[k] for k in keys},
            "members": members, "members_running": sum(1 for m in members if m["running"]),
            "since": self.members.since,
            "history": self.members.history(current, history, seconds),
            "hosts": hosts,
        }
