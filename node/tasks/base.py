"""The task-source interface: a ``TaskRef`` regenerates exactly one task, which the node scores itself.

Train/evaluation split: one task in ``HELD_OUT_BUCKETS`` is held out for evaluation, chosen by a hash of
the task's *content* (``content_key``: for arithmetic the problem, for reasoning-gym the question text),
never by its index or seed. The split is therefore the same on every node whatever its seed: a peer's
task that happens to be one of this node's held-out problems is recognised as such (and rejected at
ingestion), and ``sample`` never draws one. ``eval_refs`` gives a fixed held-out set.

A ref names its own seed, so a peer with another seed still names tasks this node can regenerate, as
long as the source, the dataset and the ``config_hash`` (a hash of everything that decides the generated
text and the split) agree.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from node.errors import TaskError
from node.modes import CHAT_TEMPLATE_MODES, ChatTemplateMode
from protocol.taskref import TaskRef

__all__ = ["HELD_OUT_BUCKETS", "Task", "TaskError", "TaskSource", "held_out", "settings_hash"]

logger = logging.getLogger(__name__)

# Most attempts ``sample``/``eval_refs`` make to find an index whose task the source accepts and that is in
# the wanted split: a held-out ref needs about HELD_OUT_BUCKETS draws, so 7/8 ** 256 is never reached.
_MAX_DRAWS_PER_REF = 256

HELD_OUT_BUCKETS = 8
"""One task in this many (by a hash of its content) is held out for evaluation."""
_SPLIT_RULE = f"sha256-content-1/{HELD_OUT_BUCKETS}"


def held_out(source: str, content: str) -> bool:
    """Whether the task of ``source`` whose content is ``content`` belongs to the evaluation split."""
    digest = hashlib.sha256(f"held-out/{source}/{content}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % HELD_OUT_BUCKETS == 0


@dataclass(frozen=True)
class Task:
    """One regenerated task: ``answer`` is None when the dataset has no single reference answer."""

    ref: TaskRef
    prompt: str
    answer: str | None
    metadata: dict[str, Any]


def settings_hash(settings: dict[str, Any]) -> str:
    """First 12 hex digits of the sha256 of the canonical JSON of ``settings``."""
    canonical = json.dumps(settings, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:12]


def _check_weights(datasets: Sequence[str], weights: Sequence[float] | None) -> list[float]:
    if weights is None:
        return [1.0] * len(datasets)
    if len(weights) != len(datasets):
        raise TaskError(
            f"weights has {len(weights)} entries but datasets has {len(datasets)}; give one per dataset"
        )
    checked = [float(w) for w in weights]
    if any(not math.isfinite(w) or w < 0 for w in checked) or sum(checked) <= 0:
        raise TaskError(f"weights must be finite, >= 0 and not all zero, got {list(weights)}")
    return checked


class TaskSource(ABC):
    """A family of task generators (``name``) with named datasets, all regenerated from ``TaskRef``s.

    Subclasses set ``name`` and ``known_datasets`` and implement ``_settings``, ``_index_limit``,
    ``_generate``, ``score`` and ``format_prompt``. ``task`` checks a ref before generating it.
    """

    name: ClassVar[str]
    known_datasets: ClassVar[tuple[str, ...]]
    isolated_scoring: ClassVar[bool] = False
    """True when a scorer may take long on text a peer chose: peers' completions are then scored in a
    child process with a time limit (``node.exchange.scoring``)."""

    def __init__(
        self,
        datasets: Sequence[str],
        weights: Sequence[float] | None,
        seed: int,
        chat_template: ChatTemplateMode = "auto",
    ) -> None:
        if not datasets:
            raise TaskError(
                f"source {self.name!r} needs at least one dataset, e.g. {list(self.known_datasets)}"
            )
        unknown = [d for d in datasets if d not in self.known_datasets]
        if unknown:
            raise TaskError(
                f"unknown dataset(s) {unknown} for source {self.name!r}; choose from {list(self.known_datasets)}"
            )
        if len(set(datasets)) != len(datasets):
            raise TaskError(f"datasets must not repeat, got {list(datasets)}")
        if chat_template not in CHAT_TEMPLATE_MODES:
            raise TaskError(
                f"chat_template must be one of {list(CHAT_TEMPLATE_MODES)}, got {chat_template!r}"
            )
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TaskError(f"seed must be an integer, got {seed!r}")
        self.datasets: list[str] = list(datasets)
        self.weights: list[float] = _check_weights(datasets, weights)
        self.seed = seed
        self.chat_template: ChatTemplateMode = chat_template
        self._config_hash: str | None = None
        self.score_errors = 0  # scorer exceptions turned into a zero reward

    @property
    def config_hash(self) -> str:
        """Short stable hash of every setting that decides what a ref regenerates."""
        if self._config_hash is None:
            self._config_hash = settings_hash({"source": self.name, "split": _SPLIT_RULE, **self._settings()})
        return self._config_hash

    @classmethod
    def check_dataset_configs(cls, configs: Mapping[str, Mapping[str, Any]] | None) -> dict[str, dict[str, Any]]:
        """Per-dataset settings (``tasks.dataset_configs``) checked; a source without settings takes none."""
        if configs:
            raise TaskError(f"source {cls.name!r} takes no dataset_configs (got {sorted(configs)}); remove them, "
                            "or use source 'reasoning_gym'")
        return {}

    # ----------------------------------------------------------------------------------- subclass API

    @abstractmethod
    def _settings(self) -> dict[str, Any]:
        """JSON-able settings that decide generation (library versions included); hashed once."""

    @abstractmethod
    def _index_limit(self, dataset: str) -> int:
        """Indices of ``dataset`` are in ``[0, limit)``."""

    @abstractmethod
    def _generate(self, ref: TaskRef) -> Task:
        """Build the task of an already checked ref; raise ``TaskError`` if this source refuses it."""

    @abstractmethod
    def score(self, task: Task, completion: str) -> float:
        """Reward in [0, 1] from this node's own verifier; uses only ``task.ref`` and ``completion``."""

    @abstractmethod
    def format_prompt(self, task: Task, tokenizer: Any) -> str:
        """The text the model is conditioned on for ``task``."""

    def content_key(self, task: Task) -> str:
        """What decides the train/evaluation split of a task this source generated: its content,
        independent of seed and index."""
        return task.prompt

    # ----------------------------------------------------------------------------------- public API

    def warm_up(self) -> None:
        """Import what scoring needs now, so a first score does not pay for it (no-op by default)."""
        return None

    def task(self, ref: TaskRef) -> Task:
        """Regenerate exactly the task ``ref`` names; raise ``TaskError`` when it is not ours to make."""
        self.check_ref(ref)
        return self._generate(ref)

    def check_ref(self, ref: TaskRef) -> None:
        """Raise ``TaskError`` naming the first field of ``ref`` this source cannot regenerate."""
        if ref.source != self.name:
            raise TaskError(f"task ref {ref.key()} is for source {ref.source!r}, not {self.name!r}")
        if ref.config_hash != self.config_hash:
            raise TaskError(
                f"task ref {ref.key()} has config hash {ref.config_hash!r}, this source has {self.config_hash!r}"
            )
        if ref.dataset not in self.known_datasets:
            raise TaskError(
                f"task ref {ref.key()} names unknown dataset {ref.dataset!r} of source {self.name!r}"
            )
        for field, value in (("seed", ref.seed), ("index", ref.index)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TaskError(f"task ref {ref.key()} has a non-integer {field}")
        if not 0 <= ref.index < self._index_limit(ref.dataset):
            raise TaskError(
                f"task ref {ref.key()} has index {ref.index} outside [0, {self._index_limit(ref.dataset)})"
            )

    def is_held_out(self, task: Task) -> bool:
        """Whether ``task`` is in the evaluation split (the same answer on every node)."""
        return held_out(self.name, self.content_key(task))

    def make_ref(self, dataset: str, index: int, seed: int | None = None) -> TaskRef:
        """The ref of item ``index`` of ``dataset`` under this source's settings (and seed by default)."""
        return TaskRef(self.name, dataset, self.config_hash, self.seed if seed is None else seed, index)

    def sample(self, n: int, rng: random.Random) -> list[TaskRef]:
        """``n`` training refs: datasets drawn by weight, indices uniformly, held-out tasks drawn again."""
        refs: list[TaskRef] = []
        for _ in range(n):
            dataset = rng.choices(self.datasets, weights=self.weights)[0]
            limit = self._index_limit(dataset)

            def draw(limit: int = limit) -> int:
                return rng.randrange(limit)

            refs.append(self._first_accepted(dataset, draw, want_held_out=False))
        return refs

    def eval_refs(self, n: int) -> list[TaskRef]:
        """A fixed held-out set of ``n`` refs: the first held-out indices, datasets with weight > 0 in turn."""
        active = [d for d, w in zip(self.datasets, self.weights) if w > 0]
        next_index = dict.fromkeys(active, 0)
        refs: list[TaskRef] = []
        for i in range(n):
            dataset = active[i % len(active)]

            def draw(dataset: str = dataset) -> int:
                index = next_index[dataset]
                next_index[dataset] += 1
                if index >= self._index_limit(dataset):
                    raise TaskError(f"dataset {dataset!r} has too few held-out tasks for {n} eval refs")
                return index

            refs.append(self._first_accepted(dataset, draw, want_held_out=True))
        return refs

    def _first_accepted(self, dataset: str, draw_index: Callable[[], int], *, want_held_out: bool) -> TaskRef:
        """First ref from ``draw_index()`` whose task this source accepts (e.g. prompt not too long) and
        whose split is the one wanted."""
        last_error: TaskError | None = None
        for _ in range(_MAX_DRAWS_PER_REF):
            ref = self.make_ref(dataset, draw_index())
            try:
                task = self._generate(ref)
            except TaskError as error:
                last_error = error
                continue
            if self.is_held_out(task) == want_held_out:
                return ref
        split = "held-out" if want_held_out else "training"
        raise TaskError(f"no acceptable {split} task of {dataset!r} in {_MAX_DRAWS_PER_REF} draws: {last_error}")
