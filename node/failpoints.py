"""Crash points for crash-safety tests: SIGKILL this process at a named place in the node's loop.

``SWARM_NODE_CRASH_AT=NAME:N`` kills the process (``SIGKILL``: no cleanup, no ``finally``, exactly like
``kill -9``) the N-th time the point ``NAME`` is reached (N defaults to 1). Unset, as always outside
tests, ``crash_point`` is a single comparison. The points:

* ``generation``: completions sampled, nothing published or trained yet;
* ``publish``: a batch handed to the transport, its manifest maybe not stored yet;
* ``checkpoint_files``: a checkpoint's files written under their temporary name, not yet renamed;
* ``checkpoint_renamed``: a checkpoint renamed into place, older ones not yet pruned.
"""

from __future__ import annotations

import os
import signal

__all__ = ["CRASH_ENV", "crash_point"]

CRASH_ENV = "SWARM_NODE_CRASH_AT"


def _parse(spec: str) -> tuple[str, int]:
    name, _, count = spec.partition(":")
    return name.strip(), int(count) if count.strip().isdigit() else 1


_TARGET, _AT = _parse(os.environ.get(CRASH_ENV, ""))
_seen = 0


def crash_point(name: str) -> None:
    """Die here with SIGKILL if ``$SWARM_NODE_CRASH_AT`` names this point and its count is reached."""
    global _seen
    if name != _TARGET:
        return
    _seen += 1
    if _seen >= _AT:
        os.kill(os.getpid(), signal.SIGKILL)
