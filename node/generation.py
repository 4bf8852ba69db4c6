"""Batched sampling with the HF backend: KV cache, left padding, temperature and top-p.

Returns, for every completion, its token ids, the per-token log-probs of the distribution the token was
actually drawn from (after temperature and top-p), and a mask that ends at (and includes) the first EOS.
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


@torch.no_grad()
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
    ids, attn = left_pad(prompts, pad_id)
    ids, attn = ids.to(device), attn.to(device)
    batch = ids.shape[0]
    if remix is not None:  # generation routes deterministically (top-k), fixed per sequence
        remix.deterministic()
        remix.set_prompt_mask(attn.bool())
    was_training = model.training
    model.eval()
    out = model(input_ids=ids, attention_mask=attn, position_ids=positions_from_mask(attn), use_cache=True)
    past = out.past_key_values
    next_pos = attn.sum(-1, keepdim=True)
    tokens, logprobs = [], []
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    alive = torch.ones(batch, dtype=torch.bool, device=device)
    masks = []
    for step in range(max_new_tokens):
        logits = out.logits[:, -1, :].float()
        if greedy:
            tok = logits.argmax(-1)
            lp = torch.log_softmax(logits, -1).gather(-1, tok[:, None]).squeeze(-1)
        else:
            logp = torch.log_softmax(top_p_filter(logits / temperature, top_p), -1)
            probs = logp.exp()
            if generator is not None and generator.device != probs.device:
                tok = torch.multinomial(probs.cpu(), 1, generator=generator).squeeze(-1).to(device)
            else:
                tok = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
            lp = logp.gather(-1, tok[:, None]).squeeze(-1)
        tok = torch.where(alive, tok, torch.full_like(tok, pad_id))
        tokens.append(tok)
        logprobs.append(torch.where(alive, lp, torch.zeros_like(lp)))
        masks.append(alive.clone())
        if eos_id is not None:
            finished |= alive & (tok == eos_id)
        alive = ~finished
        if not alive.any() or step == max_new_tokens - 1:
            break
        attn = torch.cat([attn, torch.ones((batch, 1), dtype=attn.dtype, device=device)], dim=1)
        out = model(input_ids=tok[:, None], attention_mask=attn, position_ids=next_pos, past_key_values=past,
                    use_cache=True)
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
