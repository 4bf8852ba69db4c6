"""The training pass of a Llama-family LoRA policy in few, large operations: what the trainer runs instead of
transformers' and peft's modules when the model allows it (``train.fused``).

The same function as ``node.policy.logprobs.shared_prompt_logprobs`` (each distinct prompt runs once; the
rows that share it attend to its keys and values; only the completions run per row), computed from the
model's own tensors: the projections by family (``node.fused.projections``: one product for q, k and v
with their adapters, one for gate and up), the rotary embedding on queries and keys together, attention by
``scaled_dot_product_attention`` with grouped heads, each RMSNorm in the order of transformers' own. Per
decoder layer and pass that is about a fifth of the operations of the modules' path, and on a GPU as
many fewer launches; the arithmetic is the same up to float rounding (``tests/node/test_fused_families.py``
compares log-probs and gradients with the modules' path on each family).

Which models: a peft LoRA model over a family whose entry in ``node.policy.families`` says ``fused`` (Llama:
smollm2, tiny-base, small-base; Mistral; Qwen2: Qwen2.5, with its q/k/v biases; Qwen3, with its per-head
query and key norms) with SiLU MLPs, full attention (no sliding window in the config or any layer), no
attention dropout, LoRA only inside decoder layers, without LoRA dropout, DoRA or several adapters.
``fused_pass_refusal`` names what stops any other model; the trainer then runs the modules as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from node.fused.ops import GateUp, Linear, Qkv, RmsNorm, signed_sin
from node.fused.projections import Family, LoraLayout, make_family
from node.policy.families import FAMILIES
from node.policy.logprobs import sliding_window
from node.policy.special import output_bias

_LAYERS = {f.decoder_layer for f in FAMILIES if f.fused}  # node.policy.families says which families it takes


def _norm_weight(module: Any) -> tuple[Tensor, float]:
    """An RMSNorm's weight (a trained copy's, under peft ``modules_to_save``) and epsilon."""
    inner = module
    to_save = getattr(module, "modules_to_save", None)
    if to_save is not None:
        inner = to_save[module.active_adapters[0]]
    if not type(inner).__name__.endswith("RMSNorm"):
        raise ValueError(f"{type(inner).__name__} is not an RMSNorm")
    return inner.weight, float(inner.variance_epsilon)


@dataclass
class _Layer:
    qkv: Family
    o: Family
    gate_up: Family
    down: Family
    norm_in: Tensor
    eps_in: float
    norm_post: Tensor
    eps_post: float
    q_norm: Tensor | None = None  # Qwen3: each head's queries and keys RMS-normalised before the rotary embedding
    k_norm: Tensor | None = None
    eps_qk: float = 0.0


def _base_lm(model: nn.Module) -> Any:
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def fused_pass_refusal(model: nn.Module) -> str | None:
    """Why ``FusedPass`` cannot compute ``model``'s log-probs, or None when it can."""
    try:
        _describe(model)
    except (ValueError, AttributeError, KeyError) as exc:
        return str(exc) or type(exc).__name__
    return None


def _describe(model: nn.Module) -> tuple[Any, list[_Layer]]:
    lm = _base_lm(model)
    config = lm.config
    if getattr(lm, "is_gradient_checkpointing", False):
        raise ValueError("gradient checkpointing recomputes the modules' own pass")
    if getattr(config, "hidden_act", None) != "silu" or getattr(config, "pretraining_tp", 1) != 1:
        raise ValueError(f"hidden_act {getattr(config, 'hidden_act', None)!r}: only silu MLPs are fused")
    # Mistral's attention reads its window from the config, Qwen2's and Qwen3's from the layer's type
    # (their configs set sliding_window to None unless use_sliding_window)
    if sliding_window(lm):
        windows = {"full_attention"} | set(getattr(config, "layer_types", None) or ())
        raise ValueError(f"sliding-window attention (sliding_window {getattr(config, 'sliding_window', None)}, "
                         f"layer types {sorted(windows)}) is not fused")
    if getattr(config, "attention_dropout", 0.0):
        raise ValueError(f"attention_dropout {config.attention_dropout} is not fused")
    out = [_layer(layer) for layer in lm.model.layers]
    fused = {id(m.module) for layer in out for fam in (layer.qkv, layer.o, layer.gate_up, layer.down)
             for m in fam.members if m.rank is not None}
    for name, module in model.named_modules():
        if hasattr(module, "lora_A") and hasattr(module, "get_base_layer") and id(module) not in fused:
            raise ValueError(f"LoRA on {name}, outside the decoder layers' projections, is not fused")
    if not fused:
        raise ValueError("no LoRA layer in the decoder layers")
    _norm_weight(lm.model.norm)
    return lm, out


