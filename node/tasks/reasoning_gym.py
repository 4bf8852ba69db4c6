"""The ``reasoning_gym`` source: reasoning-gym datasets scored by their own scorers.

Datasets (``ADMITTED_DATASETS``): the nine of the SAPO paper (``SAPO_DATASETS``) and nine easier ones a
small model can start on (``EASY_DATASETS``). A dataset is admitted only when

- an item regenerates identically in any process, whatever the seed or ``PYTHONHASHSEED`` (it depends on
  ``random.Random(dataset_seed + idx)`` and the package's own data files alone);
- the library's reference answer scores 1 with the library's own scorer, and wrong answers less;
- its scorer's time is bounded on any answer (answers are capped at ``MAX_ANSWER_CHARS``; peers'
  completions are also scored in a child process with a time limit, ``node.exchange.scoring``);
- nothing a peer wrote is evaluated: no ``eval``/``exec``/``compile`` and no unbounded parsing of the
  answer. Where a scorer parses text, a guard here lets only answers of a bounded, literal form reach it.

The easy nine, read in reasoning-gym 0.1.25 (all 4096-char adversarial answers score in under 5 ms):

- ``syllogism``, ``gcd``, ``leg_counting``, ``letter_counting``, ``simple_equations``: the library's default
  scorer (exact match 1, else partial credit ``len(reference) / len(answer)`` when the reference is a
  substring of the answer). ``simple_equations`` builds its equations with sympy, only from its own rng.
- ``spell_backward``: a character-by-character comparison (linear). Its ``data_file`` setting names a file
  whose content no config hash covers, so ``dataset_configs`` may not set it.
- ``word_sorting``: ``re.split`` on commas and list comparisons (linear).
- ``number_sorting``: ``json.loads`` of the answer (linear, nesting errors caught) and float comparisons; its
  ``eval`` runs only on the regenerated reference answer, never on the answer.
- ``coin_flip``: ``fractions.Fraction(answer)``, which expands an exponent: ``1e999999999`` takes minutes.
  Guarded: only digits, signs, ``.``, ``,``, ``/`` and spaces with at most a three-digit exponent reach it
  (``_COIN_FLIP_NUMBER``; the reference answers are such numbers, e.g. ``3.051757812e-05``).

Candidates refused: none of the nine examined failed a check. Others were not examined: a dataset is
admitted when a measurement gives a reason (docs/results/smollm2-signal.md: where smollm2-135m has signal).

reasoning-gym builds item ``idx`` of a dataset from ``random.Random(dataset_seed + idx)`` alone, so one
item is regenerated without the items before it (well under a millisecond each; ``bf`` about 0.6 ms,
``simple_equations`` about 1.3 ms). The dataset seed is derived from (ref seed, dataset) by sha256, so two
seeds' index ranges do not overlap and datasets are decorrelated. Dataset objects and generated items sit
in LRU caches.

Scoring extracts the final answer (``prompting.extract_answer``) and calls the dataset's own
``score_answer`` with the regenerated item; a peer's answer or reward is never consulted. Prompt formatting
(system prompt, worked examples, the answer instruction the model sees) is the node's own and does not
enter the ``config_hash``: a task's text always ends in ``ANSWER_INSTRUCTION``, which ``format_prompt``
replaces when the node is configured with another (its ``e.g. <answer>42</answer>`` is copied verbatim
by smollm2-135m: docs/results/smollm2-signal.md).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import importlib.metadata
import io
import json
import logging
import math
import re
import time
from collections.abc import Iterable, Mapping
from typing import Any

from node.errors import TaskError
from node.modes import ChatTemplateMode
from node.tasks.base import Task, TaskSource
from node.tasks.cache import LRUCache
from node.tasks.prompting import (
    ANSWER_INSTRUCTION,
    DEFAULT_SYSTEM_PROMPT,
    check_examples,
    extract_answer,
    format_for_model,
)
from protocol.taskref import TaskRef

logger = logging.getLogger(__name__)

SAPO_DATASETS: tuple[str, ...] = (
    "arc_1d",
    "basic_arithmetic",
    "base_conversion",
    "bf",
    "binary_matrix",
    "calendar_arithmetic",
    "decimal_arithmetic",
    "fraction_simplification",
    "propositional_logic",
)
"""The nine datasets of the SAPO paper (at their default settings, about 0 reward for a 135M model)."""
EASY_DATASETS: tuple[str, ...] = (
    "coin_flip",
    "gcd",
    "leg_counting",
    "letter_counting",
    "number_sorting",
    "simple_equations",
    "spell_backward",
    "syllogism",
    "word_sorting",
)
"""Easier datasets a small model can start on (with easy ``dataset_configs``), admitted by the checks above."""
ADMITTED_DATASETS: tuple[str, ...] = SAPO_DATASETS + EASY_DATASETS
INDEX_LIMIT = 2**32
MAX_ANSWER_CHARS = 4096
_SLOW_ITEM_S = 0.05
# binary_matrix's scorer eval()s the answer when it is not an exact match: only a list literal may get there.
_MATRIX_LITERAL = re.compile(r"[0-9\s\[\],]*")
# coin_flip's scorer parses the answer with Fraction, which computes 10**exponent: the exponent stays small.
_COIN_FLIP_NUMBER = re.compile(r"[0-9\s.,/+-]*(?:[eE][+-]?[0-9]{1,3})?\s*")
# Settings dataset_configs may not set: task refs decide seed and size; a data file's content is not hashed.
_FIXED_FIELDS = frozenset({"seed", "size", "data_file"})
_CLOSING_TAG = "</answer>"


def _library() -> Any:
    """The reasoning-gym package, imported on first use (it takes seconds to import)."""
    import reasoning_gym

    return reasoning_gym


def reasoning_gym_version() -> str:
    try:
        return importlib.metadata.version("reasoning-gym")
    except importlib.metadata.PackageNotFoundError:
        return str(getattr(_library(), "__version__", "unknown"))


def dataset_seed(seed: int, dataset: str) -> int:
    """The reasoning-gym seed of ``dataset`` for ref seed ``seed`` (62 bits from a sha256)."""
    digest = hashlib.sha256(f"reasoning_gym/{dataset}/{seed}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 2


def _config_fields(dataset: str) -> list[str]:
    """The fields of ``dataset``'s reasoning-gym config dataclass that ``dataset_configs`` may set."""
    import dataclasses

    from reasoning_gym.factory import DATASETS

    return [f.name for f in dataclasses.fields(DATASETS[dataset][1]) if f.name not in _FIXED_FIELDS]


