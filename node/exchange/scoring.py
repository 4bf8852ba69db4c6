"""``ScoringWorker``: peers' completions scored in a child process, each within a time limit.

A verifier is code this node runs on text a peer chose. Some are not linear in it: reasoning-gym's
propositional_logic parser spends seconds on a thousand nested negations, and a thread cannot be
stopped. So the completions of a source whose scorers are not known to be cheap
(``TaskSource.isolated_scoring``) are scored in one child process (``python -m node.exchange.scoring``, talking
over two pipes, so nothing of this process is forked or re-imported) that rebuilds the same task source
from a picklable ``SourceSpec``. The parent waits for each reply at most ``timeout`` seconds; on a
time-out it kills the child (SIGKILL) and starts a fresh one at once, which imports its libraries while
the node goes on. A child's time limits apply only once it has said it is ready (libraries imported).

Outcomes per completion: ``ok`` (a reward), ``error`` (the scorer raised: reward 0, counted),
``timeout`` (killed), ``skipped`` (after a time-out in the same call) and ``unavailable`` (no child could
be started in ``start_timeout``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from protocol.taskref import TaskRef

__all__ = ["ScoreOutcome", "ScoringWorker", "SourceSpec"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SourceSpec:
    """What a child needs to rebuild the node's task source (``build_task_source`` arguments)."""

    source: str
    datasets: tuple[str, ...]
    weights: tuple[float, ...] | None
    seed: int
    options: dict[str, Any] = field(default_factory=dict)

    def build(self) -> Any:
        from node.tasks.registry import build_task_source

        weights = list(self.weights) if self.weights is not None else None
        return build_task_source(self.source, list(self.datasets), weights, self.seed, **self.options)


@dataclass(frozen=True)
class ScoreOutcome:
    status: str  # ok | error | timeout | skipped | unavailable
    reward: float = 0.0


def _child_main(conn: _Duplex) -> None:
    """The child: read its spec, build the source, warm it up, say so, then score ``(ref, completion)`` lists."""
    logging.disable(logging.CRITICAL)  # the parent logs; a child's output would only interleave
    spec: SourceSpec = conn.recv()
    source = spec.build()
    source.warm_up()
    conn.send(("ready", 0.0))
    while True:
        try:
            items = conn.recv()
        except (EOFError, OSError):
            return
        if items is None:
            return
        for ref, completion in items:
            errors = source.score_errors
            try:
                reward = float(source.score(source.task(ref), completion))
            except Exception as error:  # a task the source refuses, or a scorer bug: reward 0, reported
                conn.send(("error", repr(error)[:200]))
                continue
            conn.send(("error" if source.score_errors != errors else "ok", reward))


