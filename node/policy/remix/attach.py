"""ReMix: a routed mixture of LoRAs on the MLP projections of every decoder layer.

Each MLP projection of decoder layer ``l`` (its family's, ``node.policy.families``: ``gate_proj``,
``up_proj``, ``down_proj``, or a Phi-3's ``gate_up_proj`` and ``down_proj``) holds n LoRAs; a router per
layer (``nn.Linear(D, n, bias=False)``, zero-initialised so routing starts uniform) reads the layer input
averaged over the *prompt* tokens (detached) and picks k of them per sequence, all with the same fixed
weight ``omega`` (see ``docs/algorithms.md``, section ReMix).

Usage, generation (deterministic top-k)::

    adapter = attach_remix(model, n=8, k=2, rank=4)
    adapter.deterministic()
    adapter.set_prompt_mask(prompt_attention_mask.bool())   # [B, T_prompt], left-padded prompts
    out = model.generate(input_ids, attention_mask=prompt_attention_mask, ...)
    routing = adapter.last_routing()                         # [B, L, k], store with the rollouts

Usage, training (M sampled routings per sequence, routing-major rows)::

    adapter.sampled(M, generator)
    adapter.set_prompt_mask(prompt_mask.repeat(M, 1))        # [M*B, T], True on prompt tokens
    logits = model(input_ids.repeat(M, 1), attention_mask=attention_mask.repeat(M, 1)).logits
    loss = policy_loss_over_all_rows + adapter.router_loss(per_sequence_loss, M)

The routing is computed by a forward pre-hook of each decoder layer at the first forward after
``set_prompt_mask`` (the prefill) and kept for the KV-cached decode steps that follow. In deterministic
mode a later forward over prompt + completion (prompt mask marking the prompt) reproduces the routing the
generation used, because the prompt positions see the same hidden states under causal attention.

Files: this module is the public entry point; ``adapter.py`` holds :class:`RemixAdapter`,
``ops.py`` the routing math (:func:`gumbel_topk`, :func:`plackett_luce_logprob`) and
:class:`~node.policy.remix.ops.RemixLinear`.
"""

from __future__ import annotations

import logging
from typing import Literal

from torch import nn

from node.policy.remix.adapter import RemixAdapter, RemixSpec
from node.policy.remix.ops import RemixError, gumbel_topk, lora_omega, plackett_luce_logprob

logger = logging.getLogger(__name__)

__all__ = [
    "RemixAdapter",
    "RemixError",
    "RemixSpec",
    "attach_remix",
    "gumbel_topk",
    "plackett_luce_logprob",
]


def attach_remix(
    model: nn.Module,
    n: int,
    k: int,
    rank: int,
    scale: Literal["lora", "rslora"] = "lora",
    alpha: float | None = None,
    centre: bool = False,
) -> RemixAdapter:
    """Freeze ``model`` and attach ReMix to the MLP projections of every decoder layer (in place).

    Args:
        model: a Llama/Qwen2-style causal LM (decoder layers at ``model.model.layers``).
        n: LoRAs per projection; k: active per sequence and layer (``1 <= k <= n``); rank: r of each LoRA.
        scale: ``omega = (alpha/r)/k`` ("lora") or ``alpha/sqrt(r)/k`` ("rslora").
        alpha: LoRA alpha; ``None`` means ``alpha = r`` (a plain LoRA scale of 1 before the ``1/k``).
        centre: route on the pooled input less a running mean of the training batches' pooled inputs
            (``adapter.remix.centre``).

    Returns:
        The :class:`RemixAdapter`, in deterministic mode.
    """
    if n < 1 or not 1 <= k <= n or rank < 1:
        raise RemixError(f"need n >= 1, 1 <= k <= n and rank >= 1, got n={n}, k={k}, rank={rank}")
    alpha_value = float(rank) if alpha is None else float(alpha)
    spec = RemixSpec(
        n=n, k=k, rank=rank, scale=scale, alpha=alpha_value, omega=lora_omega(k, rank, alpha_value, scale),
        centre=centre,
    )
    model.requires_grad_(False)
    adapter = RemixAdapter(model, spec)
    adapter._install()
    logger.info("attached ReMix to %d decoder layers: %s", adapter.num_layers, spec)
    return adapter
