"""Log-probs of completions under a model, and the padding they need: what the trainer's loss, the ingest
of a peer's completion (its anchor) and the sampling loop share.

``sequence_logprobs`` runs prompt and completion in one pass and keeps logits only where a completion token
is predicted; ``shared_prompt_logprobs`` runs each distinct prompt once and copies its KV cache to the rows
of its group, and with a ``FrozenPrefix`` (a model that does not change: the frozen base the screen reads
with) runs the prefix its prompts share once for many calls; ``logit_micro_batches`` splits rows so that
their logits fit a memory budget.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn


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


LOGIT_BYTES = 12
"""Bytes a completion position's logits take per vocabulary entry when log-probs are computed: the float32
logits, their temperature-scaled copy and the log-softmax (the backward pass of training reuses about as
much again, which its budget's default allows for)."""



def logit_micro_batches(completion_lengths: Sequence[int], vocab_size: int, budget_bytes: int,
                        max_rows: int, groups: Sequence[int] | None = None) -> list[range]:
    """Split rows, in order, into micro-batches whose log-prob pass keeps its logits within ``budget_bytes``:
    rows x (longest completion + 1) x ``vocab_size`` x ``LOGIT_BYTES``, and at most ``max_rows`` rows. A row
    that alone exceeds the budget goes alone. With a 49,152-token vocabulary a 64-token completion's logits
    take 39 MB, so the row count, not only ``max_rows``, is what bounds memory.

    ``groups`` (a label a row, a group's rows next to each other): a cut that would split a group moves back to
    the group's first row, unless the group starts the micro-batch (a group over the limits alone is split)."""
    batches: list[range] = []
    start, widest = 0, 0
    i = 0
    while i < len(completion_lengths):
        wider = max(widest, completion_lengths[i] + 1)
        if i > start and (i - start >= max_rows or (i - start + 1) * wider * vocab_size * LOGIT_BYTES > budget_bytes):
            cut = i
            if groups is not None:
                first = i
                while first > start and groups[first - 1] == groups[i]:
                    first -= 1
                cut = first if first > start else i
            batches.append(range(start, cut))
            start, i = cut, cut
            widest = 0
            continue
        widest = wider
        i += 1
    if start < len(completion_lengths):
        batches.append(range(start, len(completion_lengths)))
    return batches


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
    ``[B, Tp]``, right-padded completions ``[B, Tc]``). Differentiable when grad is enabled. Logits are
    computed only where a completion token is predicted (``logits_to_keep``): the prompt's positions, often
    the longer part, never reach the output layer."""
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attn = torch.cat([prompt_mask.long(), completion_mask.long()], dim=1)
    if remix is not None:
        prompt_only = torch.cat([prompt_mask.bool(), torch.zeros_like(completion_mask, dtype=torch.bool)], dim=1)
        remix.set_prompt_mask(prompt_only)
    kept = completion_ids.shape[1] + 1  # the last prompt position predicts the first completion token
    logits = model(input_ids=input_ids, attention_mask=attn, position_ids=positions_from_mask(attn),
                   logits_to_keep=kept).logits
    logits = logits[:, :-1, :].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, completion_ids[..., None]).squeeze(-1)



def shared_prompt_logprobs(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    pad_id: int,
    temperature: float = 1.0,
    prefix: FrozenPrefix | None = None,
) -> torch.Tensor:
    """``sequence_logprobs`` with each distinct prompt computed once: ``[B, Tc]`` log-probs of right-padded
    completions ``[B, Tc]`` after ``prompts`` (one token list a row, on the completions' device).

    An RL batch holds a group of completions per prompt, and the prompt is most of a row's tokens (a chat
    prompt with a worked example against a short answer), so the full pass spends most of its work
    recomputing it. Here the distinct prompts run once, their KV cache is copied to the rows that share
    them (an indexing, so gradients flow back to the prompt's pass and sum over the group), and only the
    completions run per row. The same log-probs as the full pass, up to float rounding; where the model
    returns no cache that can copy rows (gradient checkpointing in training), every row runs in full.

    With ``prefix`` (only for a model whose weights never change, under no gradient), the prompts' shared
    prefix is read from its cache and only the rest of each distinct prompt runs."""
    device = completion_ids.device
    distinct: dict[tuple[int, ...], int] = {}
    index = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts]
    past = None
    shared = prefix.length(list(distinct)) if prefix is not None else 0
    if shared and prefix is not None:
        past = prefix.cache(model, device, len(distinct))
    if past is not None:
        rest_ids, rest_mask = (t.to(device) for t in left_pad([list(p[shared:]) for p in distinct], pad_id))
        p_mask = torch.cat([torch.ones(len(distinct), shared, dtype=torch.long, device=device), rest_mask], dim=1)
        out = model(input_ids=rest_ids, attention_mask=p_mask, position_ids=positions_from_mask(p_mask)[:, shared:],
                    past_key_values=past, use_cache=True, logits_to_keep=1)
        past = out.past_key_values
    elif len(distinct) < len(index):
        p_ids, p_mask = (t.to(device) for t in left_pad([list(p) for p in distinct], pad_id))
        out = model(input_ids=p_ids, attention_mask=p_mask, position_ids=positions_from_mask(p_mask), use_cache=True,
                    logits_to_keep=1)
        past = out.past_key_values
    if past is None or not hasattr(past, "batch_select_indices"):
        ids, mask = left_pad([list(p) for p in prompts], pad_id)
        return sequence_logprobs(model, ids.to(device), mask.to(device), completion_ids, completion_mask,
                                 temperature=temperature)
    rows = torch.tensor(index, device=device)
    past.batch_select_indices(rows)
    row_mask = p_mask[rows]
    logits = out.logits[rows, -1:, :]  # the prompt's last position predicts the first completion token
    width = completion_ids.shape[1]
    if width > 1:  # the last completion token predicts nothing: it is not run
        rest = completion_ids[:, :-1]
        attn = torch.cat([row_mask, completion_mask[:, :-1].long()], dim=1)
        positions = row_mask.sum(-1, keepdim=True) + torch.arange(width - 1, device=device)
        tail = model(input_ids=rest, attention_mask=attn, position_ids=positions, past_key_values=past,
                     use_cache=True).logits
        logits = torch.cat([logits, tail], dim=1)
    logits = logits.float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, completion_ids[..., None]).squeeze(-1)


class FrozenPrefix:
    """The keys and values of the prompt prefix that the prompts read so far share (the chat template's system
    turn and worked example, which open every prompt of the node's tasks), kept between calls to
    ``shared_prompt_logprobs``: valid only for a model whose weights never change, as the frozen base the screen
    reads peer text with (``node.exchange.screening``). The same log-probs as running each prompt whole, up to
    float rounding (``tests/node/test_families.py``, on each family).

    The prefix is the longest that the prompts of the calls so far start with (each prompt keeping at least one
    token of its own); a call whose prompts share fewer than ``min_tokens`` with it starts it afresh from its own
    prompts, so a prefix that stops fitting costs one pass of it, never a wrong read. Off where the model's cache
    cannot copy rows (``batch_select_indices``) and where it attends within a sliding window (Gemma 2 and 3, a
    Mistral with a window: each prompt's rest is left-padded after the prefix, and the padding would take
    places in the window that the prompt read whole gives to its tokens)."""

    def __init__(self, min_tokens: int = 16) -> None:
        self.min_tokens = min_tokens
        self.tokens: tuple[int, ...] = ()
        self._cache: Any = None
        self._key: tuple[int, str] | None = None  # the model and device the cache was computed on
        self.computed = 0  # how many times the prefix ran (what the family test counts)
        self.off = False  # the model attends within a sliding window, or its cache cannot copy rows

    def length(self, prompts: Sequence[Sequence[int]]) -> int:
        """The prefix length to read ``prompts`` with (0: none), the kept prefix shortened or started afresh."""
        if not prompts or self.off:
            return 0
        cap = min(len(p) for p in prompts) - 1
        kept = _common_length([self.tokens, *prompts]) if self.tokens else 0
        if kept < self.min_tokens:  # no prefix yet, or one these prompts do not share: start from theirs
            kept = _common_length(prompts)
            self.tokens, self._cache = tuple(prompts[0][:kept]), None
        kept = min(kept, cap)
        if kept < self.min_tokens:
            return 0
        if kept < len(self.tokens):
            self.tokens, self._cache = self.tokens[:kept], None
        return kept

    def cache(self, model: nn.Module, device: torch.device, rows: int) -> Any:
        """A copy of the prefix's cache for ``rows`` rows (a forward pass appends to the one it is given); None
        where the model's cache cannot copy rows (the prefix then stays off)."""
        key = (id(model), str(device))
        if self._key is None and sliding_window(model):
            self.off = True  # the rest of a prompt is padded after the prefix: the padding would sit in the window
            return None
        if self._cache is None or self._key != key:
            ids = torch.tensor([self.tokens], dtype=torch.long, device=device)
            out = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=True, logits_to_keep=1,
                        position_ids=torch.arange(ids.shape[1], device=device)[None])
            self._cache, self._key = out.past_key_values, key
            self.computed += 1
        if not hasattr(self._cache, "batch_select_indices"):
            self.off, self._cache = True, None
            return None
        past = copy.deepcopy(self._cache)
        past.batch_select_indices(torch.zeros(rows, dtype=torch.long, device=device))
        return past


def _common_length(sequences: Sequence[Sequence[int]]) -> int:
    """How many leading tokens every one of ``sequences`` shares."""
    return len(os.path.commonprefix([list(s) for s in sequences]))


def sliding_window(model: nn.Module) -> bool:
    """Whether any layer of ``model`` attends within a sliding window: a window in its config (Mistral's), or a
    layer type other than full attention (Gemma's; Qwen2's and Qwen3's configs name their layers so)."""
    config = getattr(model, "config", None)
    types = set(getattr(config, "layer_types", None) or ()) - {"full_attention"}
    return getattr(config, "sliding_window", None) is not None or bool(types)
