"""The built-in ``arith`` source: addition, subtraction and multiplication (``07+35=`` -> ``042``).

Datasets (``arith_format.DATASETS``): ``add``, ``sub``, ``mul`` on two-digit operands and ``add3``,
``sub3`` on three-digit operands (the harder, sparse-signal tasks). Subtraction keeps a >= b.

Two-digit datasets are small (10,000 distinct problems for ``add`` and ``mul``, 5,050 for ``sub``): ref
index i is the i-th problem of an order that is a pure function of (seed, dataset), the problems sorted
by a sha256 of (seed, dataset, a, b). Three-digit datasets have a million problems: index i is the
problem drawn from a sha256 of (seed, dataset, i). Which problems are held out for evaluation depends on
the problem alone (``content_key``: operation and operands), not on the seed, the index or the width.

Prompts are raw (``07+35=``) under ``model.chat_template`` ``auto`` and ``never``: tiny-base and small-base
were pretrained on them. Under ``always`` a chat model takes part (e.g. smollm2 beside tiny-base in one
swarm): the prompt goes through its chat template with a system prompt (``ARITH_SYSTEM_PROMPT`` unless
configured) and worked examples (unless configured, one of the task's own dataset: ``08+45=`` answered
``053``, ``default_example``), because the scorer is strict: the completion must be exactly the zero-padded
answer, nothing before or after it. The example problems are training problems, never held out.

Building one two-digit order costs tens of milliseconds (10,000 hashes and a sort), so orders are cached
compactly (two bytes a problem, about 20 KB an order) for the 256 most recent (seed, dataset) pairs; how
many distinct seeds a peer may bring is capped at ingestion (``node.exchange.ingest``).
"""

from __future__ import annotations

import hashlib
import logging
from array import array
from collections.abc import Iterable, Mapping
from typing import Any

from node.modes import ChatTemplateMode
from node.tasks.arith_format import DATASETS, make_problem
from node.tasks.base import Task, TaskSource
from node.tasks.cache import LRUCache
from node.tasks.prompting import Example, check_examples, format_for_model
from protocol.taskref import TaskRef

logger = logging.getLogger(__name__)

FORMAT_VERSION = 2
ORDER_CACHE_SIZE = 256
_ORDERED_DIGITS = 2  # datasets of at most this many digits use a full permutation of their problems
ARITH_SYSTEM_PROMPT = (
    "Compute the result. Reply with the result only: its digits, zero-padded to the width the example shows, "
    "and nothing else."
)
# The operands of the built-in worked example, by operand digits (in the training split of every dataset).
_EXAMPLE_OPERANDS = {2: (8, 45), 3: (107, 835)}


def default_example(dataset: str) -> Example:
    """The built-in worked example of ``dataset`` for chat prompts, e.g. ``08+45=`` answered ``053``."""
    _, digits = DATASETS[dataset]
    return Example(*make_problem(dataset, *_EXAMPLE_OPERANDS[digits]))


def _problems(dataset: str) -> list[tuple[int, int]]:
    """Every distinct (a, b) of ``dataset`` (``sub`` only with a >= b, as ``make_problem`` swaps)."""
    op, digits = DATASETS[dataset]
    n = 10**digits
    pairs = [(a, b) for a in range(n) for b in range(n)]
    return [(a, b) for a, b in pairs if a >= b] if op == "sub" else pairs


def problem_order(seed: int, dataset: str) -> list[tuple[int, int]]:
    """The problems of ``dataset`` in the order fixed by ``seed``: a pure function of its arguments."""

    def rank(pair: tuple[int, int]) -> bytes:
        return hashlib.sha256(f"arith/{seed}/{dataset}/{pair[0]}/{pair[1]}".encode()).digest()

    return sorted(_problems(dataset), key=rank)


def hashed_problem(seed: int, dataset: str, index: int) -> tuple[int, int]:
    """Problem ``index`` of a large dataset: operands from a sha256 of (seed, dataset, index)."""
    _, digits = DATASETS[dataset]
    digest = hashlib.sha256(f"arith/{seed}/{dataset}/{index}".encode()).digest()
    n = 10**digits
    return int.from_bytes(digest[:8], "big") % n, int.from_bytes(digest[8:16], "big") % n


def score_digits(answer: str, completion: str) -> float:
    """1.0 iff the whole completion is ``answer`` (surrounding whitespace aside): nothing may follow it."""
    return 1.0 if completion.strip() == answer else 0.0


class ArithTaskSource(TaskSource):
    """Source ``arith``: datasets ``add``, ``sub``, ``mul``, ``add3``, ``sub3``; the prompt is shown to the model
    as is, or chat-formatted under ``chat_template="always"`` with ``system_prompt`` and ``examples`` (None:
    ``default_example`` of the task's dataset)."""

    name = "arith"
    known_datasets = tuple(DATASETS)

    def __init__(
        self,
        datasets: list[str],
        weights: list[float] | None,
        seed: int,
        chat_template: ChatTemplateMode = "auto",
        system_prompt: str | None = ARITH_SYSTEM_PROMPT,
        examples: Iterable[Any] | None = None,
        dataset_configs: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        super().__init__(datasets, weights, seed, chat_template)
        self.check_dataset_configs(dataset_configs)
        self.system_prompt = system_prompt
        self.examples = None if examples is None else check_examples(examples)
        self._orders: LRUCache[tuple[int, str], array[int]] = LRUCache(ORDER_CACHE_SIZE)

    def _settings(self) -> dict[str, Any]:
        return {"format_version": FORMAT_VERSION, "datasets": DATASETS, "order": "sha256-sort-or-hash"}

    def _index_limit(self, dataset: str) -> int:
        op, digits = DATASETS[dataset]
        n = int(10**digits)
        return n * (n + 1) // 2 if op == "sub" and digits <= _ORDERED_DIGITS else n * n

    def _generate(self, ref: TaskRef) -> Task:
        op, digits = DATASETS[ref.dataset]
        if digits <= _ORDERED_DIGITS:
            n = 10**digits
            order = self._orders.get_or_create(
                (ref.seed, ref.dataset),
                lambda: array("H", (a * n + b for a, b in problem_order(ref.seed, ref.dataset))),
            )
            a, b = divmod(order[ref.index], n)
        else:
            a, b = hashed_problem(ref.seed, ref.dataset, ref.index)
        if op == "sub" and a < b:
            a, b = b, a
        prompt, answer = make_problem(ref.dataset, a, b)
        return Task(ref=ref, prompt=prompt, answer=answer, metadata={"op": op, "a": a, "b": b})

    def score(self, task: Task, completion: str) -> float:
        # Regenerated from the ref: the answer carried by ``task`` is never trusted.
        answer = self.task(task.ref).answer
        return score_digits(answer, completion) if answer is not None else 0.0

    def format_prompt(self, task: Task, tokenizer: Any) -> str:
        """Raw, unless ``chat_template`` is ``always``: then through the chat template (see the module)."""
        if self.chat_template != "always":
            return task.prompt
        examples = self.examples if self.examples is not None else (default_example(task.ref.dataset),)
        return format_for_model(task.prompt, tokenizer, "always", self.system_prompt, examples)

    def content_key(self, task: Task) -> str:
        """The problem itself: ``add/7/35`` is held out (or not) in ``add`` and ``add3`` alike."""
        meta = task.metadata
        return f"{meta['op']}/{meta['a']}/{meta['b']}"
