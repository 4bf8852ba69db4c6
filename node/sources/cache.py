"""Model folders made once on this machine and cached: ``~/.cache/swarm-node/<key>/`` (``$SWARM_NODE_CACHE``
moves it).

A folder is complete when its ``build_info.json`` exists; that file is written last, so a folder without it
is an interrupted build, which the next attempt replaces. ``ensure_cached`` makes a folder under a file lock
(nodes started together make it once; the others wait, then reuse it) in a staging folder beside the final
one, renamed into place only when complete. Light: no torch, so the CLI can ask whether a model is there
before the heavy imports.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

CACHE_ENV = "SWARM_NODE_CACHE"
DONE_FILE = "build_info.json"


def cache_root() -> Path:
    """``$SWARM_NODE_CACHE``, else ``$XDG_CACHE_HOME/swarm-node``, else ``~/.cache/swarm-node``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "swarm-node"


def cached_folder(key: str) -> Path:
    return cache_root() / key


def is_complete(path: Path) -> bool:
    return (path / DONE_FILE).is_file()


def echo_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def ensure_cached(key: str, make: Callable[[Path], None], *, what: str,
                  echo: Callable[[str], None] | None = None,
                  recheck: Callable[[Path], str | None] | None = None) -> Path:
    """The complete cached folder ``key``, made first by ``make(staging_folder)`` if it is not there yet.

    ``make`` writes the folder's files and ``DONE_FILE`` last; ``what`` says in one line what making it
    involves (shown before it starts). Raises whatever ``make`` raises, leaving no partial folder behind.
    ``recheck`` looks at a complete folder first: when it returns a reason, the folder is made again (e.g.
    one converted by a library version that got a field wrong).
    """
    path = cached_folder(key)
    if is_complete(path) and recheck is None:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process making it: wait, then reuse its folder
        if is_complete(path):
            reason = recheck(path) if recheck is not None else None
            if reason is None:
                return path
            (echo or echo_stderr)(f"{key}: the cached folder fails its checks ({reason}); making it again")
        (echo or echo_stderr)(f"{key}: {what}; once, into {path} (reused afterwards)")
        staging = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=path.parent))
        staging.chmod(0o755)  # mkdtemp's 0700: the finished folder reads like any model folder
        try:
            make(staging)
            if not is_complete(staging):
                raise RuntimeError(f"making {key} wrote no {DONE_FILE}")
            if path.exists():  # an interrupted earlier attempt
                shutil.rmtree(path)
            os.replace(staging, path)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return path