def _layer(layer: Any) -> _Layer:
    if type(layer).__name__ not in _LAYERS:
        raise ValueError(f"{type(layer).__name__} is not a decoder layer the fused pass knows ({sorted(_LAYERS)})")
    attn, mlp = layer.self_attn, layer.mlp
    if getattr(attn, "sliding_window", None):
        raise ValueError("sliding-window attention is not fused")
    norm_in, eps_in = _norm_weight(layer.input_layernorm)
    norm_post, eps_post = _norm_weight(layer.post_attention_layernorm)
    out = _Layer(make_family([attn.q_proj, attn.k_proj, attn.v_proj]), make_family([attn.o_proj]),
                 make_family([mlp.gate_proj, mlp.up_proj]), make_family([mlp.down_proj]),
                 norm_in, eps_in, norm_post, eps_post)
    if hasattr(attn, "q_norm") or hasattr(attn, "k_norm"):
        (out.q_norm, eps_q), (out.k_norm, eps_k) = _norm_weight(attn.q_norm), _norm_weight(attn.k_norm)
        if eps_q != eps_k or out.q_norm.shape != (attn.head_dim,):
            raise ValueError("query and key norms of other epsilons or shapes than one a head are not fused")
        out.eps_qk = eps_q
    return out


class FusedPass:
    """Built once over a peft LoRA model (see ``fused_pass_refusal``); its weights become views of the
    families' tensors (``layout``), so it is built after the model is on its device and before anything
    copies them."""

    def __init__(self, model: nn.Module) -> None:
        lm, self.layers = _describe(model)
        self.model = model
        self.layout = LoraLayout([f for layer in self.layers for f in (layer.qkv, layer.o, layer.gate_up,
                                                                        layer.down)])
        config = lm.config
        attn = lm.model.layers[0].self_attn
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim, self.scaling = attn.head_dim, float(attn.scaling)
        self.intermediate = self.layers[0].gate_up.members[0].base.out_features
        self.embed, self.rotary = lm.model.embed_tokens, lm.model.rotary_emb
        self.final_norm, self.final_eps = _norm_weight(lm.model.norm)
        self.lm_head_t = lm.lm_head.weight.t()
        bias = output_bias(lm)  # the policy's mask of special tokens (node.policy.special)
        self.logit_bias = None if bias is None else bias.to(self.lm_head_t.dtype)

    def logprobs(self, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], *, pad_id: int,
                 temperature: float = 1.0) -> Tensor:
        """``[B, Tc]`` log-probs of each row's completion tokens (right-padded to the longest, ``Tc``; padding
        positions hold the log-prob of ``pad_id``) after its prompt: ``shared_prompt_logprobs``'s,
        differentiable with respect to the adapters (and trained norms). Token lists in, so nothing is read
        back from the device."""
        device = self.layout.flat.device
        pack = Packing(prompts, completions, pad_id)
        ids, positions, segments, pick, targets = (torch.tensor(t, device=device) for t in pack.tensors())
        h = self._run(ids, positions, pack.attention_mask(segments))
        n, tc = targets.shape
        hidden = h.reshape(-1, h.shape[-1]).index_select(0, pick).view(n, tc, -1)
        hidden = RmsNorm.apply(hidden, self.final_norm, self.final_eps)
        flat_hidden = hidden.view(n * tc, -1)
        logits = (torch.mm(flat_hidden, self.lm_head_t) if self.logit_bias is None
                  else torch.addmm(self.logit_bias, flat_hidden, self.lm_head_t)).view(n, tc, -1)
        logits = logits.float() / temperature
        out: Tensor = torch.log_softmax(logits, -1).gather(-1, targets[..., None]).squeeze(-1)
        return out

    def _run(self, ids: Tensor, positions: Tensor, attn_mask: Tensor) -> Tensor:
        h: Tensor = self.embed(ids)
        cos, sin = self.rotary(h, positions)
        cos, sin = cos[:, :, None], signed_sin(sin)[:, :, None]
        flat = self.layout.flat
        heads, kv_heads = self.heads, self.kv_heads
        for layer in self.layers:
            x = RmsNorm.apply(h, layer.norm_in, layer.eps_in)
            q, k, v = Qkv.apply(x, flat, layer.qkv, cos, sin, heads, kv_heads, layer.q_norm, layer.k_norm,
                                layer.eps_qk)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=self.scaling,
                                               enable_gqa=kv_heads != heads)
            h = h + Linear.apply(a, flat, layer.o, True)
            x = RmsNorm.apply(h, layer.norm_post, layer.eps_post)
            h = h + Linear.apply(GateUp.apply(x, flat, layer.gate_up), flat, layer.down, False)
        return h


