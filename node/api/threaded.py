"""``ThreadedApp``: an aiohttp application served from a daemon thread with its own event loop.

The base of the node's status API (``node.api.server``) and a host's status page
(``node.api.host_server``): no request ever runs on the caller's thread. ``start()`` binds (a port that
cannot be bound is a ``ConfigError`` naming the config key), ``stop()`` is bounded; a subclass builds its
``web.Application`` in ``_app()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading

from aiohttp import web

from node.errors import ConfigError

__all__ = ["ThreadedApp"]

logger = logging.getLogger(__name__)


class ThreadedApp:
    """Serve ``_app()`` on ``bind_host:bind_port`` (0: any free port) from a thread; ``url`` says where."""

    def __init__(self, bind_host: str, bind_port: int, *, name: str, what: str, port_key: str) -> None:
        self.bind_host = bind_host
        self.bind_port = bind_port
        self.port = 0
        self._name, self._what, self._port_key = name, what, port_key
        self._thread: threading.Thread | None = None
        self.thread_native_id: int | None = None  # for tools that watch the serving thread's CPU time
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: Exception | None = None

    def _app(self) -> web.Application:
        raise NotImplementedError

    @property
    def url(self) -> str:
        host = f"[{self.bind_host}]" if ":" in self.bind_host else self.bind_host
        return f"http://{host}:{self.port}/"

    def start(self, timeout: float = 30.0) -> None:
        ready = threading.Event()
        self._thread = threading.Thread(target=self._thread_main, args=(ready,), name=self._name, daemon=True)
        self._thread.start()
        if not ready.wait(timeout):
            raise RuntimeError(f"{self._what} did not start within {timeout:.0f} s")
        if isinstance(self._error, OSError):  # in use, not ours to bind, a host name that does not resolve
            self._thread.join(timeout)
            raise ConfigError(f"{self._port_key}: cannot listen on {self.bind_host}:{self.bind_port} ({self._error}); "
                              f"choose another port, or {self._port_key}=0 for any free one") from None
        if self._error is not None:
            self._thread.join(timeout)
            raise RuntimeError(f"{self._what} failed to start") from self._error

    def stop(self, timeout: float = 10.0) -> None:
        """Close the listening socket and open connections, stop the loop, join the thread (bounded)."""
        thread, loop, stop = self._thread, self._loop, self._stop
        self._thread = None
        if thread is None:
            return
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop already closed
                loop.call_soon_threadsafe(stop.set)
        thread.join(timeout)
        if thread.is_alive():
            logger.warning("%s thread did not stop within %.0f s", self._what, timeout)

    def _thread_main(self, ready: threading.Event) -> None:
        self.thread_native_id = threading.get_native_id()
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop, self._stop = loop, asyncio.Event()
        runner = web.AppRunner(self._app(), access_log=None, handle_signals=False, shutdown_timeout=2.0)
        try:
            loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, self.bind_host, self.bind_port, backlog=512, reuse_address=True)
            loop.run_until_complete(site.start())
            self.port = int(runner.addresses[0][1])  # the bound port, also when asked for 0
        except Exception as exc:  # handed to start(), in the caller's thread
            self._error = exc
            loop.run_until_complete(runner.cleanup())
            loop.close()
            ready.set()
            return
        ready.set()
        try:
            loop.run_until_complete(self._stop.wait())
        finally:
            loop.run_until_complete(runner.cleanup())
            loop.close()
