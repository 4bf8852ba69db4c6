"""The node layer's error root and its subclasses.

``NodeError`` is the root of every error ``node`` raises on purpose. ``ConfigError`` (and its
subclasses) is a user's mistake: the CLI prints its one-line message and exits with code 2. A
``TaskError`` is a task that cannot be built; raised while reading a peer's record it is a rejection,
raised while building the node's own task source it becomes a ``ConfigError``.
"""

from __future__ import annotations

__all__ = ["CheckpointError", "ConfigError", "NodeError", "PolicyError", "TaskError"]


class NodeError(Exception):
    """Root of every error raised by ``node``."""


class ConfigError(NodeError):
    """A user's configuration or command line is wrong; the message says which field and how to fix it."""


class PolicyError(ConfigError):
    """The model or its adapters cannot be built as configured."""


class TaskError(NodeError):
    """A task cannot be built: bad settings, or a ref this source cannot regenerate."""


class CheckpointError(NodeError):
    """A checkpoint folder is incomplete or corrupt."""