class Packing:
    """A micro-batch's rows packed one distinct prompt a row: the prompt (left-padded to the widest), then a
    slot of ``Tc - 1`` positions for each completion of it (the last token predicts nothing, so it is not
    run), right-padded. A completion's tokens attend to its prompt's real tokens and to its own earlier
    tokens, never to another completion's: the function of the rows run one by one, with each prompt's
    keys and values computed once (``shared_prompt_logprobs`` copies its cache; here the rows sit beside
    it). Padding and empty slots attend to their prompt and to padding, which no real query reads (a query
    of nothing but masked keys would give NaN)."""

    def __init__(self, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], pad_id: int) -> None:
        distinct: dict[tuple[int, ...], list[int]] = {}
        for row, p in enumerate(prompts):
            distinct.setdefault(tuple(p), []).append(row)
        self.prompts = list(distinct)
        self.members = list(distinct.values())
        self.width = max(len(p) for p in self.prompts)
        self.tc = max(len(c) for c in completions)
        self.slot = max(self.tc - 1, 0)
        self.slots = max(len(m) for m in self.members)
        self.length = self.width + self.slots * self.slot
        self.completions, self.pad_id = completions, pad_id

    def tensors(self) -> tuple[list[list[int]], list[list[int]], list[list[int]], list[int], list[list[int]]]:
        """Token ids ``[P, S]``, positions ``[P, S]``, segments ``[P, S]`` (-1 a prompt's padding, 0 its
        tokens, j + 1 the j-th completion slot, -2 what no completion fills), for every row and completion
        position the packed position (``p * S + s``) whose hidden state predicts that token ``[B * Tc]``,
        and the completions right-padded ``[B, Tc]``."""
        tc, pad_id = self.tc, self.pad_id
        targets = [list(c) + [pad_id] * (tc - len(c)) for c in self.completions]
        ids, positions, segments = [], [], []
        pick = [0] * (len(self.completions) * self.tc)
        w, slot, length = self.width, self.slot, self.length
        for p, (prompt, rows) in enumerate(zip(self.prompts, self.members)):
            pad = w - len(prompt)
            row_ids = [self.pad_id] * pad + list(prompt)
            row_pos = [0] * pad + list(range(len(prompt)))
            row_seg = [-1] * pad + [0] * len(prompt)
            for j, r in enumerate(rows):
                row_ids += targets[r][:slot]
                row_pos += range(len(prompt), len(prompt) + slot)
                row_seg += [j + 1] * slot
                start = p * length + w + j * slot
                pick[r * self.tc : (r + 1) * self.tc] = [p * length + w - 1, *range(start, start + slot)]
            fill = length - len(row_ids)
            ids.append(row_ids + [self.pad_id] * fill)
            positions.append(row_pos + [0] * fill)
            segments.append(row_seg + [-2] * fill)
        return ids, positions, segments, pick, targets

    def attention_mask(self, segments: Tensor) -> Tensor:
        """``[P, 1, S, S]``: which keys each query attends to (``segments`` from ``tensors``; -2 an empty
        slot's positions, which attend to their prompt like a completion's and are never read)."""
        q, k = segments[:, :, None], segments[:, None, :]
        index = torch.arange(segments.shape[1], device=segments.device)
        earlier = index[:, None] >= index[None, :]
        prompt_key = k == 0
        allowed = (prompt_key & ((q != 0) | earlier)) | ((q == k) & (q != 0) & earlier)
        return allowed[:, None]
