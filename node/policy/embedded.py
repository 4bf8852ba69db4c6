"""The embedded models, by name: a config says ``model.name_or_path: tiny-base`` (or ``small-base``) and the
node loads that model's folder through ``AutoModelForCausalLM`` / ``AutoTokenizer``, the same path that
serves a hub model or a local folder.

``tiny-base`` (1.7 MB) is shipped in the package (``node/assets/tiny-base/``). ``small-base`` (about 10 MB)
is not: it is built deterministically on this machine the first time it is named (minutes on a CPU, by
``node.policy.small_build``, which ``scripts/build_small_base.py`` also runs) and cached under
``~/.cache/swarm-node/`` (``$SWARM_NODE_CACHE`` to move it); later runs reuse the cached folder. Each
folder holds a ``build_info.json`` of what its build measured. ``node.policy.locate`` maps names to folders.
This module is light (no torch): the CLI reads it before the heavy imports.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

ASSETS_DIR = Path(__file__).resolve().parent.parent / "assets"


@dataclass(frozen=True)
class EmbeddedModel:
    """One shipped model: its name, other names that select it, and the script that rebuilds it."""

    name: str
    aliases: tuple[str, ...]
    build_script: str
    summary: str
    shipped: bool = True  # False: built on first use and cached (``node.policy.small_build``)

    @property
    def path(self) -> Path:
        """Where the model's folder is (a cached model's folder may not be built yet)."""
        if self.shipped:
            return ASSETS_DIR / self.name
        from node.policy.small_recipe import cached_path  # light: no torch

        return cached_path()

    def is_built(self) -> bool:
        return (self.path / "build_info.json").is_file()

    def ensure(self) -> Path:
        """The model's folder, built first if it is a cached model not built on this machine yet."""
        if self.shipped:
            return self.path
        from node.policy.small_build import ensure_built

        return ensure_built()


EMBEDDED_MODELS: tuple[EmbeddedModel, ...] = (
    EmbeddedModel(
        name="tiny-base",
        aliases=("embedded",),
        build_script="scripts/build_tiny_base.py",
        summary="0.43M-parameter Llama, character tokenizer, 2-digit arithmetic",
    ),
    EmbeddedModel(
        name="small-base",
        aliases=(),
        build_script="scripts/build_small_base.py",
        summary="5M-parameter Llama, byte-level BPE tokenizer and ChatML template, arith and reasoning-gym",
        shipped=False,
    ),
)


def embedded_model(name: str) -> EmbeddedModel | None:
    """The shipped model called ``name`` (or one of its aliases), or None."""
    for model in EMBEDDED_MODELS:
        if name == model.name or name in model.aliases:
            return model
    return None


def embedded_names() -> list[str]:
    return [model.name for model in EMBEDDED_MODELS]