class ScoringWorker:
    """Scores ``(TaskRef, completion)`` pairs in a child process, each within ``timeout`` seconds."""

    def __init__(self, spec: SourceSpec, *, timeout: float, start_timeout: float = 120.0) -> None:
        self.spec = spec
        self.timeout = timeout
        self.start_timeout = start_timeout
        self.timeouts = 0
        self.errors = 0
        self.restarts = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._conn: _Duplex | None = None
        self._ready = False
        self._started_at = 0.0

    def score(self, items: Sequence[tuple[TaskRef, str]], *, wait: float | None = None) -> list[ScoreOutcome]:
        """One outcome per item, in order. After a time-out the child is replaced and the rest skipped.

        A child still starting is waited for at most ``wait`` seconds (default: ``start_timeout``); past
        that the items are ``unavailable`` and the child goes on starting in the background.
        """
        if not items:
            return []
        if not self._ensure_ready(self.start_timeout if wait is None else wait):
            return [ScoreOutcome("unavailable")] * len(items)
        conn = self._conn
        if conn is None:
            return [ScoreOutcome("unavailable")] * len(items)
        try:
            conn.send([(ref, text) for ref, text in items])
        except (OSError, ValueError) as error:
            logger.warning("scoring worker pipe failed (%r); restarting it", error)
            self._restart()
            return [ScoreOutcome("unavailable")] * len(items)
        outcomes: list[ScoreOutcome] = []
        for _ in items:
            reply = self._receive(conn, self.timeout)
            if reply is None:
                self.timeouts += 1
                self._restart()
                outcomes.append(ScoreOutcome("timeout"))
                break
            status, reward = reply
            if status == "error":
                self.errors += 1
            outcomes.append(ScoreOutcome(status, reward if status == "ok" else 0.0))
        outcomes.extend([ScoreOutcome("skipped")] * (len(items) - len(outcomes)))
        return outcomes

    def start(self) -> None:
        """Start the child now (it warms up in the background); ``score`` starts one when needed.

        A fresh interpreter, never a fork of this process (torch and p2pd threads): ``python -m
        node.exchange.scoring`` with one pipe each way, wrapped as ``multiprocessing`` connections.
        """
        if self._proc is not None:
            return
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        root = str(Path(__file__).resolve().parent.parent)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "node.exchange.scoring", str(to_child_r), str(from_child_w)],
                pass_fds=(to_child_r, from_child_w), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                env=env, start_new_session=True,  # a Ctrl-C to the node's group goes to the node only
            )
        finally:
            os.close(to_child_r)
            os.close(from_child_w)
        conn = _Duplex(Connection(from_child_r, writable=False), Connection(to_child_w, readable=False))
        conn.send(self.spec)
        self._conn, self._ready = conn, False
        self._started_at = time.monotonic()

    def close(self) -> None:
        proc, conn = self._proc, self._conn
        self._proc, self._conn, self._ready = None, None, False
        if conn is not None:
            with contextlib.suppress(OSError, ValueError):
                conn.send(None)
            conn.close()
        if proc is not None:
            try:
                proc.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5.0)

    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def metrics(self) -> dict[str, int]:
        return {"score_timeouts": self.timeouts, "score_errors": self.errors, "scorer_restarts": self.restarts}

    def _ensure_ready(self, wait: float) -> bool:
        self.start()
        if self._ready:
            return True
        conn = self._conn
        left = self._started_at + self.start_timeout - time.monotonic()
        reply = None if conn is None else self._receive(conn, max(0.0, min(wait, left)))
        if reply is not None and reply[0] == "ready":
            self._ready = True
            return True
        if reply is not None or not self._alive() or time.monotonic() >= self._started_at + self.start_timeout:
            logger.warning("scoring worker did not start in %.0f s; restarting it", self.start_timeout)
            self._restart()
        return False

    def _alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _receive(self, conn: _Duplex, timeout: float) -> tuple[str, float] | None:
        try:  # poll returns at once when the child exits (end of file)
            if not conn.poll(timeout):
                return None
            reply: tuple[str, float] = conn.recv()
        except (EOFError, OSError):
            return None
        return reply

    def _restart(self) -> None:
        self._kill()
        self.restarts += 1
        self.start()

    def _kill(self) -> None:
        proc, conn = self._proc, self._conn
        self._proc, self._conn, self._ready = None, None, False
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5.0)
        if conn is not None:
            conn.close()


class _Duplex:
    """A reading and a writing ``Connection`` used as one (``os.pipe`` is one-way)."""

    def __init__(self, reader: Connection, writer: Connection) -> None:
        self.reader, self.writer = reader, writer

    def send(self, obj: Any) -> None:
        self.writer.send(obj)

    def recv(self) -> Any:
        return self.reader.recv()

    def poll(self, timeout: float) -> bool:
        return bool(self.reader.poll(timeout))

    def close(self) -> None:
        self.reader.close()
        self.writer.close()


if __name__ == "__main__":  # the child: python -m node.exchange.scoring READ_FD WRITE_FD
    _child_main(_Duplex(Connection(int(sys.argv[1]), writable=False), Connection(int(sys.argv[2]), readable=False)))
