"""``TaskRef``: a task named by reference, so any node can regenerate and score it itself."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TaskRef:
    """Names one task: the same ref regenerates the same prompt and ground truth on any machine.

    ``source`` is the task family (``arith``, ``reasoning_gym``), ``dataset`` the generator inside it,
    ``config_hash`` a short hash of the generator's settings (so a mismatch is detected, not guessed),
    ``seed`` and ``index`` pick the item.
    """

    source: str
    dataset: str
    config_hash: str
    seed: int
    index: int

    def key(self) -> str:
        """A stable string form, usable as a dictionary key or in logs."""
        return f"{self.source}/{self.dataset}/{self.config_hash}/{self.seed}/{self.index}"
