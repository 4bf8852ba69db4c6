"""The run directory: created and checked writable before anything heavy is loaded.

A run dir that cannot be written (a read-only file system, no permission, a file in the way) is the
user's mistake: one ``ConfigError`` line naming the folder and the reason, not a traceback from deep in
the first checkpoint or metrics write.
"""

from __future__ import annotations

import os
from pathlib import Path

from node.errors import ConfigError

__all__ = ["prepare_run_dir"]


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
