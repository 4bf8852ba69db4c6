"""``ScoringWorker``: peers' completions scored in a child process, each within a time limit.

A verifier is code this node runs on text a peer chose. Some are not linear in it: reasoning-gym's
propositional_logic parser spends seconds on a few hundred nested negations, and a thread cannot be
stopped. So the completions of a source whose scorers are not known to be cheap
(``TaskSource.isolated_scoring``) are scored in one spawned child process that rebuilds the same task
source from a picklable ``SourceSpec``. The parent waits for each reply at most ``timeout`` seconds; on a
time-out it kills the child (SIGKILL) and starts a fresh one at once, which imports its libraries while
the node goes on. A child's time limits apply only once it has said it is ready (libraries imported).

Outcomes per completion: ``ok`` (a reward), ``error`` (the scorer raised: reward 0, counted),
``timeout`` (killed), ``skipped`` (after a time-out in the same call) and ``unavailable`` (no child could
be started in ``start_timeout``).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
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


def _child_main(conn: Connection, spec: SourceSpec) -> None:
    """The child: build the source, warm it up, say so, then score ``(ref, completion)`` lists."""
    logging.disable(logging.CRITICAL)  # the parent logs; a child's output would only interleave
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
        self._ctx = multiprocessing.get_context("spawn")  # never fork a process with torch and p2pd threads
        self._proc: Any = None
        self._conn: Connection | None = None
        self._ready = False

    def score(self, items: Sequence[tuple[TaskRef, str]]) -> list[ScoreOutcome]:
        """One outcome per item, in order. After a time-out the child is replaced and the rest skipped."""
        if not items:
            return []
        if not self._ensure_ready():
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
        """Start the child now (it warms up in the background); ``score`` starts one when needed."""
        if self._proc is None:
            parent, child = self._ctx.Pipe()
            self._proc = self._ctx.Process(target=_child_main, args=(child, self.spec), daemon=True,
                                           name="swarm-node-scorer")
            self._proc.start()
            child.close()
            self._conn, self._ready = parent, False

    def close(self) -> None:
        proc, conn = self._proc, self._conn
        self._proc, self._conn, self._ready = None, None, False
        if conn is not None:
            with contextlib.suppress(OSError, ValueError):
                conn.send(None)
            conn.close()
        if proc is not None:
            proc.join(timeout=2.0)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5.0)

    def pid(self) -> int | None:
        return None if self._proc is None else int(self._proc.pid)

    def metrics(self) -> dict[str, int]:
        return {"score_timeouts": self.timeouts, "score_errors": self.errors, "scorer_restarts": self.restarts}

    def _ensure_ready(self) -> bool:
        self.start()
        if self._ready:
            return True
        conn = self._conn
        reply = None if conn is None else self._receive(conn, self.start_timeout)
        if reply is None or reply[0] != "ready":
            logger.warning("scoring worker did not start in %.0f s; peers' completions are not scored",
                           self.start_timeout)
            self._kill()
            return False
        self._ready = True
        return True

    def _receive(self, conn: Connection, timeout: float) -> tuple[str, float] | None:
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
            proc.kill()
            proc.join(timeout=5.0)
        if conn is not None:
            conn.close()
