"""The swarm layer's error root.

Peer input that fails a check is never raised: it is rejected and counted with a reason (see
``swarm.peer_book``). ``SwarmError`` is for the caller's own mistakes and for a network side that cannot
do what was asked (not started, already closed).
"""

from __future__ import annotations

__all__ = ["NotStartedError", "SwarmError"]


class SwarmError(Exception):
    """Root of every error raised by ``swarm``."""


class NotStartedError(SwarmError):
    """A call that needs the network side was made before ``start()`` or after ``close()``."""
