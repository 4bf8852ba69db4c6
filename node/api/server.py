"""``ApiServer``: the status API, Prometheus ``/metrics`` and the dashboard, on one port.

An aiohttp application in its own daemon thread with its own event loop, so no request ever runs on the
training thread. Handlers read only the ``StatusBoard``'s immutable snapshots, the metrics file and the
transport's thread-safe ``network_status()`` / ``peer_stats()``; never the model, never torch. Answers are
cached for a moment (``_TTL``): a crowd of dashboards costs the node one document a second, not one per
request. ``start()`` raises ``ConfigError`` when the address cannot be bound; ``stop()`` is bounded.

Endpoints (all JSON but ``/metrics`` and the dashboard):

- ``GET /api/status``            the node: identity, step, reward, eval, tokens/s, network and why
- ``GET /api/metrics?since=S``   the rows of ``metrics.jsonl`` after step S (``limit``, at most 10000)
- ``GET /api/peers``             per-peer accepted / rejected / bytes / last seen / banned until; own counts
- ``GET /healthz``               200 while the loop made progress within ``api.stall_seconds``, else 503
- ``GET /metrics``               Prometheus text exposition of the last row (counters and gauges)
- ``GET /``                      the dashboard (static files under ``/static/``; no data in them)

With a token configured, everything but the dashboard's static files needs ``Authorization: Bearer``.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from node.api.board import StatusBoard
from node.api.budget import CpuBudget
from node.api.metrics import render_prometheus
from node.api.metrics_index import MetricsIndex
from node.api.threaded import ThreadedApp
from node.api.views import health_doc, peers_doc, status_doc
from node.config import ApiConfig
from node.exchange.exchange import BatchTransport

logger = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).parent / "static"
MAX_ROWS = 10_000
_TTL = 1.0  # seconds a computed answer is served again before it is rebuilt
_JSON = "application/json"
_PROMETHEUS_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_HEADERS = {"X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"}
_PAGE_HEADERS = {**_HEADERS, "Content-Security-Policy": "default-src 'self'; img-src 'self' data:"}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _dumps(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()


class ApiServer(ThreadedApp):
    """``start()`` binds and serves in a background thread; ``url`` and ``port`` tell where."""

    def __init__(self, cfg: ApiConfig, board: StatusBoard, metrics_path: str | Path, *,
                 transport: BatchTransport | None = None) -> None:
        if cfg.port is None:
            raise ValueError("ApiServer needs api.port (0 for any free port)")
        super().__init__(cfg.host, cfg.port, name="swarm-node-api", what="the status API", port_key="api.port")
        self.cfg = cfg
        self.board = board
        self.transport = transport
        self.index = MetricsIndex(metrics_path)
        self._token = cfg.token.encode() if cfg.token else None
        self._cache: dict[Any, tuple[float, bytes]] = {}
        self._budget = CpuBudget(cfg.max_cpu_share)

    # -- the application ------------------------------------------------------------------------------

    def _app(self) -> web.Application:
        app = web.Application(middlewares=[self._pace, self._auth], client_max_size=4096)
        app.router.add_get("/", self.get_index)
        app.router.add_get("/api/status", self.get_status)
        app.router.add_get("/api/metrics", self.get_metrics_rows)
        app.router.add_get("/api/peers", self.get_peers)
        app.router.add_get("/healthz", self.get_healthz)
        app.router.add_get("/metrics", self.get_prometheus)
        app.router.add_static("/static/", STATIC_DIR, append_version=False)
        return app

    @web.middleware
    async def _pace(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        await self._budget.wait()
        return await handler(request)

    @web.middleware
    async def _auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self._token is not None and not _is_public(request.path):
            header = request.headers.get("Authorization", "")
            scheme, _, given = header.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), self._token):
                return web.Response(status=401, body=_dumps({"error": "missing or wrong bearer token"}),
                                    content_type=_JSON, headers={**_HEADERS, "WWW-Authenticate": "Bearer"})
        return await handler(request)

    def _cached(self, key: Any, build: Callable[[], bytes]) -> bytes:
        now = time.monotonic()
        hit = self._cache.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        body = build()
        if len(self._cache) > 64:
            self._cache.clear()
        self._cache[key] = (now + _TTL, body)
        return body

    def _network(self) -> Any:
        return None if self.transport is None else self.transport.network_status()

    async def get_index(self, _request: web.Request) -> web.StreamResponse:
        return web.FileResponse(STATIC_DIR / "index.html", headers=_PAGE_HEADERS)

    async def get_status(self, _request: web.Request) -> web.Response:
        body = self._cached("status", lambda: _dumps(status_doc(self.board, self._network(), self.cfg.stall_seconds)))
        return web.Response(body=body, content_type=_JSON, headers=_HEADERS)

    async def get_peers(self, _request: web.Request) -> web.Response:
        def build() -> bytes:
            rows = [] if self.transport is None else self.transport.peer_stats()
            return _dumps(peers_doc(self.board, rows, self._network()))

        return web.Response(body=self._cached("peers", build), content_type=_JSON, headers=_HEADERS)

    async def get_healthz(self, _request: web.Request) -> web.Response:
        ok, doc = health_doc(self.board, self.cfg.stall_seconds)
        return web.Response(status=200 if ok else 503, body=_dumps(doc), content_type=_JSON, headers=_HEADERS)

    async def get_metrics_rows(self, request: web.Request) -> web.Response:
        try:
            since = int(request.query.get("since", "0"))
            limit = int(request.query.get("limit", str(MAX_ROWS)))
        except ValueError:
            return web.Response(status=400, body=_dumps({"error": "since and limit must be integers"}),
                                content_type=_JSON, headers=_HEADERS)
        limit = max(1, min(limit, MAX_ROWS))
        step = self.board.snapshot.step if self.board.snapshot is not None else 0

        def build() -> bytes:
            rows, more = self.index.rows_after(since, limit)
            head = _dumps({"since": since, "more": more})[:-1]
            return head + b',"rows":[' + b",".join(rows) + b"]}"

        body = self._cached(("rows", since, limit, step), build)
        return web.Response(body=body, content_type=_JSON, headers=_HEADERS)

    async def get_prometheus(self, _request: web.Request) -> web.Response:
        def build() -> bytes:
            snap = self.board.snapshot
            network = self._network()
            ok, health = health_doc(self.board, self.cfg.stall_seconds)
            gauges = {"healthy": float(ok), "seconds_since_progress": health["seconds_since_progress"]}
            if network is not None:
                gauges.update({"connected": float(network.connected), "network_restarts": float(network.restarts),
                               "dht_neighbours": float(len(network.neighbours))})
            record = dict(snap.record) if snap is not None else {}
            for live in ("connected", "dht_neighbours"):  # the live values above, not those of the last step
                record.pop(live, None)
            return render_prometheus(record, gauges)

        return web.Response(body=self._cached("prometheus", build),
                            headers={**_HEADERS, "Content-Type": _PROMETHEUS_TYPE})


def _is_public(path: str) -> bool:
    return path == "/" or path.startswith("/static/") or path == "/favicon.ico"
