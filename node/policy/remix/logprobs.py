"""Log-probs of completions under a ReMix policy with each distinct prompt run once a routing.

A ReMix row's routing is read from its prompt (the layer inputs pooled over the prompt tokens), so rows
that share a prompt and its routing also share the prompt's activations: the prompt runs once a
(prompt, routing), its KV cache and its routing are copied to the rows that have it (an indexing, so
their gradients flow back to the one prompt pass and sum there), and only the completions run a row, as
:func:`node.policy.logprobs.shared_prompt_logprobs` does for a LoRA.

- Deterministic mode (generation, evaluation, a peer's anchors): the routing is the top-k of the prompt's
  own scores, the same for every row of the prompt: exactly the rows run in full, up to float rounding.
- Sampled mode with M routings (training): each distinct prompt draws its M routings once, and every
  completion of the prompt is scored under each of them (rows ``j*B .. (j+1)*B-1`` are routing j), as
  the generation routed the prompt once for its whole group. Each completion still sees M independent
  draws from the router's Plackett-Luce distribution, so the LoRA gradient (the mean over routings) and
  the router's RLOO estimator (over a row's M routings) stay unbiased; the draws of a group's rows are
  shared instead of independent. Run in full with the same draws (``set_prompt_mask(..., units=...)``)
  the rows give the same log-probs and gradients up to float rounding.
- Spread (``spread=True``, training with ``adapter.remix.spread``): each distinct prompt still draws M
  routings, but each completion is scored under one of them (the i-th completion of a prompt under routing
  ``i mod M``): one row a completion, as for a LoRA, and the router's baseline for a row is its prompt's
  rows under the other routings (``RemixAdapter.router_loss_spread``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from node.policy.logprobs import left_pad, positions_from_mask
from node.policy.remix.adapter import RemixAdapter


def prompt_units(prompts: Sequence[Sequence[int]], m: int) -> tuple[list[list[int]], torch.Tensor]:
    """The distinct prompts (in order of first appearance) and ``LongTensor[m*B]``: the (prompt, routing)
    unit of each routing-major row, ``j * P + p`` for routing j of distinct prompt p."""
    distinct: dict[tuple[int, ...], int] = {}
    index = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts]
    rows = (torch.arange(m)[:, None] * len(distinct) + torch.tensor(index, dtype=torch.long)[None, :]).flatten()
    return [list(p) for p in distinct], rows


def spread_units(prompts: Sequence[Sequence[int]], m: int) -> tuple[list[list[int]], torch.Tensor, torch.Tensor]:
    """The distinct prompts, and for each row b its unit ``j * P + p`` and its routing j: the i-th row of a
    distinct prompt p takes routing ``i mod m``."""
    distinct, index = prompt_units(prompts, 1)  # one routing: a row's unit is its distinct prompt
    seen: dict[int, int] = {}
    routing = []
    for p in index.tolist():
        routing.append(seen.get(p, 0) % m)
        seen[p] = seen.get(p, 0) + 1
    routing_of = torch.tensor(routing, dtype=torch.long)
    return distinct, routing_of * len(distinct) + index, routing_of


def routed_logprobs(
    model: nn.Module,
    remix: RemixAdapter,
    prompts: Sequence[Sequence[int]],
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    pad_id: int,
    m: int = 1,
    temperature: float = 1.0,
    spread: bool = False,
) -> torch.Tensor:
    """``[m*B, Tc]`` log-probs of right-padded completions ``[B, Tc]`` after ``prompts`` (token lists, one a
    row), routing-major: row ``j*B + b`` is completion b under routing j. ``m`` is 1 in deterministic mode,
    the adapter's M after ``remix.sampled(M, generator)``. Differentiable when grad is enabled; afterwards
    ``remix.routing_logprob()`` and ``remix.router_loss`` see the ``m*B`` rows. With ``spread`` the result is
    ``[B, Tc]``, each completion under one of its prompt's M routings (``spread_units``)."""
    device = completion_ids.device
    if spread:
        distinct, rows, _ = spread_units(prompts, m)
        ids, mask = completion_ids, completion_mask
    else:
        distinct, rows = prompt_units(prompts, m)
        ids, mask = completion_ids.repeat(m, 1), completion_mask.repeat(m, 1)
    rows = rows.to(device)
    p_ids, p_mask = (t.to(device).repeat(m, 1) for t in left_pad(distinct, pad_id))  # [m*P, W], routing-major
    remix.set_prompt_mask(p_mask.bool())
    out = model(input_ids=p_ids, attention_mask=p_mask, position_ids=positions_from_mask(p_mask), use_cache=True,
                logits_to_keep=1)
    remix.select_rows(rows)  # each row takes its (prompt, routing)'s routing
    row_mask = p_mask[rows]
    past = out.past_key_values
    if past is None or not hasattr(past, "batch_select_indices"):
        # No cache to copy (gradient checkpointing): every row in full, routed as its prompt just was.
        full = torch.cat([p_ids[rows], ids], dim=1)
        attn = torch.cat([row_mask, mask.long()], dim=1)
        logits = model(input_ids=full, attention_mask=attn, position_ids=positions_from_mask(attn),
                       logits_to_keep=ids.shape[1] + 1).logits[:, :-1, :]
    else:
        past.batch_select_indices(rows)
        logits = out.logits[rows, -1:, :]  # the prompt's last position predicts the first completion token
        width = ids.shape[1]
        if width > 1:  # the last completion token predicts nothing: it is not run
            attn = torch.cat([row_mask, mask[:, :-1].long()], dim=1)
            positions = row_mask.sum(-1, keepdim=True) + torch.arange(width - 1, device=device)
            tail = model(input_ids=ids[:, :-1], attention_mask=attn, position_ids=positions, past_key_values=past,
                         use_cache=True).logits
            logits = torch.cat([logits, tail], dim=1)
    logits = logits.float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, ids[..., None]).squeeze(-1)
