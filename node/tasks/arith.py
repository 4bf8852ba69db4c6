"""The built-in ``arith`` source: two-digit addition, subtraction and multiplication (``07+35=`` -> ``042``).

Each dataset's distinct problems (10,000 for ``add`` and ``mul``, 5,050 for ``sub``, which keeps
a >= b) are put in an order that is a pure function of (seed, dataset): problems sorted by a sha256 of
(seed, dataset, a, b). Ref index i is the i-th problem of that order, so training (even i) and
evaluation (odd i) problems never coincide.

Building one order costs tens of milliseconds (10,000 hashes and a sort), so orders are cached compactly
(two bytes a problem, about 20 KB an order) for the 256 most recent (seed, dataset) pairs; how many
distinct seeds a peer may bring is capped at ingestion (``node.ingest``).
"""

from __future__ import annotations

import hashlib
import logging
from array import array
from typing import Any

from node.modes import ChatTemplateMode
from node.tasks.arith_format import OPERATIONS, make_problem
from node.tasks.base import Task, TaskSource
from node.tasks.cache import LRUCache
from protocol.taskref import TaskRef

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
OPERAND_MAX = 99
ORDER_CACHE_SIZE = 256


def _problems(dataset: str) -> list[tuple[int, int]]:
    """Every distinct (a, b) of ``dataset`` (``sub`` only with a >= b, as ``make_problem`` swaps)."""
    pairs = [(a, b) for a in range(OPERAND_MAX + 1) for b in range(OPERAND_MAX + 1)]
    return [(a, b) for a, b in pairs if a >= b] if dataset == "sub" else pairs


def problem_order(seed: int, dataset: str) -> list[tuple[int, int]]:
    """The problems of ``dataset`` in the order fixed by ``seed``: a pure function of its arguments."""

    def rank(pair: tuple[int, int]) -> bytes:
        return hashlib.sha256(f"arith/{seed}/{dataset}/{pair[0]}/{pair[1]}".encode()).digest()

    return sorted(_problems(dataset), key=rank)


def score_digits(answer: str, completion: str) -> float:
    """1.0 iff the whole completion is ``answer`` (surrounding whitespace aside): nothing may follow it."""
    return 1.0 if completion.strip() == answer else 0.0


class ArithTaskSource(TaskSource):
    """Source ``arith``: datasets ``add``, ``sub``, ``mul``; the prompt is shown to the model as is."""

    name = "arith"
    known_datasets = tuple(OPERATIONS)

    def __init__(
        self,
        datasets: list[str],
        weights: list[float] | None,
        seed: int,
        chat_template: ChatTemplateMode = "auto",
    ) -> None:
        # chat_template is accepted so every source takes the same options; arith prompts stay raw.
        super().__init__(datasets, weights, seed, chat_template)
        self._orders: LRUCache[tuple[int, str], array[int]] = LRUCache(ORDER_CACHE_SIZE)

    def _settings(self) -> dict[str, Any]:
        return {"format_version": FORMAT_VERSION, "operand_max": OPERAND_MAX, "order": "sha256-sort"}

    def _index_limit(self, dataset: str) -> int:
        n = OPERAND_MAX + 1
        return n * (n + 1) // 2 if dataset == "sub" else n * n

    def _generate(self, ref: TaskRef) -> Task:
        order = self._orders.get_or_create(
            (ref.seed, ref.dataset),
            lambda: array("H", (a * (OPERAND_MAX + 1) + b for a, b in problem_order(ref.seed, ref.dataset))),
        )
        a, b = divmod(order[ref.index], OPERAND_MAX + 1)
        prompt, answer = make_problem(ref.dataset, a, b)
        return Task(ref=ref, prompt=prompt, answer=answer, metadata={"op": ref.dataset, "a": a, "b": b})

    def score(self, task: Task, completion: str) -> float:
        # Regenerated from the ref: the answer carried by ``task`` is never trusted.
        answer = self.task(task.ref).answer
        return score_digits(answer, completion) if answer is not None else 0.0

    def format_prompt(self, task: Task, tokenizer: Any) -> str:
        return task.prompt
