"""The node's own sampling loop (the HF backend's): KV cache, left padding, temperature and top-p.

Returns, for every completion, its token ids, the per-token log-probs of the distribution the token was
actually drawn from (after temperature and top-p), and a mask that ends at (and includes) the first of
the model's end-of-sequence ids. A policy's output layer masks every other special token
(``node.policy.special``), so a node never samples one; a model loaded without that mask is sampled as it
is.
Only the last position's logits are computed (``logits_to_keep=1``), the attention mask is allocated once,
sampling draws from a generator on the policy's device, so no step copies logits to the host, and rows
that finished are dropped from the batch and its KV cache once a quarter of it has (RL completions end at
very different lengths; ``generate`` keeps computing them to the longest). A prompt shared by several
sequences (a group) is computed once and its KV cache copied to each.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from node.generation.static import DecoderPool, StaticDecoder, StepState
from node.policy.logprobs import left_pad, positions_from_mask
from node.policy.special import stop_ids


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


_COMPACT_AT = 0.75
"""The sampling loop drops finished rows once at most this share of the computed batch is still alive."""


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


def sample_rows(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of ``probs`` ``[B, V]``, drawn by inverting the row's cumulative distribution at one
    uniform number (``invert_at``). ``torch.multinomial`` draws an exponential variate per vocabulary entry
    instead (``B x V`` random numbers a step: a fifth of this loop's time on small-base's shape with 64-token
    completions)."""
    u = torch.rand((probs.shape[0], 1), generator=generator, device=probs.device, dtype=torch.float64)  # [0, 1)
    return invert_at(probs, u)


