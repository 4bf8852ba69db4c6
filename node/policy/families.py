"""What the node knows of each model family, in one table: which projections an adapter goes on, whether the
fused training pass takes it, which GGUF architecture transformers reads it from, and what sets it apart
(norms, gates, special tokens). Adding a family is one entry here and its row in the family matrix
(``tests/node/test_families.py``), which builds a tiny random model of every family and holds each claim.

A model is matched by its config's ``model_type``. A model of no family here still loads and trains: its
``auto`` targets are every linear layer inside its decoder layers, and it trains through the modules' path
(``docs/models.md`` says what to expect).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

logger = logging.getLogger(__name__)

AUTO = "auto"
"""``adapter.target_modules: auto``: the family's attention and MLP projections (``resolve_targets``)."""
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class ModelFamily:
    """One family: ``model_types`` (its configs' ``model_type``), the leaf names of its attention and MLP
    projections (what ``adapter.target_modules: auto`` adapts), its decoder layer's class name, whether the
    fused pass (``node.fused``) computes it, the GGUF architecture transformers converts it from (None: none)
    and what differs from a Llama."""

    name: str
    model_types: tuple[str, ...]
    decoder_layer: str
    attention: tuple[str, ...] = ATTENTION
    mlp: tuple[str, ...] = MLP
    fused: bool = False
    gguf: str | None = None
    notes: str = ""

    @property
    def targets(self) -> tuple[str, ...]:
        return self.attention + self.mlp


FAMILIES: tuple[ModelFamily, ...] = (
    ModelFamily("llama", ("llama",), "LlamaDecoderLayer", fused=True, gguf="llama",
                notes="RMSNorm, SiLU gate, grouped-query attention (SmolLM2, tiny-base, small-base)"),
    ModelFamily("mistral", ("mistral",), "MistralDecoderLayer", fused=True, gguf="mistral",
                notes="a Llama with sliding-window attention where its config sets a window (the fused pass "
                      "refuses those)"),
    ModelFamily("qwen2", ("qwen2",), "Qwen2DecoderLayer", fused=True, gguf="qwen2",
                notes="biases on q, k and v; an output layer wider than its tokenizer (Qwen2.5: 151,936 for 151,665 "
                      "ids)"),
    ModelFamily("qwen3", ("qwen3",), "Qwen3DecoderLayer", fused=True, gguf="qwen3",
                notes="an RMSNorm on each head's queries and keys before the rotary embedding"),
    ModelFamily("gemma2", ("gemma2",), "Gemma2DecoderLayer", gguf="gemma2",
                notes="norms scale by 1 + w, four norms a layer, GELU gate, embeddings times sqrt(d), soft-capped "
                      "attention and output logits, alternating sliding-window layers"),
    ModelFamily("gemma3", ("gemma3_text", "gemma3"), "Gemma3DecoderLayer", gguf="gemma3",
                notes="Gemma 2's form with query/key norms in place of attention soft-capping, local and global "
                      "rotary bases"),
    ModelFamily("phi3", ("phi3",), "Phi3DecoderLayer", attention=("qkv_proj", "o_proj"),
                mlp=("gate_up_proj", "down_proj"), gguf="phi3",
                notes="q, k and v in one projection, gate and up in one; an output layer wider than its tokenizer "
                      "(32,064 for 32,011 ids)"),
)


def family_named(name: str) -> ModelFamily:
    for family in FAMILIES:
        if family.name == name:
            return family
    raise KeyError(f"no model family {name!r}; known: {[f.name for f in FAMILIES]}")


def family_of(model: Any) -> ModelFamily | None:
    """The family of ``model`` (a transformers model, peft-wrapped or not, or its config), None if none here."""
    config = getattr(model, "config", model)
    model_type = getattr(config, "model_type", None)
    return next((f for f in FAMILIES if model_type in f.model_types), None)


def decoder_linear_names(model: nn.Module) -> list[str]:
    """Leaf names of the linear layers inside ``model``'s decoder layers (a ``ModuleList`` named ``layers``
    or ``h``), in their first order of appearance: what ``auto`` adapts on a model of no known family."""
    names: list[str] = []
    for name, module in model.named_modules():
        parts = name.split(".")
        inside = any(p in ("layers", "h") and i + 1 < len(parts) and parts[i + 1].isdigit()
                     for i, p in enumerate(parts))
        if inside and isinstance(module, nn.Linear) and parts[-1] not in names:
            names.append(parts[-1])
    return names


def resolve_targets(model: nn.Module, requested: str | Sequence[str]) -> list[str]:
    """The leaf names of the linear layers an adapter goes on: ``requested`` when it lists them, else (``auto``)
    the family's attention and MLP projections, or on a model of no family here every linear layer inside its
    decoder layers (logged: the node has not tested that family). Names the model lacks are the caller's to
    refuse."""
    if requested != AUTO:
        return list(requested)
    family = family_of(model)
    if family is not None:
        return list(family.targets)
    names = decoder_linear_names(model)
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    logger.warning("model_type %r is of no family the node has tested (%s): adapter.target_modules=auto adapts "
                   "every linear layer inside its decoder layers (%s); docs/models.md says what to expect",
                   model_type, ", ".join(f.name for f in FAMILIES), ", ".join(names) or "none found")
    return names


def mlp_projections(model: nn.Module) -> tuple[str, ...]:
    """The MLP projections ReMix routes its LoRAs on: the family's (Phi-3: ``gate_up_proj``, ``down_proj``),
    a Llama's on a model of no family here (``attach_remix`` refuses the model when they are missing)."""
    family = family_of(model)
    return family.mlp if family is not None else MLP
