"""Orphan protection for p2pd: a tiny shell watchdog that terminates p2pd if this process dies.

hivemind starts p2pd as a child process and stops it on a clean shutdown, but a parent killed with
SIGKILL (or any death that skips cleanup) leaves p2pd running. p2pd is started by hivemind, so it cannot
be given ``PR_SET_PDEATHSIG``; instead a ``/bin/sh`` loop (about 1 MB) polls this process once a second
and, when it is gone, sends SIGTERM then SIGKILL to p2pd. A clean ``close()`` stops the watchdog first.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess

__all__ = ["P2pdWatchdog", "kill_process"]

logger = logging.getLogger(__name__)

_SCRIPT = (
    'parent="$1"; child="$2"; '
    'while kill -0 "$parent" 2>/dev/null && kill -0 "$child" 2>/dev/null; do sleep 1; done; '
    'if kill -0 "$child" 2>/dev/null; then kill -TERM "$child" 2>/dev/null; sleep 2; '
    'kill -KILL "$child" 2>/dev/null; fi'
)


class P2pdWatchdog:
    """Watches ``child_pid`` on behalf of this process; ``stop()`` on clean shutdown."""

    def __init__(self, child_pid: int) -> None:
        self.child_pid = child_pid
        self._proc: subprocess.Popen[bytes] | None = subprocess.Popen(
            ["/bin/sh", "-c", _SCRIPT, "swarm-p2pd-watchdog", str(os.getpid()), str(child_pid)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C to our process group must not kill the watchdog first
        )

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def stop(self) -> None:
        """Stop watching (idempotent)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)


def kill_process(pid: int) -> None:
    """SIGKILL ``pid`` if it still exists (last resort after a failed clean shutdown)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)
        logger.warning("killed p2pd (pid %d) that outlived its shutdown", pid)
