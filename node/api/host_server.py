"""``HostApiServer``: a host's status page of its swarm, its JSON API, ``/healthz``, ``/metrics`` and the
descriptor, on one port (``swarm-node host``, ``api.port``).

Endpoints (JSON but ``/metrics``, ``/swarm.yaml`` and the page):

- ``GET /api/swarm``   the swarm (descriptor summary), this host (``label``: which of the descriptor's hosts),
                       its members with their counts over the last epochs (``?epochs=N``, at most 8) and since
                       first seen, and whether each is running (announced lately; ``members_running``), the
                       swarm's totals per epoch (``history``, the last ``?history=N`` epochs, at most 1440,
                       from the host's first start, each with its start time) and the other hosts' health
- ``GET /healthz``     200 while the host's network side runs and listens, else 503
- ``GET /metrics``     Prometheus text: members, connections, batches pulled, hand-offs, bytes, memory
- ``GET /swarm.yaml``  the signed descriptor, for members to join with (``swarm-node start --swarm URL``), with
                       the members this host reached that accept connections in comment lines (unsigned:
                       what a newcomer dials beside the hosts, so it joins while every host is down)
- ``GET /``            the status page (static files under ``/static/``, shared with the node's dashboard)

Nothing secret is served: what a member can read from the DHT anyway, and the public descriptor. Answers
are cached for a second and the serving thread's CPU is capped (``api.max_cpu_share``). Torch-free.
"""

from __future__ import annotations

import json
import resource
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from node.api.budget import CpuBudget
from node.api.threaded import ThreadedApp
from node.config.host import HostApiConfig
from node.config.join import with_members
from protocol.descriptor import SwarmDescriptor
from swarm.host import SwarmHost

__all__ = ["HostApiServer", "host_doc", "host_prometheus"]

STATIC_DIR = Path(__file__).parent / "static"  # the node's dashboard's files: one look for both pages
_TTL = 1.0
_MAX_EPOCHS = 8
_MAX_HISTORY = 1440
_JSON = "application/json"
_HEADERS = {"X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"}
_PAGE_HEADERS = {**_HEADERS, "Content-Security-Policy": "default-src 'self'; img-src 'self' data:"}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("swarm-node")
    except PackageNotFoundError:
        return "unknown"


def host_doc(host: SwarmHost, descriptor: SwarmDescriptor, epochs: int = 4, history: int = 60) -> dict[str, Any]:
    """``/api/swarm``: the descriptor's summary, the host's snapshot, the members, the swarm's history per epoch
    and the other hosts."""
    snap = host.snapshot(epochs, history)
    members = snap.pop("members")
    hosts = [{**h, "label": _label(descriptor, h["address"])} for h in snap.pop("hosts")]
    past = snap.pop("history")
    libp2p = host.transport.libp2p_id()
    own = next((h for h in descriptor.hosts if libp2p is not None and h.endswith("/p2p/" + libp2p)), None)
    return {
        "swarm": {"id": descriptor.swarm_id, "name": descriptor.name, "owner": descriptor.owner_fingerprint,
                  "protocol_version": descriptor.protocol_version, "expires": descriptor.expires.timestamp(),
                  "epoch_seconds": snap["epoch_seconds"], "hosts": list(descriptor.hosts),
                  "tasks": {"source": descriptor.tasks.source, "datasets": list(descriptor.tasks.datasets),
                            "config_hash": descriptor.tasks.config_hash}},
        "host": {**snap, "version": _version(), "uptime_s": round(snap["time"] - snap["started_at"], 1),
                 "rss_bytes": _rss_bytes(), "libp2p_id": libp2p, "address": own,
                 "label": _label(descriptor, own) if own is not None else "this host"},
        "members": members,
        "history": past,
        "hosts": hosts,
        "time": snap["time"],
    }


def _label(descriptor: SwarmDescriptor, address: str) -> str:
    """``host N of M``: where ``address`` stands in the descriptor's list of hosts."""
    hosts = list(descriptor.hosts)
    return f"host {hosts.index(address) + 1} of {len(hosts)}" if address in hosts else "a host"


