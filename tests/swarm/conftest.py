"""Fixtures for swarm tests: real transports on 127.0.0.1, always closed, and a p2pd leak check."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator

import psutil
import pytest

from protocol.identity import Identity
from swarm.settings import SwarmSettings
from swarm.transport import SwarmTransport

SWARM_ID = "test-swarm"
_P2PD_PIDS: set[int] = set()


def p2pd_pid(transport: SwarmTransport) -> int:
    pid = transport.p2pd_pid()
    assert pid is not None, "the transport's network side is not running"
    _P2PD_PIDS.add(pid)
    return pid


def _live_p2pd(pids: set[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            if proc.status() != psutil.STATUS_ZOMBIE and "p2pd" in proc.name():
                alive.append(pid)
        except psutil.NoSuchProcess:
            continue
    return alive


@pytest.fixture(scope="session", autouse=True)
def no_p2pd_left() -> Iterator[None]:
    """After the session: no p2pd started by these tests, nor any p2pd child of this process, is left."""
    yield
    deadline = time.monotonic() + 10
    children = {p.pid for p in psutil.Process().children(recursive=True) if "p2pd" in p.name()}
    while _live_p2pd(_P2PD_PIDS | children) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _live_p2pd(_P2PD_PIDS | children), "p2pd processes outlived the test session"


def started_transport(settings: SwarmSettings) -> Iterator[SwarmTransport]:
    """A transport with its own identity, started and waited for; closed when the generator is."""
    transport = SwarmTransport(settings, Identity.generate())
    try:
        transport.start(wait=True)
        p2pd_pid(transport)
        yield transport
    finally:
        transport.close()


def fast_settings(**overrides: object) -> SwarmSettings:
    base: dict[str, object] = {
        "swarm_id": SWARM_ID,
        "collect_interval": 0.2,
        "request_timeout": 3.0,
        "startup_timeout": 20.0,
        "join_retry_seconds": 0.5,
        "join_retry_max_seconds": 2.0,
    }
    base.update(overrides)
    return SwarmSettings.model_validate(base)


@pytest.fixture
def make_transport() -> Iterator[Callable[..., SwarmTransport]]:
    """Start transports on demand; every one is closed at teardown, whatever happened."""
    started: list[SwarmTransport] = []

    def make(identity: Identity | None = None, *, wait: bool = True, **overrides: object) -> SwarmTransport:
        transport = SwarmTransport(fast_settings(**overrides), identity or Identity.generate())
        started.append(transport)
        transport.start(wait=wait)
        if wait:
            p2pd_pid(transport)
        return transport

    yield make
    for transport in started:
        transport.close()
    # Run hivemind's and asyncio's finalizers (P2P.__del__, subprocess transports) now: left to a later
    # random GC they may fire inside pytest's assertion rewriter, where CPython 3.11 < 3.11.8 then
    # raises "SystemError: AST constructor recursion depth mismatch".
    gc.collect()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for tests that need a fixed port)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_for(predicate: Callable[[], bool], timeout: float = 15.0, period: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(period)
    return predicate()
