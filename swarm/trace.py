"""``TraceLog``: an optional JSON-lines record of what the network side did, one line per event.

Off by default (``swarm.trace_path``). When on, the network thread appends one short line per batch it
published, accepted, rejected after pulling or failed to pull, and when it first joined the swarm, each
with the wall-clock time ``t`` (the DHT's clock on this machine). Benchmarks read it to measure
publish-to-accepted latency, pull times and delivery per (batch, receiver) pair across processes
(``scripts/lab/wan_swarm.py``); an operator can read it to see why a peer's batches do not arrive.

Lines are written unbuffered in one ``write`` each, so a crash loses at most the line being written;
the file is never read back by the node and grows by roughly 200 bytes per event.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from typing import IO

__all__ = ["TraceLog"]

logger = logging.getLogger(__name__)


class TraceLog:
    """Appends events to ``path``; a no-op when ``path`` is None or cannot be opened (logged once)."""

    def __init__(self, path: str | None) -> None:
        self._file: IO[str] | None = None
        if path is not None:
            try:
                self._file = open(path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 -- closed in close()
            except OSError as exc:
                logger.warning("swarm.trace_path %s cannot be opened (%s); no trace is written", path, exc.strerror)

    @property
    def enabled(self) -> bool:
        return self._file is not None

    def event(self, kind: str, **fields: object) -> None:
        """Append ``{"ev": kind, "t": now, **fields}``; write errors turn the trace off (logged)."""
        if self._file is None:
            return
        line = json.dumps({"ev": kind, "t": round(time.time(), 4), **fields}, separators=(",", ":"))
        try:
            self._file.write(line + "\n")
        except OSError as exc:
            logger.warning("writing the swarm trace failed (%s); trace off", exc)
            self.close()

    def close(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None
