"""Where the base model comes from: an embedded folder, a model fetched from the package registry
(``smollm2-135m``), a local GGUF file, a local folder, or the local Hugging Face cache.

This module is light (no torch, no transformers), so the CLI checks ``model.name_or_path`` before the
heavy imports. Nothing is downloaded from a model hub: a hub name that is not in the local cache fails at
once with a hint, instead of after about a minute of retries against a hub that may be unreachable; a hub
name that is in the cache is loaded with ``local_files_only``, so the hub is never asked. A registry model
not fetched yet, or a GGUF not converted yet, comes back with a ``build`` that makes its cached folder
(``node.sources.fetched``) when the node loads it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from node.errors import PolicyError
from node.sources.cache import DONE_FILE, cached_folder, is_complete
from node.sources.embedded.catalog import embedded_model, embedded_names
from node.sources.fetched import (
    convert_local_gguf,
    fetch,
    gguf_cache_key,
    gguf_file_of,
    registry_model,
    registry_names,
)

__all__ = ["EMBEDDED_ALIASES", "TINY_BASE_NAME", "ModelLocation", "locate_model", "resolve_model_path",
           "tiny_base_path"]

TINY_BASE_NAME = "tiny-base"
EMBEDDED_ALIASES: frozenset[str] = frozenset({TINY_BASE_NAME, "embedded"})
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


def tiny_base_path() -> Path:
    """Return the folder of the shipped tiny base model (``node/sources/assets/tiny-base``)."""
    return Path(__file__).resolve().parent / "assets" / TINY_BASE_NAME


def resolve_model_path(name_or_path: str) -> str:
    """Map an embedded model's name (``node.sources.embedded.catalog``) to its folder; return anything else unchanged."""
    model = embedded_model(name_or_path)
    return str(model.path) if model is not None else name_or_path


@dataclass(frozen=True)
class ModelLocation:
    """What ``from_pretrained`` is given: a folder, or a hub name found in the local cache; ``build`` builds
    the folder first (an embedded model not built on this machine yet), else None."""

    path: str
    local_files_only: bool
    build: Callable[[], Path] | None = None
    golden: str | None = None  # the model whose golden record (node.sources.golden) the folder must match


def _in_hf_cache(repo_id: str, cache_dir: str | None = None) -> bool:
    """Whether the hub cache holds ``repo_id``'s current snapshot with its ``config.json``.

    Reads the documented cache layout (``models--ORG--NAME/refs/main`` names a folder under
    ``snapshots/``) instead of calling ``huggingface_hub.try_to_load_from_cache``, which imports the hub's
    whole HTTP stack (a second or more); ``tests/node/test_locate.py`` checks that both agree.
    """
    from huggingface_hub import constants  # light: paths and environment only

    repo = Path(cache_dir or constants.HF_HUB_CACHE) / f"models--{repo_id.replace('/', '--')}"
    try:
        commit = (repo / "refs" / "main").read_text().strip()
    except OSError:
        return False
    return bool(commit) and (repo / "snapshots" / commit / "config.json").is_file()


def _golden_name(name_or_path: str, folder: Path) -> str | None:
    """The embedded or fetched model a folder is (by name, or by the GGUF its ``build_info.json`` names)."""
    embedded = embedded_model(name_or_path)
    if embedded is not None:
        return embedded.name
    try:
        info = json.loads((folder / DONE_FILE).read_text())
    except (OSError, ValueError):
        return None
    fetched = registry_model(str(info.get("name"))) if isinstance(info, dict) else None
    return fetched.name if fetched is not None and info.get("gguf_sha256") == fetched.sha256 else None


def locate_model(name_or_path: str, cache_dir: str | None = None, gguf_file: str | None = None) -> ModelLocation:
    """Find the model ``model.name_or_path`` (and ``model.gguf_file``) names, or raise a one-line
    ``PolicyError`` saying what to do.

    ``cache_dir`` is the Hugging Face hub cache (default: ``HF_HUB_CACHE``, i.e. ``~/.cache/huggingface/hub``).
    """
    fetched = registry_model(name_or_path)
    if fetched is not None:
        return ModelLocation(str(fetched.path), local_files_only=True,
                             build=None if fetched.is_fetched() else lambda: fetch(fetched), golden=fetched.name)
    gguf = gguf_file_of(name_or_path, gguf_file)
    if gguf is not None:
        folder = cached_folder(gguf_cache_key(gguf))
        return ModelLocation(str(folder), local_files_only=True,
                             build=None if is_complete(folder) else lambda: convert_local_gguf(gguf))
    resolved = resolve_model_path(name_or_path)
    if Path(resolved).expanduser().is_dir():
        folder = Path(resolved).expanduser()
        return ModelLocation(str(folder), local_files_only=False, golden=_golden_name(name_or_path, folder))
    if Path(resolved).expanduser().exists() or not _REPO_ID.fullmatch(resolved):
        raise PolicyError(
            f"model.name_or_path={name_or_path!r} is not a folder; give a folder written by save_pretrained, "
            f"a .gguf file, a hub name in the local Hugging Face cache, or one of {embedded_names() + registry_names()}"
        )
    if _in_hf_cache(resolved, cache_dir):
        return ModelLocation(resolved, local_files_only=True)
    raise PolicyError(
        f"model.name_or_path={name_or_path!r} is neither a local folder nor in the local Hugging Face cache, "
        f"and nothing is downloaded at run time: on a connected machine run `hf download {resolved}` "
        "(same HF_HOME), or give a folder written by save_pretrained"
    )