def _rss_bytes() -> int:
    """This process's resident memory now (``/proc``), or its peak where ``/proc`` is missing."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * resource.getpagesize()
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def host_prometheus(doc: dict[str, Any]) -> bytes:
    """Prometheus text of ``host_doc``'s document: running totals as counters, the rest as gauges."""
    host, net, counters = doc["host"], doc["host"]["network"], doc["host"]["counters"]
    members = doc["members"]
    gauges = {
        "up": float(net["alive"]), "connected": float(net["connected"]), "dht_neighbours": net["neighbours"],
        "connections": net["connections"],
        "peers_connected": counters["peers_connected"], "members": len(members),
        "members_running": sum(1 for m in members if m["running"]),
        "members_natted": sum(1 for m in members if m["natted"]), "peers_banned": counters["peers_banned"],
        "other_hosts": len(doc["hosts"]), "other_hosts_up": sum(1 for h in doc["hosts"] if h["ok"]),
        "dht_store_bytes": counters["dht_store_bytes"], "rss_bytes": host["rss_bytes"],
        "batches_announced_recent": sum(m["announced"] for m in members),
    }
    totals = {k: counters[k] for k in ("batches_accepted", "batches_served", "handoffs_held", "handoffs_refused",
                                       "bytes_in", "bytes_out")}
    lines = []
    for name, value in gauges.items():
        lines += [f"# TYPE swarm_host_{name} gauge", f"swarm_host_{name} {float(value)}"]
    for name, value in totals.items():
        lines += [f"# TYPE swarm_host_{name}_total counter", f"swarm_host_{name}_total {float(value)}"]
    return ("\n".join(lines) + "\n").encode()


class HostApiServer(ThreadedApp):
    """The host's status page and API, served from a thread of its own."""

    def __init__(self, cfg: HostApiConfig, host: SwarmHost, descriptor: SwarmDescriptor) -> None:
        if cfg.port is None:
            raise ValueError("HostApiServer needs api.port (0 for any free port)")
        super().__init__(cfg.host, cfg.port, name="swarm-host-api", what="the host's status page", port_key="api.port")
        self.cfg = cfg
        self.host = host
        self.descriptor = descriptor
        self._yaml = descriptor.to_yaml()
        self._cache: dict[Any, tuple[float, bytes]] = {}
        self._budget = CpuBudget(cfg.max_cpu_share)

    def _app(self) -> web.Application:
        app = web.Application(middlewares=[self._pace], client_max_size=4096)
        app.router.add_get("/", self.get_index)
        app.router.add_get("/api/swarm", self.get_swarm)
        app.router.add_get("/healthz", self.get_healthz)
        app.router.add_get("/metrics", self.get_prometheus)
        app.router.add_get("/swarm.yaml", self.get_descriptor)
        app.router.add_static("/static/", STATIC_DIR, append_version=False)
        return app

    @web.middleware
    async def _pace(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        await self._budget.wait()
        return await handler(request)

    def _cached(self, key: Any, build: Callable[[], bytes]) -> bytes:
        now = time.monotonic()
        hit = self._cache.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        body = build()
        if len(self._cache) > 32:
            self._cache.clear()
        self._cache[key] = (now + _TTL, body)
        return body

    def _doc(self, epochs: int, history: int) -> bytes:
        doc = host_doc(self.host, self.descriptor, epochs, history)
        return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()

    async def get_index(self, _request: web.Request) -> web.StreamResponse:
        return web.FileResponse(STATIC_DIR / "host.html", headers=_PAGE_HEADERS)

    async def get_swarm(self, request: web.Request) -> web.Response:
        try:
            epochs = max(1, min(_MAX_EPOCHS, int(request.query.get("epochs", "4"))))
            history = max(1, min(_MAX_HISTORY, int(request.query.get("history", "60"))))
        except ValueError:
            return web.Response(status=400, body=b'{"error":"epochs and history must be integers"}',
                                content_type=_JSON, headers=_HEADERS)
        body = self._cached(("swarm", epochs, history), lambda: self._doc(epochs, history))
        return web.Response(body=body, content_type=_JSON, headers=_HEADERS)

    async def get_healthz(self, _request: web.Request) -> web.Response:
        transport = self.host.transport
        addrs = transport.visible_multiaddrs()
        ok = transport.is_alive() and bool(addrs)
        doc = {"ok": ok, "listening": addrs, "reason": transport.network_status().reason}
        return web.Response(status=200 if ok else 503, body=json.dumps(doc).encode(), content_type=_JSON,
                            headers=_HEADERS)

    async def get_prometheus(self, _request: web.Request) -> web.Response:
        body = self._cached("prometheus", lambda: host_prometheus(host_doc(self.host, self.descriptor)))
        return web.Response(body=body, headers={**_HEADERS, "Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    def _descriptor_text(self) -> bytes:
        """The signed descriptor, with the members this host reached that accept connections listed in comment
        lines (``node.config.join.listed_members``): a newcomer that starts from a saved copy while every host
        is down joins through them."""
        hosts = {h.rpartition("/p2p/")[2] for h in self.descriptor.hosts}
        members = [m for m in self.host.transport.remembered_maddrs() if m.rpartition("/p2p/")[2] not in hosts]
        return with_members(self._yaml, members).encode()

    async def get_descriptor(self, _request: web.Request) -> web.Response:
        body = self._cached("descriptor", self._descriptor_text)
        return web.Response(body=body, headers={**_HEADERS, "Content-Type": "application/yaml; charset=utf-8"})
