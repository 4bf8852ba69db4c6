"""The policy's effective weights, named as in the base model's checkpoint, for an engine to load.

A LoRA-adapted linear layer contributes ``W + scaling * B @ A`` (summed in float32, then cast), a trained
norm (peft ``modules_to_save``) its trained copy, every other layer of the decoder its frozen weights. All
parameters of every decoder layer are included even where nothing is trained, because engines fuse
layers (``q/k/v_proj`` into one ``qkv_proj``, ``gate/up_proj`` into ``gate_up_proj``) and reload a fused
layer only when all of its parts arrive. The input and output embeddings are left out (never adapted here).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import nn


def base_model_of(model: nn.Module) -> Any:
    """The transformers model inside a peft model (``model`` itself when it is not one)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def merged_lora_weight(module: Any) -> torch.Tensor:
    """The weight a peft LoRA linear layer computes with: ``W + scaling * B @ A`` summed over its active
    adapters, in float32 (the base weight itself, untouched, when it has none or they are merged already)."""
    weight: torch.Tensor = module.get_base_layer().weight.detach()
    if getattr(module, "merged", False):
        return weight
    for name in module.active_adapters:
        if name not in module.lora_A:
            continue
        if module.use_dora.get(name, False):
            raise ValueError("DoRA adapters cannot be merged for an engine")
        a = module.lora_A[name].weight.detach().float()
        b = module.lora_B[name].weight.detach().float()
        # W + scaling * B @ A in one pass, into a new float32 tensor (the base weight stays untouched)
        weight = torch.addmm(weight.float(), b, a, alpha=module.scaling[name])
    return weight


def _merged_lora(module: Any) -> dict[str, torch.Tensor]:
    """``weight`` (LoRA deltas of the active adapters merged in) and ``bias`` of a peft LoRA linear layer."""
    out = {"weight": merged_lora_weight(module)}
    base = module.get_base_layer()
    if getattr(base, "bias", None) is not None:
        out["bias"] = base.bias.detach()
    return out


def effective_weights(model: nn.Module, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """``(checkpoint name, tensor)`` for every parameter of the decoder layers and the final norm of
    ``model`` (a peft model or a plain causal LM), as the policy computes with them, cast to ``dtype``.
    Lazily: a layer is merged when the consumer asks for it, so only the layers in flight are held twice
    (a list of them all would hold a second copy of the whole decoder during a sync)."""
    from peft.tuners.lora import LoraLayer
    from peft.utils import ModulesToSaveWrapper

    base = base_model_of(model)
    out_embeddings = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    handled: list[str] = []  # wrapper prefixes whose children are already accounted for
    for name, module in base.named_modules():
        if any(name.startswith(prefix + ".") for prefix in handled):
            continue
        if isinstance(module, LoraLayer):
            params = _merged_lora(module)
            handled.append(name)
        elif isinstance(module, ModulesToSaveWrapper):
            trained = module.modules_to_save[module.active_adapters[0]]
            params = {n: p.detach() for n, p in trained.named_parameters()}
            handled.append(name)
        elif isinstance(module, nn.Embedding) or module is out_embeddings:
            continue
        else:
            params = {n: p.detach() for n, p in module.named_parameters(recurse=False)}
        for n, t in params.items():
            yield f"{name}.{n}", t.to(dtype).contiguous()