def invert_at(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The token of each row of ``probs`` ``[B, V]`` whose cumulative probability first reaches ``u`` ``[B, 1]``
    (uniform in [0, 1), float64) of the row's total. The cumulative sums are float64, so rounding moves a
    negligible mass (about ``V x 1e-16``). The draw lies in ``(0, total]``: a token of probability 0 has its
    predecessor's sum, so it is never the first (nor is a leading one, whose sum is 0)."""
    cdf = probs.cumsum(-1, dtype=torch.float64)
    tok = torch.searchsorted(cdf, (1.0 - u) * cdf[:, -1:]).squeeze(-1)
    return tok.clamp_(max=probs.shape[-1] - 1)  # only a row of NaNs could reach past the end


@dataclass(frozen=True)
class Sampler:
    """How a token is drawn from a step's logits: greedy, or at ``temperature`` within ``top_p``. Uniform
    numbers come in, one a row and step, drawn for the whole call before its first step (so a row's draws
    do not depend on which other rows are still computed, and a captured step draws nothing itself)."""

    greedy: bool
    temperature: float
    top_p: float

    def draw(self, logits: torch.Tensor, u: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens ``[B]`` and their log-probs under the distribution drawn from."""
        logits = logits.float()
        if self.greedy or u is None:
            tok = logits.argmax(-1)
            return tok, torch.log_softmax(logits, -1).gather(-1, tok[:, None]).squeeze(-1)
        logp = torch.log_softmax(top_p_filter(logits / self.temperature, self.top_p), -1)
        tok = invert_at(logp.exp(), u)
        return tok, logp.gather(-1, tok[:, None]).squeeze(-1)


def _prefill(model: nn.Module, prompts: list[list[int]], pad_id: int, device: torch.device, *, share: bool,
             remix: Any = None) -> tuple[torch.Tensor, Any, torch.Tensor]:
    """Run the prompts through the model: the last position's logits ``[B, V]``, the KV cache and the
    left-padded prompt mask ``[B, W]``.

    With ``share``, each distinct prompt is computed once and its cache rows copied to every sequence that
    has it (an RL step samples a group of completions per prompt, so this divides the prompt work by the
    group size), where the cache can select rows; otherwise every row is computed.
    """
    distinct: dict[tuple[int, ...], int] = {}
    index = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts]
    share = share and len(distinct) < len(prompts)
    ids, prompt_mask = left_pad([list(p) for p in distinct] if share else prompts, pad_id)
    ids, prompt_mask = ids.to(device), prompt_mask.to(device)
    if remix is not None:
        remix.set_prompt_mask(prompt_mask.bool())
    out = model(input_ids=ids, attention_mask=prompt_mask, position_ids=positions_from_mask(prompt_mask),
                use_cache=True, logits_to_keep=1)
    past = out.past_key_values
    if not share:
        return out.logits[:, -1, :], past, prompt_mask
    if not hasattr(past, "batch_select_indices"):  # a cache that cannot copy rows: compute them all
        return _prefill(model, prompts, pad_id, device, share=False, remix=remix)
    rows = torch.tensor(index, device=device)
    past.batch_select_indices(rows)
    if remix is not None:  # a prompt's routing (top-k of its own pooled input) is its group's
        remix.select_rows(rows)
    return out.logits[rows, -1, :], past, prompt_mask[rows]


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
    max_len: int | None = None,
    cuda_graphs: bool = False,
    decoders: DecoderPool | None = None,
    stops: Sequence[int] | None = None,
) -> Completions:
    """Sample one completion per prompt (token-id lists, already formatted and with BOS if any). With
    ``max_len``, a completion also ends (finish reason ``length``) where prompt plus completion reach it;
    every prompt must be shorter (``node.generation.base.check_prompts_fit``). With ``cuda_graphs`` (not for
    ReMix) the forward passes run over a static KV cache, each whole decode step (the draw, the bookkeeping
    and the forward pass) captured in one CUDA graph on a GPU (``node.generation.static``); with ``decoders``
    too, a decoder (and its graphs) kept from an earlier call of the same batch size is reused. A completion
    ends at the first of ``stops`` (default: the model's end-of-sequence ids, ``node.policy.special.stop_ids``)."""
    device = device or torch.device("cpu")
    stops = tuple(stop_ids(model, tokenizer) if stops is None else stops)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (stops[0] if stops else 0)
    if generator is not None and generator.device != device:
        raise ValueError(f"sampling generator on {generator.device}, policy on {device}: create it on the policy's device")
    was_training = model.training
    model.eval()
    if remix is not None:  # generation routes deterministically (top-k), fixed per sequence
        remix.deterministic()
    sampler = Sampler(greedy, temperature, top_p)
    uniforms = None if greedy else torch.rand((max_new_tokens, len(prompts), 1), generator=generator, device=device,
                                              dtype=torch.float64)
    try:
        if cuda_graphs and remix is None:
            ids, lps, mask, hit_eos, routing = _static_loop(model, prompts, pad_id, stops, sampler, uniforms, device,
                                                           max_new_tokens=max_new_tokens, max_len=max_len,
                                                           decoders=decoders)
        else:
            ids, lps, mask, hit_eos, routing = _dynamic_loop(model, prompts, pad_id, stops, sampler, uniforms, device,
                                                            max_new_tokens=max_new_tokens, max_len=max_len,
                                                            remix=remix)
    finally:
        model.train(was_training)
    # Steps run after every row had finished (between two checks) drew nothing: cut them off.
    length = int(mask.any(0).nonzero().max()) + 1 if bool(mask.any()) else 0
    reasons = ["eos" if f else "length" for f in hit_eos.tolist()]
    return Completions(ids[:, :length].cpu(), lps[:, :length].cpu(), mask[:, :length].cpu(), reasons, routing)


_Out = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, "torch.Tensor | None"]


def _dynamic_loop(model: nn.Module, prompts: list[list[int]], pad_id: int, stops: tuple[int, ...], sampler: Sampler,
                  uniforms: torch.Tensor | None, device: torch.device, *, max_new_tokens: int, max_len: int | None,
                  remix: Any) -> _Out:
    """The loop over transformers' cache: a group's prompt computed once, finished rows dropped as they go."""
    last_logits, past, prompt_mask = _prefill(model, prompts, pad_id, device, share=True, remix=remix)
    routing = remix.last_routing().cpu() if remix is not None else None  # [B, L, k], before any row is dropped
    batch, width = prompt_mask.shape
    compact = hasattr(past, "batch_select_indices")
    attn = torch.cat([prompt_mask, prompt_mask.new_ones((batch, max_new_tokens))], dim=1)  # grown by slicing
    next_pos = prompt_mask.sum(-1, keepdim=True)
    all_ids = torch.full((batch, max_new_tokens), pad_id, dtype=torch.long, device=device)
    all_lps = torch.zeros((batch, max_new_tokens), dtype=torch.float32, device=device)
    all_mask = torch.zeros((batch, max_new_tokens), dtype=torch.bool, device=device)
    hit_eos = torch.zeros(batch, dtype=torch.bool, device=device)
    rows = torch.arange(batch, device=device)  # the batch row each computed row fills
    alive = torch.ones(batch, dtype=torch.bool, device=device)
    stop_t = torch.tensor(stops, dtype=torch.long, device=device)
    check_every = live_check_interval(device)
    full = True  # every batch row still computed (no row dropped): the draws need no indexing
    for step in range(max_new_tokens):
        u = None if uniforms is None else (uniforms[step] if full else uniforms[step].index_select(0, rows))
        tok, lp = sampler.draw(last_logits, u)
        tok = torch.where(alive, tok, torch.full_like(tok, pad_id))
        all_ids[rows, step] = tok
        all_lps[rows, step] = torch.where(alive, lp, torch.zeros_like(lp))
        all_mask[rows, step] = alive
        if stops:
            ended = alive & (tok[:, None] == stop_t).any(-1)
            hit_eos[rows] |= ended
            alive = alive & ~ended
        if max_len is not None:  # the token just drawn sits at next_pos: a row ends when that was the last one
            alive = alive & (next_pos.squeeze(-1) + 1 < max_len)
        if step == max_new_tokens - 1:
            break
        if (step + 1) % check_every == 0:  # reading the count waits for the device: not every step on a GPU
            n_alive = int(alive.sum())
            if n_alive == 0:
                break
            if compact and n_alive <= alive.numel() * _COMPACT_AT:
                # Drop finished rows from the batch (and their KV cache): later steps cost what the live ones need.
                keep = alive.nonzero().squeeze(-1)
                past.batch_select_indices(keep)
                if remix is not None:
                    remix.select_rows(keep)
                rows, attn, next_pos, tok, alive = rows[keep], attn[keep], next_pos[keep], tok[keep], alive[keep]
                full = False
        positions = next_pos if max_len is None else next_pos.clamp(max=max_len - 1)  # finished rows run on
        out = model(input_ids=tok[:, None], attention_mask=attn[:, : width + step + 1], position_ids=positions,
                    past_key_values=past, use_cache=True, logits_to_keep=1)
        past, last_logits = out.past_key_values, out.logits[:, -1, :]
        next_pos = next_pos + 1
    return all_ids, all_lps, all_mask, hit_eos, routing


def _static_loop(model: nn.Module, prompts: list[list[int]], pad_id: int, stops: tuple[int, ...], sampler: Sampler,
                 uniforms: torch.Tensor | None, device: torch.device, *, max_new_tokens: int, max_len: int | None,
                 decoders: DecoderPool | None) -> _Out:
    """The loop over a static cache: each decode step one function of the decoder's fixed tensors
    (``StepState``), which the decoder runs eagerly or replays from a CUDA graph; on a GPU, whether every row
    has finished is learnt from a copy to pinned memory made every few steps and looked at once it has
    arrived, so the host never waits for the device between steps."""
    ids, prompt_mask = (t.to(device) for t in left_pad(prompts, pad_id))
    static = (StaticDecoder(model, prompt_mask, max_new_tokens, graphs=True) if decoders is None
              else decoders.decoder(model, prompt_mask, max_new_tokens, graphs=True))
    logits = static.prefill(ids, prompt_mask, positions_from_mask(prompt_mask))
    key = (sampler, pad_id, stops, max_len)
    state = static.state(logits)
    state.start(logits, prompt_mask, pad_id, uniforms)
    step_fn = _decode_step(static, state, sampler, pad_id, stops, max_len)
    probe = _Probe(device)
    for step in range(max_new_tokens):
        static.run(key, step_fn, step)
        if probe.all_finished(state.alive, step):
            break
    return state.ids, state.lps, state.mask, state.hit, None


def _decode_step(static: StaticDecoder, st: StepState, sampler: Sampler, pad_id: int, stops: tuple[int, ...],
                 max_len: int | None) -> Any:
    """One decode step over ``st``'s tensors alone (the step index on the device too): draw, record, end rows
    at a stop id or the context, feed the drawn tokens forward."""
    stop_t = st.constant("stops", torch.tensor(stops or (-1,), dtype=torch.long))

    def step() -> None:
        u = None if sampler.greedy else st.uniforms.index_select(0, st.step).squeeze(0)
        tok, lp = sampler.draw(st.logits, u)
        alive = st.alive
        tok = torch.where(alive, tok, pad_id)
        st.ids.index_copy_(1, st.step, tok[:, None])
        st.lps.index_copy_(1, st.step, torch.where(alive, lp, 0.0)[:, None])
        st.mask.index_copy_(1, st.step, alive[:, None])
        ended = alive & (tok[:, None] == stop_t).any(-1)
        st.hit.bitwise_or_(ended)
        still = alive & ~ended
        if max_len is not None:  # the token just drawn sits at next_pos: a row ends when that was the last one
            still = still & (st.next_pos.squeeze(-1) + 1 < max_len)
        positions = st.next_pos if max_len is None else st.next_pos.clamp(max=max_len - 1)  # finished rows run on
        st.logits.copy_(static.forward_token(tok, positions, st.width + st.step))
        st.alive.copy_(still)
        st.next_pos.add_(1)
        st.step.add_(1)

    return step


class _Probe:
    """Whether every row has finished, without waiting for the device: on a GPU every ``_GPU_CHECK_EVERY``
    steps a copy of "any row alive" goes to pinned host memory behind an event, and is read once the event
    has passed (a few steps late: those steps draw padding); on the CPU a read costs nothing, every step."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.pending = False
        if self.cuda:
            self.host = torch.zeros(1, dtype=torch.bool, pin_memory=True)
            self.event = torch.cuda.Event()

    def all_finished(self, alive: torch.Tensor, step: int) -> bool:
        if not self.cuda:
            return not bool(alive.any())
        if self.pending and self.event.query():
            self.pending = False
            if not bool(self.host.numpy()[0]):
                return True
        if not self.pending and (step + 1) % _GPU_CHECK_EVERY == 0:
            self.host.copy_(alive.any()[None], non_blocking=True)
            self.event.record()
            self.pending = True
        return False


def live_check_interval(device: torch.device) -> int:
    """Decode steps between two reads of how many rows are still alive. Each read makes the host wait for
    the device; on a GPU that stalls the queue of kernels the host runs ahead with, so it reads every
    ``_GPU_CHECK_EVERY`` steps and runs at most that many steps more than needed, whose tokens are dropped
    (finished rows draw padding). On the CPU the read costs nothing: every step."""
    return 1 if device.type == "cpu" else _GPU_CHECK_EVERY


_GPU_CHECK_EVERY = 8