def check_dataset_configs(configs: Mapping[str, Mapping[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """``configs`` (dataset -> reasoning-gym config overrides) checked by building each dataset once;
    ``TaskError`` naming the dataset, the field and the fix otherwise."""
    checked: dict[str, dict[str, Any]] = {}
    for name, overrides in (configs or {}).items():
        if name not in ADMITTED_DATASETS:
            raise TaskError(f"dataset_configs names unknown dataset {name!r}; choose from {list(ADMITTED_DATASETS)}")
        if not isinstance(overrides, Mapping):
            raise TaskError(f"dataset_configs.{name} must map setting names to values, e.g. {{min_terms: 2}}; "
                            f"got {overrides!r}")
        fixed = _FIXED_FIELDS & set(overrides)
        if fixed:
            raise TaskError(f"dataset_configs.{name} must not set {sorted(fixed)}: task refs decide seed and size, "
                            "and the word lists are those of the reasoning-gym version; remove them")
        fields = _config_fields(name)
        unknown = sorted(set(overrides) - set(fields))
        if unknown:
            raise TaskError(f"dataset_configs.{name} has unknown setting(s) {unknown}; {name} takes {fields}")
        try:
            json.dumps(dict(overrides), sort_keys=True)
        except (TypeError, ValueError) as error:
            raise TaskError(f"dataset_configs.{name} must hold plain values (numbers, strings, lists): {error}") from None
        try:
            _library().create_dataset(name, seed=0, size=1, **overrides)[0]
        except Exception as error:  # a failed validate() (AssertionError), a wrong type, ...
            raise TaskError(f"dataset_configs.{name} is invalid: {error!r}; fix the values "
                            f"(reasoning-gym's own check of the {name} settings)") from error
        checked[name] = dict(overrides)
    return checked


class ReasoningGymTaskSource(TaskSource):
    """Source ``reasoning_gym``; options: chat_template, system_prompt, examples (worked examples in the
    prompt: ``prompting.check_examples``), answer_instruction (what follows the question in the prompt the
    model sees; the task's own text keeps ``ANSWER_INSTRUCTION``), max_prompt_chars, dataset_configs
    (per-dataset reasoning-gym config overrides) and cache_size."""

    name = "reasoning_gym"
    known_datasets = ADMITTED_DATASETS
    isolated_scoring = True  # e.g. propositional_logic's parser is superlinear in the answer

    def __init__(
        self,
        datasets: list[str],
        weights: list[float] | None,
        seed: int,
        chat_template: ChatTemplateMode = "auto",
        system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
        examples: Iterable[Any] = (),
        answer_instruction: str | None = ANSWER_INSTRUCTION,
        max_prompt_chars: int = 4000,
        dataset_configs: Mapping[str, Mapping[str, Any]] | None = None,
        cache_size: int = 4096,
    ) -> None:
        super().__init__(datasets, weights, seed, chat_template)
        if max_prompt_chars < 1:
            raise TaskError(f"max_prompt_chars must be >= 1, got {max_prompt_chars}")
        self.system_prompt = system_prompt
        self.examples = check_examples(examples)
        self.answer_instruction = answer_instruction
        self.max_prompt_chars = max_prompt_chars
        self.dataset_configs = self.check_dataset_configs(dataset_configs)
        self._datasets: LRUCache[tuple[str, int], Any] = LRUCache(64)
        self._entries: LRUCache[tuple[str, int, int], dict[str, Any]] = LRUCache(cache_size)

    @classmethod
    def check_dataset_configs(cls, configs: Mapping[str, Mapping[str, Any]] | None) -> dict[str, dict[str, Any]]:
        return check_dataset_configs(configs)

    def _settings(self) -> dict[str, Any]:
        return {
            "reasoning_gym": reasoning_gym_version(),
            "dataset_configs": self.dataset_configs,
            "max_prompt_chars": self.max_prompt_chars,
            "answer_instruction": ANSWER_INSTRUCTION,
            "seed_derivation": "sha256-v1",
            "index_limit": INDEX_LIMIT,
        }

    def _index_limit(self, dataset: str) -> int:
        return INDEX_LIMIT

    def _dataset(self, dataset: str, seed: int) -> Any:
        def build() -> Any:
            overrides = self.dataset_configs.get(dataset, {})
            return _library().create_dataset(
                dataset, seed=dataset_seed(seed, dataset), size=INDEX_LIMIT, **overrides
            )

        return self._datasets.get_or_create((dataset, seed), build)

    def _entry(self, ref: TaskRef) -> dict[str, Any]:
        def build() -> dict[str, Any]:
            started = time.perf_counter()
            # bf's compiler prints progress dots; redirect_stdout is process-wide, so generate on one thread.
            with contextlib.redirect_stdout(io.StringIO()):
                entry: dict[str, Any] = self._dataset(ref.dataset, ref.seed)[ref.index]
            elapsed = time.perf_counter() - started
            if elapsed > _SLOW_ITEM_S:
                logger.debug("generating %s took %.3f s", ref.key(), elapsed)
            return entry

        return self._entries.get_or_create((ref.dataset, ref.seed, ref.index), build)

    def _generate(self, ref: TaskRef) -> Task:
        entry = self._entry(ref)
        prompt = f"{str(entry['question']).rstrip()}\n\n{ANSWER_INSTRUCTION}"
        if len(prompt) > self.max_prompt_chars:
            raise TaskError(f"task {ref.key()} has a {len(prompt)}-char prompt, over max_prompt_chars")
        answer = entry.get("answer")
        return Task(
            ref=ref,
            prompt=prompt,
            answer=None if answer is None else str(answer),
            metadata=copy.deepcopy(dict(entry.get("metadata", {}))),
        )

    def score(self, task: Task, completion: str) -> float:
        """The dataset's own ``score_answer`` on the extracted answer, clipped to [0, 1]; 0 on any failure.

        The answer must end the completion: text after the last ``</answer>`` scores 0.
        """
        self.check_ref(task.ref)
        entry = self._entry(task.ref)
        closing = completion.lower().rfind(_CLOSING_TAG)
        if closing != -1 and completion[closing + len(_CLOSING_TAG) :].strip():
            return 0.0
        answer = extract_answer(completion)
        if answer is None or len(answer) > MAX_ANSWER_CHARS:
            return 0.0
        if task.ref.dataset == "binary_matrix" and not _MATRIX_LITERAL.fullmatch(answer):
            return 0.0  # never hand arbitrary text to its eval(); such text scores 0 there anyway
        if task.ref.dataset == "coin_flip" and not _COIN_FLIP_NUMBER.fullmatch(answer):
            return 0.0  # never a large exponent into Fraction(); anything else but a number scores 0 there too
        scorer = self._dataset(task.ref.dataset, task.ref.seed).score_answer
        try:
            value = float(scorer(answer, copy.deepcopy(entry)))
        except Exception as error:  # a scorer crashing on odd input is a zero reward, not a node failure
            self.score_errors += 1
            logger.debug("scorer of %s failed on %r: %r", task.ref.key(), answer[:80], error)
            return 0.0
        return min(1.0, max(0.0, value)) if math.isfinite(value) else 0.0

    def warm_up(self) -> None:
        _library()

    def format_prompt(self, task: Task, tokenizer: Any) -> str:
        """The task's text, its answer instruction replaced by this node's (``answer_instruction``; none when
        empty), formatted with the system prompt and examples."""
        text = task.prompt
        if self.answer_instruction != ANSWER_INSTRUCTION:
            question = text.removesuffix(ANSWER_INSTRUCTION).rstrip()
            text = f"{question}\n\n{self.answer_instruction}" if self.answer_instruction else question
        return format_for_model(text, tokenizer, self.chat_template, self.system_prompt, self.examples)

    def content_key(self, task: Task) -> str:
        """The question text: the same question is held out whichever seed or index produced it."""
        return f"{task.ref.dataset}/{str(self._entry(task.ref)['question']).rstrip()}"
