"""Shutting the network side down in bounded time: cancel every task (again if one drops a
cancellation), then stop p2pd, killing it if it does not exit."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from hivemind.p2p import P2P

from swarm.core.base import NETWORK_ERRORS
from swarm.hivemind_compat import p2pd_process
from swarm.watchdog import P2pdWatchdog

logger = logging.getLogger(__name__)

_CANCEL_AGAIN_SECONDS = 0.2  # on shutdown, how often a task that is still running is cancelled again


async def cancel_all(tasks: list[asyncio.Task[Any]], timeout: float) -> None:
    """Cancel ``tasks`` and wait for them, cancelling again those still running every short while.

    One cancellation is not always enough on Python 3.11: ``asyncio.wait_for`` drops it when its inner
    awaitable finishes at the same moment, and a loop that goes on after that would keep the network
    thread (and its p2pd) alive until it is killed. Bounded by ``timeout``; what is left then is named.
    """
    pending = {task for task in tasks if not task.done()}
    deadline = time.monotonic() + timeout
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=_CANCEL_AGAIN_SECONDS)
        if pending and time.monotonic() > deadline:
            logger.warning("network tasks still running after cancellation: %s",
                           ", ".join(sorted(task.get_name() for task in pending)))
            return
    for task in tasks:  # retrieve their exceptions (they were logged where they matter)
        if not task.cancelled():
            task.exception()


async def shutdown_p2p(p2p: P2P, watchdog: P2pdWatchdog | None, *, timeout: float) -> None:
    child = p2pd_process(p2p)
    with contextlib.suppress(*NETWORK_ERRORS):
        await asyncio.wait_for(p2p.shutdown(), timeout)
    if child is not None and child.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            child.kill()
        with contextlib.suppress(*NETWORK_ERRORS):
            await asyncio.wait_for(child.wait(), timeout)
    if watchdog is not None:
        watchdog.stop()
