"""The run directory: created and checked writable before anything heavy is loaded.

A run dir that cannot be written (a read-only file system, no permission, a file in the way) is the
user's mistake: one ``ConfigError`` line naming the folder and the reason, not a traceback from deep in
the first checkpoint or metrics write. A run dir that an invocation created and that holds no step when
the invocation fails is removed again (``remove_if_unused``), so a mistake leaves no empty run behind.
Restarting a run with other settings is allowed, and said in one line (``config_changes``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from node.errors import ConfigError

__all__ = ["clear_run_marker", "config_changes", "missing_dirs", "prepare_run_dir", "process_started_at",
           "remove_if_unused", "say_config_changes", "write_run_marker"]

logger = logging.getLogger(__name__)
_MAX_CHANGES_SHOWN = 6
_IMPORTED_AT = time.time()


def process_started_at() -> float:
    """Unix time this process started (the command's start: ``/proc/self/stat``), else when this module was
    imported (no ``/proc``)."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - uptime + int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: start, in ticks
    except (OSError, ValueError, IndexError):
        return _IMPORTED_AT


def write_run_marker(run_dir: str | os.PathLike[str], *, api: bool) -> None:
    """Say in ``run_dir`` that this process runs there (``node.api.client.RUN_MARKER``): ``swarm-node status
    --run-dir`` answers "starting" instead of "not a run dir" while the model loads. ``api``: whether a status API
    will answer. A run dir that does not exist yet appears with the marker already in it (made as a hidden sibling,
    then renamed into place), so no reader finds the folder without it."""
    from node.api.client import RUN_MARKER

    path = Path(run_dir)
    marker = json.dumps({"pid": os.getpid(), "started_at": process_started_at(), "api": api})
    if not path.exists():
        staging = path.with_name(f".{path.name}.starting-{os.getpid()}")
        try:
            staging.mkdir()
            (staging / RUN_MARKER).write_text(marker, encoding="utf-8")
            os.rename(staging, path)  # atomic; fails if another process made the folder meanwhile
            return
        except OSError:
            with contextlib.suppress(OSError):
                (staging / RUN_MARKER).unlink(missing_ok=True)
                staging.rmdir()
    tmp = path / (RUN_MARKER + ".tmp")
    with contextlib.suppress(OSError):
        path.mkdir(parents=True, exist_ok=True)
        tmp.write_text(marker, encoding="utf-8")
        os.replace(tmp, path / RUN_MARKER)


def clear_run_marker(run_dir: str | os.PathLike[str]) -> None:
    """Remove ``write_run_marker``'s file if it is this process's."""
    from node.api.client import RUN_MARKER

    path = Path(run_dir) / RUN_MARKER
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        if int(json.loads(path.read_text(encoding="utf-8"))["pid"]) == os.getpid():
            path.unlink()


def prepare_run_dir(run_dir: str | os.PathLike[str]) -> Path:
    """Create ``run_dir`` if needed and check that files can be written in it; return it as a ``Path``."""
    path = Path(run_dir)
    probe = path / f".write-test-{os.getpid()}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigError(
            f"run_dir {str(path)!r} is not writable ({reason}); pass a writable folder with --run-dir"
        ) from None
    return path


def missing_dirs(run_dir: str | os.PathLike[str]) -> list[Path]:
    """The folders ``prepare_run_dir`` would create for ``run_dir``, deepest first (none if it exists)."""
    out: list[Path] = []
    path = Path(run_dir).absolute()
    while not path.exists() and path != path.parent:
        out.append(path)
        path = path.parent
    return out


def remove_if_unused(created: list[Path]) -> None:
    """After a failed invocation: remove the run dir it created (``created``, from ``missing_dirs``) when no
    step was recorded in it (no metrics row, no checkpoint), and the parents it created if left empty."""
    if not created or not created[0].is_dir():
        return
    run_dir = created[0]
    metrics = run_dir / "metrics.jsonl"
    if (metrics.is_file() and metrics.stat().st_size > 0) or any((run_dir / "checkpoints").glob("step_*")):
        return
    shutil.rmtree(run_dir, ignore_errors=True)
    for parent in created[1:]:
        try:
            parent.rmdir()  # only if empty
        except OSError:
            break


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, Mapping):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def config_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """``key old -> new`` for every setting that differs between two config dumps (dotted keys, sorted)."""
    a, b = _flatten(old), _flatten(new)
    changed = sorted(k for k in a.keys() | b.keys() if a.get(k, "<unset>") != b.get(k, "<unset>"))
    return [f"{k} {json.dumps(a.get(k, '<unset>'))} -> {json.dumps(b.get(k, '<unset>'))}" for k in changed]


def say_config_changes(old: Mapping[str, Any], new: Mapping[str, Any], run_dir: Path) -> None:
    """One warning line naming what changed since the run dir's last start (when anything did)."""
    changes = config_changes(old, new)
    if not changes:
        return
    shown = "; ".join(changes[:_MAX_CHANGES_SHOWN])
    more = f"; and {len(changes) - _MAX_CHANGES_SHOWN} more" if len(changes) > _MAX_CHANGES_SHOWN else ""
    logger.warning("resuming %s with changed settings: %s%s", run_dir.name, shown, more)
