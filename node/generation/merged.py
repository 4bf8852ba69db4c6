"""A generation copy of a LoRA policy: the same modules, with every LoRA layer a plain linear layer whose
weight is ``W + scaling * B @ A``.

Why: each peft LoRA layer adds a cast of its input, two small matmuls, a scale, an add and a cast back to
every linear layer of the decoder, once a token. On a GPU every one of them is a kernel launch, and a
decode step of a small model is launch-bound: the merged copy does what the base model does, about half
the operations a token (``scripts/bench/bench_generation.py --count-ops`` counts them).

What it costs: the adapted layers' weights are held twice (the frozen base and the merged copy, in the
model's dtype); everything else (embeddings, norms, trained norms, biases) is the policy's own tensors,
shared, not copied. The merged weights are recomputed (in float32, then cast) after every optimizer step
(``refresh``, called by the backend's ``sync``) and before a generation whose adapters changed since
(``refresh_if_changed``: parameter version counters, so an update nobody announced is seen too).

Exactness: in float32 the copy computes the trainer's function up to float rounding (log-probs agree to
about 1e-6). In bfloat16 or float16 the merged weight is rounded once to the model's dtype, which the
trainer's unmerged forward never does: generation then differs from the trainer as an engine does (vLLM
with merged weights), and ``train.engine_is_cap`` corrects it the same way.

Made outside inference mode, updated in place: generation only reads it, so a generation under
``torch.inference_mode`` never creates state that a later refresh updates.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

import torch
from torch import nn

from node.generation.weights import base_model_of, merged_lora_weight

logger = logging.getLogger(__name__)


def lora_layers(model: nn.Module) -> list[tuple[str, Any]]:
    """``(name, module)`` of every peft LoRA layer of ``model`` (empty for a plain model or ReMix)."""
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:
        return []
    return [(name, m) for name, m in model.named_modules() if isinstance(m, LoraLayer)]


class MergedCopy:
    """``module``: the policy's base model with its LoRA layers merged, for generation only (eval mode)."""

    def __init__(self, model: nn.Module) -> None:
        from peft.utils import ModulesToSaveWrapper

        base = base_model_of(model)
        shared = {id(t): t for t in (*base.parameters(), *base.buffers())}
        with torch.inference_mode(False), torch.no_grad():
            self.module: nn.Module = copy.deepcopy(base, memo=dict(shared))  # new modules, the same tensors
            self._pairs: list[tuple[Any, nn.Linear]] = []
            for name, source in lora_layers(base):
                if any(source.use_dora.get(a, False) for a in source.active_adapters):
                    raise ValueError(f"{name}: DoRA adapters cannot be merged for generation")
                layer = source.get_base_layer()
                merged = nn.Linear(layer.in_features, layer.out_features, bias=False, device=layer.weight.device,
                                   dtype=layer.weight.dtype)
                merged.weight.requires_grad_(False)
                if getattr(layer, "bias", None) is not None:
                    merged.bias = layer.bias  # shared: never adapted here
                _set_submodule(self.module, name, merged)
                self._pairs.append((source, merged))
            for name, wrapper in list(self.module.named_modules()):  # trained norms: the trained copy itself
                if isinstance(wrapper, ModulesToSaveWrapper):
                    _set_submodule(self.module, name, wrapper.modules_to_save[wrapper.active_adapters[0]])
        self.module.eval()
        self._sources = [p for source, _ in self._pairs for p in source.parameters()]
        self._versions: tuple[int, ...] = ()
        self.refresh()

    @property
    def merged_layers(self) -> int:
        return len(self._pairs)

    def extra_bytes(self) -> int:
        """Memory the copy adds: its merged weights."""
        return sum(m.weight.numel() * m.weight.element_size() for _, m in self._pairs)

    def _current_versions(self) -> tuple[int, ...]:
        return tuple(p._version for p in self._sources)

    def refresh(self) -> None:
        """Recompute every merged weight from the policy's current adapters."""
        with torch.inference_mode(False), torch.no_grad():
            for source, merged in self._pairs:
                merged.weight.copy_(merged_lora_weight(source))
        self._versions = self._current_versions()

    def refresh_if_changed(self) -> bool:
        """Refresh when any adapter or base weight was updated in place since the last refresh."""
        if self._current_versions() == self._versions:
            return False
        self.refresh()
        return True


def _set_submodule(root: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, leaf, module)
