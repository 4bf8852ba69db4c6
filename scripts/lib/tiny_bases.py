"""Tiny bases built to order for experiments: ``cached_base(options)`` runs ``scripts/build/build_tiny_base.py``
with those options once, in a child process, under a cache folder keyed by the options, the build's format and
torch's version (``runs/tiny-bases/``), and returns the folder."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT / "scripts" / "build" / "build_tiny_base.py"
CACHE_ROOT = ROOT / "runs" / "tiny-bases"
BUILD_FORMAT = 1  # bump when a change to build_tiny_base.py changes what the same options build


def cache_key(options: list[str]) -> str:
    """12 hex digits naming what ``options`` build: the options, this script's format and torch's version."""
    canonical = json.dumps({"options": options, "format": BUILD_FORMAT, "torch": torch.__version__})
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def cached_base(options: list[str], name: str = "base", cache_root: Path = CACHE_ROOT) -> Path:
    """The folder of the base built with ``options`` (``--out`` excluded), building it first if needed.

    Built in a child process (it sets process-wide determinism flags) into a temporary folder that is
    renamed into place only when complete, so an interrupted build is never mistaken for a finished one.
    """
    if "--out" in options:
        raise ValueError("cached_base chooses the output folder itself; leave --out out of the options")
    final = cache_root / f"{name}-{cache_key(options)}"
    if (final / "build_info.json").is_file():
        return final
    cache_root.mkdir(parents=True, exist_ok=True)
    tmp = cache_root / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(BUILD_SCRIPT), "--out", str(tmp), *options],
                          env=env, capture_output=True, text=True)
    if done.returncode != 0 and not (tmp / "build_info.json").is_file():
        raise RuntimeError(f"building tiny base {name} {options} failed:\n{done.stderr[-2000:]}")
    if final.exists():  # built meanwhile by another process: keep theirs
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        os.replace(tmp, final)
    return final
