"""The embedded models, by name: a config says ``model.name_or_path: tiny-base`` (or ``small-base``) and the
node loads that model's folder through ``AutoModelForCausalLM`` / ``AutoTokenizer``, the same path that
serves a hub model or a local folder.

Both are shipped in the package, so every machine runs the same weights: ``tiny-base`` (1.7 MB,
``node/sources/assets/tiny-base/``) and ``small-base`` (about 10.5 MB, ``node/sources/assets/small-base/``). Each folder
holds a ``build_info.json`` of what its build measured; the script named beside each rebuilds it.
``node.sources.locate`` maps names to folders. This module is light (no torch): the CLI reads it before the
heavy imports.
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

    @property
    def path(self) -> Path:
        return ASSETS_DIR / self.name


EMBEDDED_MODELS: tuple[EmbeddedModel, ...] = (
    EmbeddedModel(
        name="tiny-base",
        aliases=("embedded",),
        build_script="scripts/build/build_tiny_base.py",
        summary="0.43M-parameter Llama, character tokenizer, 2-digit arithmetic",
    ),
    EmbeddedModel(
        name="small-base",
        aliases=(),
        build_script="scripts/build/build_small_base.py",
        summary="5M-parameter Llama, byte-level BPE tokenizer and ChatML template, arith and reasoning-gym",
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
