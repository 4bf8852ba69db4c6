"""``CpuBudget``: keeps an API thread's CPU time under a share of one core (requests wait, in line).

Shared by the training node's status API (``node.api.server``) and a host's status page
(``node.api.host_server``); torch-free.
"""

from __future__ import annotations

import asyncio
import time

__all__ = ["CpuBudget"]

_MIN_PAUSE = 0.1  # seconds; the shortest wait of a request held back by the CPU budget


class CpuBudget:
    """Keeps the API thread's CPU time under ``share`` of one core: a request waits (in line, without
    polling) while the thread has used more than its share. The training thread shares the process, its
    GIL and the machine's cores with this one, so a crowd of clients gets slower answers, never a slower node.
    """

    def __init__(self, share: float, burst_seconds: float = 0.05) -> None:
        self.share = share
        self.burst = burst_seconds  # CPU seconds that may be spent at once after a quiet spell
        self._tokens = burst_seconds
        self._wall = 0.0
        self._cpu: float | None = None  # read in the serving thread: thread_time() is per thread
        self._line = asyncio.Lock()

    def _refill(self) -> None:
        wall, cpu = time.monotonic(), time.thread_time()  # this thread's CPU: parsing, handlers, writing
        if self._cpu is not None:
            self._tokens = min(self.burst, self._tokens + self.share * (wall - self._wall) - (cpu - self._cpu))
        self._wall, self._cpu = wall, cpu

    async def wait(self) -> None:
        async with self._line:
            self._refill()
            while self._tokens < 0:  # pauses of at least _MIN_PAUSE: few wake-ups, answers in bursts
                await asyncio.sleep(max(_MIN_PAUSE, -self._tokens / self.share))
                self._refill()
