"""Atomic checkpoints of a run: adapters (safetensors), optimizer, RNG states and step.

A checkpoint is a folder ``checkpoints/step_000025``. It is written under a temporary name and renamed
into place only when complete, so a crash never leaves a half-written checkpoint that looks valid. The
last ``keep`` checkpoints are kept, and milestones (steps that are multiples of ``keep_every``) for good;
an old one is renamed out of sight before it is deleted, so a crash
while pruning cannot leave a partly deleted checkpoint under a valid name either. ``tests/node/
test_crash.py`` kills the node with SIGKILL at each of these moments and resumes.

A checkpoint damaged afterwards (a truncated or unreadable ``adapter.safetensors``, ``trainer.pt`` or
``state.json``) is skipped with a warning: ``load_latest`` falls back to the newest intact one and moves
the damaged ones aside (``checkpoints/corrupt-step_NNNNNN``). If every checkpoint is damaged it raises
``CheckpointError`` (the CLI's one-line error) rather than silently starting afresh over the run's history.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from node.errors import CheckpointError
from node.failpoints import crash_point

logger = logging.getLogger(__name__)

_PREFIX = "step_"
_CORRUPT_PREFIX = "corrupt-"
# What reading a truncated or garbled checkpoint file raises (json, safetensors, torch.load / pickle).
_READ_ERRORS = (OSError, ValueError, KeyError, TypeError, EOFError, RuntimeError, pickle.UnpicklingError,
                SafetensorError)


@dataclass
class CheckpointState:
    step: int
    trainable: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    rng: dict[str, Any]
    extra: dict[str, Any]


def capture_rng(task_rng: random.Random, sample_gen: torch.Generator,
                select_rng: random.Random | None = None) -> dict[str, Any]:
    """The node's random streams (tasks, generation, peer selection) and the global ones."""
    state = {
        "task_rng": task_rng.getstate(),
        "sample_gen": sample_gen.get_state(),
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
    }
    if select_rng is not None:
        state["select_rng"] = select_rng.getstate()
    return state


def restore_rng(rng: dict[str, Any], task_rng: random.Random, sample_gen: torch.Generator,
                select_rng: random.Random | None = None) -> None:
    """Restore what ``capture_rng`` captured (a checkpoint without a selection stream keeps it as seeded)."""
    task_rng.setstate(_as_state(rng["task_rng"]))
    sample_gen.set_state(rng["sample_gen"])
    if select_rng is not None and "select_rng" in rng:
        select_rng.setstate(_as_state(rng["select_rng"]))
    torch.set_rng_state(rng["torch"])
    random.setstate(_as_state(rng["python"]))


def _as_state(state: Any) -> Any:
    """``random.Random`` states come back from ``torch.load`` with lists where tuples were."""
    if isinstance(state, list):
        return tuple(_as_state(s) for s in state)
    return state


