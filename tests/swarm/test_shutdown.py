"""Shutting the network side down: every task stops, even one that dropped its first cancellation (pure
asyncio; the transports' own shutdown is exercised by every test that closes one)."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from swarm.core.shutdown import cancel_all as _cancel_all


async def _loop_that_drops_one_cancellation(ticks: list[int]) -> None:
    """What ``asyncio.wait_for`` on Python 3.11 can do to a loop: the first cancellation is lost, and the
    loop goes on polling."""
    dropped = False
    while True:
        try:
            await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            if dropped:
                raise
            dropped = True
        ticks.append(1)


def test_a_task_that_drops_its_first_cancellation_is_cancelled_again() -> None:
    async def main() -> tuple[bool, float]:
        ticks: list[int] = []
        stubborn = asyncio.create_task(_loop_that_drops_one_cancellation(ticks))
        quiet = asyncio.create_task(asyncio.sleep(60))
        await asyncio.sleep(0.05)
        started = time.monotonic()
        await _cancel_all([stubborn, quiet], timeout=5.0)
        return stubborn.cancelled() and quiet.cancelled(), time.monotonic() - started

    stopped, seconds = asyncio.run(main())
    assert stopped and seconds < 2.0  # one cancellation alone would have left the loop running for good


def test_a_task_that_ignores_cancellation_is_given_up_on_after_the_timeout_and_named(
        caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> float:
        deaf = True

        async def loop() -> None:
            while deaf:
                try:
                    await asyncio.sleep(0.01)
                except asyncio.CancelledError:
                    continue

        task = asyncio.create_task(loop(), name="deaf-loop")
        await asyncio.sleep(0)
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="swarm.core"):
            await _cancel_all([task], timeout=0.5)
        seconds = time.monotonic() - started
        deaf = False  # let it end, so that the event loop can close
        await task
        return seconds

    seconds = asyncio.run(main())
    assert 0.5 <= seconds < 1.5
    assert "network tasks still running after cancellation: deaf-loop" in caplog.text
