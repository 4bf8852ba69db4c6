"""The models shipped inside the package, by name: a config says ``model.name_or_path: small-base`` and the
node loads the folder ``node/assets/small-base/`` through ``AutoModelForCausalLM`` / ``AutoTokenizer``, the
same path that serves a hub model or a local folder.

Each folder is written by its build script (``scripts/build_<name>.py``) and holds a ``build_info.json``
of what the build measured. Any other name is returned unchanged, for transformers to resolve.
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
        build_script="scripts/build_tiny_base.py",
        summary="0.43M-parameter Llama, character tokenizer, 2-digit arithmetic",
    ),
    EmbeddedModel(
        name="small-base",
        aliases=(),
        build_script="scripts/build_small_base.py",
        summary="Qwen2-architecture model, BPE tokenizer and ChatML template, arith and reasoning-gym",
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


def resolve_model_path(name_or_path: str) -> str:
    """Map an embedded model's name to its shipped folder; return anything else unchanged."""
    model = embedded_model(name_or_path)
    return str(model.path) if model is not None else name_or_path


def build_environment() -> dict[str, str]:
    """What a byte-identical rebuild needs to match (recorded in ``build_info.json``): library versions
    and the CPU kernels torch dispatches to (e.g. ``AVX512``); the thread count is recorded separately."""
    import tokenizers
    import torch
    import transformers

    return {
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "tokenizers_version": tokenizers.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }


def environment_differences(info: dict[str, object]) -> dict[str, tuple[object, str]]:
    """The build-environment fields where ``info`` (a ``build_info.json``) differs from this machine."""
    return {k: (info.get(k), v) for k, v in build_environment().items() if info.get(k) != v}
