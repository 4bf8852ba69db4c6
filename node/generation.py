"""The node's own sampling loop (the HF backend's): KV cache, left padding, temperature and top-p.

Returns, for every completion, its token ids, the per-token log-probs of the distribution the token was
actually drawn from (after temperature and top-p), and a mask that ends at (and includes) the first EOS.
Only the last position's logits are computed (``logits_to_keep=1``), the attention mask is allocated once,
and sampling draws from a generator on the policy's device, so no step copies logits to the host.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase


@dataclass
class Completions:
    """One generate call's output. ``completion_ids``, ``behavior_logprobs``, ``completion_mask``: ``[B, T]``."""

    completion_ids: torch.Tensor
    behavior_logprobs: torch.Tensor
    completion_mask: torch.Tensor
    finish_reasons: list[str]
    routing: torch.Tensor | None = None  # [B, L, k] ReMix routing, when the policy has one

    def row(self, i: int) -> tuple[list[int], list[float]]:
        """Token ids and behaviour log-probs of completion ``i``, cut at its mask."""
        n = int(self.completion_mask[i].sum())
        return self.completion_ids[i, :n].tolist(), self.behavior_logprobs[i, :n].tolist()


def concat_completions(parts: list[Completions], pad_id: int = 0) -> Completions:
    """Several calls' completions as one, rows in order, right-padded to the longest."""
    if len(parts) == 1:
        return parts[0]
    width = max(p.completion_ids.shape[1] for p in parts)

    def pad(t: torch.Tensor, value: float | bool | int) -> torch.Tensor:
        return torch.nn.functional.pad(t, (0, width - t.shape[1]), value=value)

    routing = None if parts[0].routing is None else torch.cat([p.routing for p in parts])  # type: ignore[misc]
    return Completions(torch.cat([pad(p.completion_ids, pad_id) for p in parts]),
                       torch.cat([pad(p.behavior_logprobs, 0.0) for p in parts]),
                       torch.cat([pad(p.completion_mask, False) for p in parts]),
                       [r for p in parts for r in p.finish_reasons], routing)


def left_pad(sequences: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, L]`` ids and attention mask, each row right-aligned."""
    width = max((len(s) for s in sequences), default=0)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, s in enumerate(sequences):
        if s:
            ids[i, width - len(s) :] = torch.tensor(s, dtype=torch.long)
            mask[i, width - len(s) :] = 1
    return ids, mask


def right_pad(sequences: Sequence[Sequence[float]], pad_value: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, L]`` values and mask, each row left-aligned."""
    width = max((len(s) for s in sequences), default=0)
    values = torch.full((len(sequences), width), pad_value, dtype=dtype)
    mask = torch.zeros((len(sequences), width), dtype=torch.bool)
    for i, s in enumerate(sequences):
        if s:
            values[i, : len(s)] = torch.tensor(s, dtype=dtype)
            mask[i, : len(s)] = True
    return values, mask


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids that ignore left padding: ``[B, L]``, 0 at each row's first real token."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Mask (to -inf) the tokens outside the smallest set whose probability reaches ``top_p``. ``[B, V]``."""
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = sorted_logits.softmax(-1)
    before = probs.cumsum(-1) - probs  # mass strictly before each token
    drop_sorted = before >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


@torch.inference_mode()
def generate(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    greedy: bool = False,
    generator: torch.Generator | None = None,
    device: torch.device | None = None,
    remix: Any = None,
) -> Completions:
    """Sample one completion per prompt (token-id lists, already formatted and with BOS if any)."""
    device = device or torch.device("cpu")
    eos_id = tokenizer.eos_token_id
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_id
    ids, prompt_mask = left_pad(prompts, pad_id)
    ids, prompt_mask = ids.to(device), prompt_mask.to(device)
    batch, width = ids.shape
    if remix is not None:  # generation routes deterministically (top-k), fixed per sequence
        remix.deterministic()
        remix.set_prompt_mask(prompt_mask.bool())
    if generator is not None and generator.device != device:
        raise ValueError(f"sampling generator on {generator.device}, policy on {device}: create it on the policy's device")
    attn = torch.cat([prompt_mask, prompt_mask.new_ones((batch, max_new_tokens))], dim=1)  # grown by slicing
    was_training = model.training
    model.eval()
    out = model(input_ids=ids, attention_mask=prompt_mask, position_ids=positions_from_mask(prompt_mask),
                use_cache=True, logits_to_keep=1)
    past = out.past_key_values
    next_pos = prompt_mask.sum(-1, keepdim=True)
    tokens, logprobs, masks = [], [], []
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    alive = torch.ones(batch, dtype=torch.bool, device=device)
    for step in range(max_new_tokens):
        logits = out.logits[:, -1, :].float()
        if greedy:
            tok = logits.argmax(-1)
            lp = torch.log_softmax(logits, -1).gather(-1, tok[:, None]).squeeze(-1)
        else:
            logp = torch.log_softmax(top_p_filter(logits / temperature, top_p), -1)
            tok = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(-1)
            lp = logp.gather(-1, tok[:, None]).squeeze(-1)
        tok = torch.where(alive, tok, torch.full_like(tok, pad_id))
        tokens.append(tok)
        logprobs.append(torch.where(alive, lp, torch.zeros_like(lp)))
        masks.append(alive)
        if eos_id is not None:
            finished = finished | (alive & (tok == eos_id))
        alive = ~finished
        if step == max_new_tokens - 1 or not alive.any():
            break
        out = model(input_ids=tok[:, None], attention_mask=attn[:, : width + step + 1], position_ids=next_pos,
                    past_key_values=past, use_cache=True, logits_to_keep=1)
        past = out.past_key_values
        next_pos = next_pos + 1
    model.train(was_training)
    completion_ids = torch.stack(tokens, 1).cpu()
    completion_mask = torch.stack(masks, 1).cpu()
    reasons = ["eos" if f else "length" for f in finished.tolist()]
    routing = remix.last_routing().cpu() if remix is not None else None
    return Completions(completion_ids, torch.stack(logprobs, 1).cpu(), completion_mask, reasons, routing)


def sequence_logprobs(
    model: nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    remix: Any = None,
) -> torch.Tensor:
    """Per-token log-probs ``[B, Tc]`` of the completion tokens under ``model`` (left-padded prompts
    ``[B, Tp]``, right-padded completions ``[B, Tc]``). Differentiable when grad is enabled."""
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attn = torch.cat([prompt_mask.long(), completion_mask.long()], dim=1)
    if remix is not None:
        prompt_only = torch.cat([prompt_mask.bool(), torch.zeros_like(completion_mask, dtype=torch.bool)], dim=1)
        remix.set_prompt_mask(prompt_only)
    logits = model(input_ids=input_ids, attention_mask=attn, position_ids=positions_from_mask(attn)).logits
    tp = prompt_ids.shape[1]
    logits = logits[:, tp - 1 : -1, :].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, completion_ids[..., None]).squeeze(-1)