class CheckpointManager:
    """The run's checkpoints: the last ``keep``, plus milestones (steps that are multiples of ``keep_every``)."""

    def __init__(self, run_dir: str | Path, keep: int, keep_every: int | None = None) -> None:
        self.root = Path(run_dir) / "checkpoints"
        self.keep = keep
        self.keep_every = keep_every

    def _complete(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        dirs = [d for d in self.root.iterdir() if d.is_dir() and d.name.startswith(_PREFIX)
                and d.name[len(_PREFIX):].isdigit() and (d / "state.json").is_file()]
        return sorted(dirs, key=lambda d: int(d.name[len(_PREFIX):]))

    def latest(self) -> Path | None:
        done = self._complete()
        return done[-1] if done else None

    def save(self, state: CheckpointState) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.root / f"{_PREFIX}{state.step:06d}"
        tmp = self.root / f".tmp-{final.name}-{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        save_file(state.trainable, str(tmp / "adapter.safetensors"))
        torch.save({"optimizer": state.optimizer, "rng": state.rng}, tmp / "trainer.pt")
        meta = {"step": state.step, "time": time.time(), **state.extra}
        (tmp / "state.json").write_text(json.dumps(meta, indent=1))
        for f in tmp.iterdir():  # data on disk before the rename makes it visible
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        _fsync_dir(tmp)
        crash_point("checkpoint_files")
        if final.exists():
            _remove(final)
        os.replace(tmp, final)
        _fsync_dir(self.root)
        crash_point("checkpoint_renamed")
        self._prune()
        logger.info("checkpoint written: %s", final)
        return final

    def steps(self) -> list[int]:
        """The steps of the complete checkpoints, oldest first."""
        return [step_of(d) for d in self._complete()]

    def path_of(self, step: int) -> Path:
        return self.root / f"{_PREFIX}{step:06d}"

    def _prune(self) -> None:
        for old in self._complete()[: -self.keep]:
            if self.keep_every is None or step_of(old) % self.keep_every != 0:  # milestones stay
                _remove(old)
        for stale in [*self.root.glob(".tmp-*"), *self.root.glob(".trash-*")]:  # left by a crash
            shutil.rmtree(stale, ignore_errors=True)

    def load(self, path: Path) -> CheckpointState:
        """Read one checkpoint folder; ``CheckpointError`` names the file that is damaged."""
        current = "state.json"
        try:
            meta = json.loads((path / current).read_text())
            step = int(meta["step"])
            current = "adapter.safetensors"
            trainable = load_file(str(path / current))
            current = "trainer.pt"
            blob = torch.load(path / current, weights_only=False)
            optimizer, rng = blob["optimizer"], blob["rng"]
        except _READ_ERRORS as exc:
            text = str(exc).strip()
            detail = f"{type(exc).__name__}: {text.splitlines()[0][:120]}" if text else type(exc).__name__
            raise CheckpointError(f"{path.name}/{current} is unreadable ({detail})") from exc
        return CheckpointState(step=step, trainable=trainable, optimizer=optimizer, rng=rng, extra=meta)

    def load_latest(self) -> tuple[Path, CheckpointState] | None:
        """The newest intact checkpoint, or None when there is none at all.

        Damaged checkpoints newer than it are skipped with a warning and moved aside
        (``corrupt-step_NNNNNN``), so they are neither resumed from nor counted among the kept ones.
        Raises ``CheckpointError`` (and moves nothing) when checkpoints exist but none is intact.
        """
        damaged: list[tuple[Path, CheckpointError]] = []
        for path in reversed(self._complete()):
            try:
                state = self.load(path)
            except CheckpointError as exc:
                logger.warning("checkpoint %s is damaged: %s", path, exc)
                damaged.append((path, exc))
                continue
            for bad, _ in damaged:
                self._set_aside(bad)
            if damaged:
                logger.warning("falling back to %s; the damaged checkpoints were moved to %s", path.name,
                               ", ".join(_CORRUPT_PREFIX + bad.name for bad, _ in damaged))
            return path, state
        if damaged:
            raise CheckpointError(
                f"none of the {len(damaged)} checkpoints in {self.root} is intact (newest: {damaged[0][1]}); "
                "move that folder away to start this run afresh, or pass another --run-dir"
            )
        return None

    def _set_aside(self, path: Path) -> None:
        target = path.with_name(_CORRUPT_PREFIX + path.name)
        with contextlib.suppress(OSError):  # a read-only run dir: leave it where it is
            if target.exists():
                shutil.rmtree(target)
            os.replace(path, target)


def step_of(path: Path) -> int:
    """The step of a checkpoint folder ``step_NNNNNN``."""
    return int(path.name[len(_PREFIX):])


def _remove(path: Path) -> None:
    """Delete a checkpoint folder: first renamed out of sight (atomic), then deleted."""
    trash = path.with_name(f".trash-{path.name}-{os.getpid()}")
    os.replace(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
