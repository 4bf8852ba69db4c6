"""Task sources by name: the one place that maps ``tasks.source`` to a ``TaskSource`` class.

The sources import only ``base``; nothing imports this module but the node's builders and the config
check, so there is no import cycle. Importing it is cheap (reasoning-gym itself is loaded only when a
``reasoning_gym`` source is built), which lets a config be checked before torch is loaded.
"""

from __future__ import annotations

import logging
from typing import Any

from node.errors import TaskError
from node.tasks.arith import ArithTaskSource
from node.tasks.base import TaskSource
from node.tasks.reasoning_gym import ReasoningGymTaskSource

__all__ = ["SOURCES", "build_task_source", "check_dataset_configs", "check_datasets"]

logger = logging.getLogger(__name__)

SOURCES: dict[str, type[TaskSource]] = {
    ArithTaskSource.name: ArithTaskSource,
    ReasoningGymTaskSource.name: ReasoningGymTaskSource,
}


def _source_class(source: str) -> type[TaskSource]:
    try:
        return SOURCES[source]
    except KeyError:
        raise TaskError(f"unknown task source {source!r}; choose from {sorted(SOURCES)}") from None


def check_datasets(source: str, datasets: list[str]) -> None:
    """Raise ``TaskError`` if ``source`` is unknown or does not have every dataset named (cheap)."""
    known = _source_class(source).known_datasets
    unknown = [d for d in datasets if d not in known]
    if unknown:
        raise TaskError(f"unknown dataset(s) {unknown} for source {source!r}; choose from {list(known)}")


def check_dataset_configs(source: str, configs: dict[str, dict[str, Any]]) -> None:
    """Raise ``TaskError`` if ``source`` does not take ``configs`` (a reasoning-gym source builds each dataset
    once with its settings: it imports reasoning-gym, a few seconds)."""
    _source_class(source).check_dataset_configs(configs)


def build_task_source(
    source: str,
    datasets: list[str],
    weights: list[float] | None,
    seed: int,
    **options: Any,
) -> TaskSource:
    """Build the task source named ``source`` with its options."""
    cls = _source_class(source)
    try:
        built = cls(datasets, weights, seed, **options)
    except TypeError as error:
        raise TaskError(f"bad options for task source {source!r}: {error}") from error
    logger.info("task source %s (config %s): datasets %s", source, built.config_hash, built.datasets)
    return built
