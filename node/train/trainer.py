"""One optimisation step of off-policy-corrected REINFORCE on a list of scored groups.

The math lives in pure functions (``advantages.py``, ``losses.py``); this module only batches sequences,
runs forward/backward in micro-batches and steps the optimizer. A step whose loss or gradient is not
finite is never applied: the gradients are dropped, the step is counted (``skipped_steps``) and logged.

With ``fused`` (``train.fused``) a plain-LoRA policy of a model ``node.fused.decoder`` knows trains
through that pass, its parameters in flat groups (``node.train.flat``: one optimizer tensor a group, one
gradient norm), and a step's figures stay on the device until one read at the end of each update
(``node.train.loss_terms``): the same losses and gradients as the modules' path, in a fraction of its
operations. Any other policy (ReMix, gradient checkpointing, another architecture) trains as before.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch

from node.fused.decoder import FusedPass, fused_pass_refusal
from node.policy.logprobs import (
    logit_micro_batches,
    right_pad,
    shared_prompt_logprobs,
)
from node.policy.model import Policy
from node.policy.remix.logprobs import routed_logprobs, spread_units
from node.train.flat import FlatGroup, flat_state, per_parameter_state
from node.train.groups import TrainGroup
from node.train.loss_terms import STAT_KEYS, logprob_gap_terms, policy_loss_terms
from node.train.losses import logprob_gap, off_policy_anchor, policy_loss, sequence_values
from node.train.peer_rows import Row, capped, rows_of, screen_rows, screen_totals
from node.train.peer_value import cosine, part_cosine
from node.train.screen import PeerScreen

logger = logging.getLogger(__name__)


class Trainer:
    """Owns the optimizer; ``step(groups)`` does one update on all of their completions."""

    def __init__(self, policy: Policy, *, lr: float, norm_lr: float, router_lr: float, weight_decay: float,
                 max_grad_norm: float, loss: str, eps_low: float, eps_high: float, length_norm: bool,
                 micro_batch_size: int, temperature: float, routings: int = 2, spread_routings: bool = False,
                 off_policy_correction: bool = True, seed: int = 0, gradient_checkpointing: bool = False,
                 logits_memory_mb: int = 1024, engine_is_cap: float | None = None, optimizer_steps: int = 1,
                 loss_denominator: int | None = None, measure_alignment: bool = False, fused: bool = True) -> None:
        if optimizer_steps < 1:
            raise ValueError(f"optimizer_steps must be >= 1, got {optimizer_steps}")
        if loss_denominator is not None and loss_denominator < 1:
            raise ValueError(f"loss_denominator must be >= 1 or None, got {loss_denominator}")
        self.policy = policy
        # A training step's sequences are dealt round-robin into this many parts, one optimizer step each.
        self.optimizer_steps = optimizer_steps
        # None: each update's loss is the mean over its sequences; N: their sum over N sequences (N / parts
        # an update), so a step that trains on more sequences with signal takes a larger step.
        self.loss_denominator = loss_denominator
        # The cosine between the gradients of a step's own and peers' sequences (``node.train.peer_value``):
        # each part's gradient accumulated on its own, the update their sum as before.
        self.measure_alignment = measure_alignment
        self._alignments: list[float] = []
        if gradient_checkpointing:  # only in train mode: generation and evaluation run without it
            policy.model.gradient_checkpointing_enable(  # type: ignore[operator]
                gradient_checkpointing_kwargs={"use_reentrant": False})
        lrs = {"adapter": lr, "norm": norm_lr, "router": router_lr}
        self.fused: FusedPass | None = None
        self.flat_groups: list[FlatGroup] = []
        if fused:
            self._fuse()
        if self.flat_groups:
            self.optimizer = _adamw([{"params": [g.flat], "lr": lrs[name], "name": name}
                                     for name, g in zip(policy.param_groups, self.flat_groups)], weight_decay)
        else:
            self.optimizer = torch.optim.AdamW(
                [{"params": ps, "lr": lrs[name], "name": name} for name, ps in policy.param_groups.items()],
                weight_decay=weight_decay,
            )
        self.max_grad_norm = max_grad_norm
        self.loss_kind = loss
        self.loss_kwargs: dict[str, Any] = {"eps_low": eps_low, "eps_high": eps_high, "length_norm": length_norm}
        self.micro_batch_size = micro_batch_size
        self.logits_budget_bytes = logits_memory_mb * 1024 * 1024
        self.engine_is_cap = engine_is_cap
        # ReMix scores each row under M routings, or (spread) under one of its prompt's M
        self.routings_per_row = routings if policy.remix is not None and not spread_routings else 1
        self.spread_routings = spread_routings
        self.temperature = temperature
        self.routings = routings
        self.off_policy_correction = off_policy_correction
        self.routing_generator = torch.Generator(device=policy.device).manual_seed(seed)  # ReMix routings sampled in training
        self._gap = [0.0, 0.0, 0]  # |diff| sum, k3 sum, tokens of this step's own samples
        self.skipped_steps = 0
        self.distributions: dict[str, torch.Tensor] = {}
        self._pending: dict[str, list[torch.Tensor]] = {}
        self._keep = False
        self._screen: PeerScreen | None = None
        self._screen_counts: list[tuple[list[str], torch.Tensor]] = []
        self.screened: dict[str, list[float]] = {}

    def _fuse(self) -> None:
        """The fused pass and flat parameter groups, where the policy allows them (else the modules' path)."""
        policy = self.policy
        reason = "ReMix routes its adapters" if policy.remix is not None else fused_pass_refusal(policy.model)
        if reason is not None:
            logger.info("training through the model's modules (%s)", reason)
            return
        self.fused = FusedPass(policy.model)
        adapters = policy.param_groups.get("adapter", [])
        if {id(p) for p in adapters} != {id(p) for p in self.fused.layout.params}:
            raise RuntimeError("the fused pass's adapters are not the policy's adapter group")
        for name, params in policy.param_groups.items():
            if name == "adapter":
                self.flat_groups.append(FlatGroup(adapters, self.fused.layout.flat, self.fused.layout.mask))
            else:
                self.flat_groups.append(FlatGroup.contiguous(params))
        logger.info("training through the fused pass: %d projection families, %d adapter tensors in one",
                    len(self.fused.layout.families), len(adapters))

    def _params(self) -> list[torch.nn.Parameter]:
        if self.flat_groups:
            return [p for g in self.flat_groups for p in g.params]
        return [p for g in self.optimizer.param_groups for p in g["params"]]

    def optimizer_state(self) -> dict[str, Any]:
        """The optimizer's state as a checkpoint keeps it: per parameter, whatever the groups' layout."""
        if self.flat_groups:
            return per_parameter_state(self.optimizer, self.flat_groups)
        return self.optimizer.state_dict()

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(flat_state(state, self.flat_groups) if self.flat_groups else state)

    def step(self, groups: list[TrainGroup], keep_distributions: bool = False,
             screen: PeerScreen | None = None) -> dict[str, float]:
        """Train on every completion of ``groups`` (advantages already assigned): one optimizer step, or
        ``optimizer_steps`` on parts of them. With ``screen``, peers' tokens and rows this node's model finds
        implausible are kept out of the loss (``node.train.screen``); ``self.screened`` then holds, per
        author, ``[rows, rows dropped, tokens, tokens masked, tokens pushed up, their weights, rows held to the
        span bound, those of them that failed]`` of the step.

        With ``keep_distributions``, ``self.distributions`` then holds this step's ``advantages`` (one a
        sequence) and ``logprob_gap`` (trainer minus sampler, one a token of the node's own samples), for
        histograms."""
        self.distributions = {}
        self._keep = keep_distributions
        self._screen = screen
        self._screen_counts = []  # per micro-batch: the rows' authors and their COUNTS, on the device
        self.screened = {}
        rows: list[Row] = rows_of(groups, screen)
        for g in (g for g in groups if g.advantages is not None):  # an anchor a token, or the loss is nonsense
            for ids, lps in zip(g.completions, g.anchor_logprobs):
                if ids and len(ids) != len(lps):
                    raise ValueError(f"group {g.key} from {g.peer_id[:12] or 'this node'}: a completion of "
                                     f"{len(ids)} tokens has {len(lps)} anchor log-probs")
        if not rows:
            return {"loss": 0.0, "n_sequences": 0.0, "n_tokens": 0.0, "grad_norm": 0.0}
        if screen is not None:
            rows = capped(rows, screen)
        model = self.policy.model
        model.train()
        self._gap = [0.0, 0.0, 0]
        self._alignments = []
        # Round-robin keeps each part a mix of own and peer groups, and a group's rows in order within a part
        # (its prompt still runs once a micro-batch).
        parts = [part for k in range(self.optimizer_steps) if (part := rows[k :: self.optimizer_steps])]
        sums: dict[str, float] = {}
        norms: list[float] = []
        for part in parts:
            stats, grad_norm = (self._update_fused if self.fused else self._update)(part, len(parts))
            for k, v in stats.items():
                sums[k] = sums.get(k, 0.0) + v * len(part) / len(rows)
            if grad_norm is not None:
                norms.append(grad_norm)
        model.eval()
        if self._pending:  # this step's histograms, read from the device once
            for key, values in self._pending.items():
                self.distributions[key] = torch.cat(values).cpu()
            self._pending = {}
        out = {**sums, "n_sequences": float(len(rows)), "n_tokens": float(sum(len(r[1]) for r in rows)),
               "grad_norm": sum(norms) / len(norms) if norms else 0.0, "skipped_steps": float(self.skipped_steps)}
        if self.optimizer_steps > 1:
            out["optimizer_steps"] = float(len(norms))
        if self._alignments:
            out["peer_alignment"] = sum(self._alignments) / len(self._alignments)
        self.screened = self._screen_totals()
        if self._gap[2]:  # this step's own samples: the sampler's log-probs against ours, before the update
            out.update(logprob_gap_abs=self._gap[0] / self._gap[2], logprob_gap_kl=self._gap[1] / self._gap[2])
        return out

    def _update(self, rows: list[Row], n_parts: int) -> tuple[dict[str, float], float | None]:
        """One optimizer step on ``rows``, in micro-batches; the step's stats (means over its sequences) and
        its gradient norm, None when it was not applied (a loss or gradient that is not finite)."""
        model = self.policy.model
        self.optimizer.zero_grad(set_to_none=True)
        total, sums = len(rows), {"loss": 0.0}
        denominator = total if self.loss_denominator is None else self.loss_denominator / n_parts
        vocab = int(getattr(getattr(model, "config", None), "vocab_size", 0) or len(self.policy.tokenizer))
        own, peer = [r for r in rows if r[4]], [r for r in rows if not r[4]]
        measure = self.measure_alignment and bool(own) and bool(peer)
        own_grads: list[torch.Tensor | None] = []
        for segment in ([own, peer] if measure else [rows]):
            lengths = [len(r[1]) for r in segment]
            # ReMix runs each sequence once a routing: M rows of a forward pass, in memory as in the budget.
            for batch in logit_micro_batches(lengths, vocab * self.routings_per_row, self.logits_budget_bytes,
                                             max(1, self.micro_batch_size // self.routings_per_row),
                                             [r[7] for r in segment]):
                chunk = segment[batch.start : batch.stop]
                stats = self._micro_step(chunk, weight=len(chunk) / denominator)
                for k, v in stats.items():
                    sums[k] = sums.get(k, 0.0) + v * len(chunk) / total
            if measure and not own_grads:  # the own part's gradient, before the peers' is added to it
                own_grads = [None if p.grad is None else p.grad.detach().clone() for p in self._params()]
        if measure:
            alignment = part_cosine(own_grads, self._params())
            if alignment is not None:
                self._alignments.append(alignment)
        grad_norm = torch.nn.utils.clip_grad_norm_(self._params(), self.max_grad_norm)
        finite = math.isfinite(sums["loss"]) and bool(torch.isfinite(grad_norm))
        if finite:
            self.optimizer.step()
        else:
            self.skipped_steps += 1
            logger.warning("skipped an optimizer step: loss %s, gradient norm %s (not finite)", sums["loss"],
                           float(grad_norm))
        self.optimizer.zero_grad(set_to_none=True)
        return sums, float(grad_norm) if finite else None

    def _micro_step(self, rows: list[Row], weight: float) -> dict[str, float]:
        device = self.policy.device
        pad_id = self.policy.tokenizer.pad_token_id
        completion_ids, completion_mask = right_pad([r[1] for r in rows], pad_id, torch.long)
        anchor, _ = right_pad([r[2] for r in rows], 0.0, torch.float32)
        advantages = torch.tensor([r[3] for r in rows], dtype=torch.float32)
        tensors = [t.to(device) for t in (completion_ids, completion_mask, anchor, advantages)]
        completion_ids, completion_mask, anchor, advantages = tensors
        remix = self.policy.remix
        if remix is None:  # a group's prompt runs once for all of its completions
            logprobs = shared_prompt_logprobs(self.policy.model, [r[0] for r in rows], completion_ids,
                                              completion_mask, pad_id=pad_id, temperature=self.temperature)
            own = torch.tensor([r[4] for r in rows], device=device)
            loss_mask, peer_weights, advantages = self._screened_mask(rows, logprobs, completion_mask, ~own,
                                                                      advantages)
            gap = logprob_gap(logprobs, anchor, completion_mask & own[:, None])
            self._gap = [self._gap[0] + gap[0], self._gap[1] + gap[1], self._gap[2] + gap[2]]
            if self._keep:
                self._collect(advantages, (logprobs.detach().float() - anchor)[(completion_mask != 0) & own[:, None]])
            anchor, token_weights = self._off_policy(logprobs, anchor, completion_mask, own)
            token_weights = _times(token_weights, peer_weights)
            loss, stats = policy_loss(logprobs, anchor, advantages, loss_mask, self.loss_kind,  # type: ignore[arg-type]
                                      token_weights=token_weights, **self.loss_kwargs)
            (loss * weight).backward()
            return {"loss": float(loss.detach()), **stats}
        peer = torch.tensor([not r[4] for r in rows], device=device)
        return self._remix_micro_step([r[0] for r in rows], completion_ids, completion_mask, anchor, advantages,
                                      weight, rows, peer)

    def _screened_mask(self, rows: list[Row], logprobs: torch.Tensor, mask: torch.Tensor, peer: torch.Tensor,
                       advantages: torch.Tensor, count_rows: int | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """``screen_rows`` with this step's screen (none: ``mask`` and ``advantages`` as they are); the rows' counts
        kept on the device, read once at the end of the step."""
        if self._screen is None or all(r[4] for r in rows):
            return mask, None, advantages
        loss_mask, weights, advantages, counts = screen_rows(rows, logprobs, mask, peer, advantages, self._screen,
                                                             count_rows)
        self._screen_counts.append(([r[5] for r in rows[: count_rows or len(rows)]], counts))
        return loss_mask, weights, advantages

    def _screen_totals(self) -> dict[str, list[float]]:
        """Per author, over the step: ``node.train.peer_rows.COUNTS``."""
        totals = screen_totals(self._screen_counts)
        self._screen_counts = []
        return totals

    def _update_fused(self, rows: list[Row], n_parts: int) -> tuple[dict[str, float], float | None]:
        """``_update`` through the fused pass: the micro-batches' figures summed on the device, the gradient
        norm and clipping on the flat groups, and one read of all of it before the optimizer steps."""
        for group in self.flat_groups:
            group.zero_grad()
        total = len(rows)
        denominator = total if self.loss_denominator is None else self.loss_denominator / n_parts
        vocab = int(getattr(getattr(self.policy.model, "config", None), "vocab_size", 0) or len(self.policy.tokenizer))
        own, peer = [r for r in rows if r[4]], [r for r in rows if not r[4]]
        measure = self.measure_alignment and bool(own) and bool(peer)
        sums = torch.zeros(len(STAT_KEYS) + 3, device=self.policy.device)
        own_grads: list[torch.Tensor] = []
        for segment in ([own, peer] if measure else [rows]):
            for batch in logit_micro_batches([len(r[1]) for r in segment], vocab, self.logits_budget_bytes,
                                             self.micro_batch_size, [r[7] for r in segment]):
                chunk = segment[batch.start : batch.stop]
                sums += self._micro_step_fused(chunk, weight=len(chunk) / denominator, share=len(chunk) / total)
            if measure and not own_grads:
                own_grads = [g.masked_grad().clone() for g in self.flat_groups]
        grads = [g.masked_grad() for g in self.flat_groups]
        extra = []
        if measure:  # as part_cosine: the own part against the rest, before clipping
            pairs = [(mine.double(), (grad.double() - mine.double())) for mine, grad in zip(own_grads, grads)]
            extra = [torch.stack([(m * t).sum() for m, t in pairs]).sum(),
                     torch.stack([(m * m).sum() for m, _ in pairs]).sum(),
                     torch.stack([(t * t).sum() for _, t in pairs]).sum()]
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
        coef = (self.max_grad_norm / (norm + 1e-6)).clamp(max=1.0)
        for grad in grads:
            grad.mul_(coef)
        tail = torch.stack(extra).float() if extra else norm.new_zeros(0)
        with torch.profiler.record_function("host_read"):  # the update's one read of device values
            values = torch.cat([sums, norm[None].float(), tail]).tolist()
        stats = dict(zip(STAT_KEYS, values))
        self._gap = [self._gap[0] + values[len(STAT_KEYS)], self._gap[1] + values[len(STAT_KEYS) + 1],
                     self._gap[2] + int(values[len(STAT_KEYS) + 2])]
        grad_norm = values[len(STAT_KEYS) + 3]
        if measure:
            dot, own_sq, peer_sq = values[-3:]
            alignment = (cosine(dot, math.sqrt(own_sq), math.sqrt(peer_sq))
                         if all(math.isfinite(v) for v in (dot, own_sq, peer_sq)) else None)
            if alignment is not None:
                self._alignments.append(alignment)
        finite = math.isfinite(stats["loss"]) and math.isfinite(grad_norm)
        if finite:
            self.optimizer.step()
            for group in self.flat_groups:
                group.touch()
        else:
            self.skipped_steps += 1
            logger.warning("skipped an optimizer step: loss %s, gradient norm %s (not finite)", stats["loss"],
                           grad_norm)
        for group in self.flat_groups:
            group.zero_grad()
        return stats, grad_norm if finite else None

    def _micro_step_fused(self, rows: list[Row], weight: float, share: float) -> torch.Tensor:
        """One micro-batch's forward and backward through the fused pass: its ``STAT_KEYS`` figures times
        ``share`` (its part of the update's rows) and the sampler/trainer gap sums of its own samples, on the
        device."""
        device = self.policy.device
        width = max(len(r[1]) for r in rows)
        completion_mask = torch.tensor([[True] * len(r[1]) + [False] * (width - len(r[1])) for r in rows],
                                       device=device)
        anchor = torch.tensor([list(r[2]) + [0.0] * (width - len(r[2])) for r in rows], dtype=torch.float32,
                              device=device)
        advantages = torch.tensor([r[3] for r in rows], dtype=torch.float32, device=device)
        own = torch.tensor([r[4] for r in rows], device=device)
        assert self.fused is not None
        logprobs = self.fused.logprobs([r[0] for r in rows], [r[1] for r in rows],
                                       pad_id=self.policy.tokenizer.pad_token_id, temperature=self.temperature)
        own_tokens = completion_mask & own[:, None]
        loss_mask, peer_weights, advantages = self._screened_mask(rows, logprobs, completion_mask, ~own, advantages)
        gap = logprob_gap_terms(logprobs, anchor, own_tokens)
        if self._keep:
            self._pending.setdefault("advantages", []).append(advantages.detach().float())
            self._pending.setdefault("logprob_gap", []).append((logprobs.detach().float() - anchor)[own_tokens])
        anchor, token_weights = self._off_policy(logprobs, anchor, completion_mask, own)
        token_weights = _times(token_weights, peer_weights)
        loss, stats = policy_loss_terms(logprobs, anchor, advantages, loss_mask, self.loss_kind,  # type: ignore[arg-type]
                                        token_weights=token_weights, **self.loss_kwargs)
        (loss * weight).backward()
        return torch.cat([stats * share, gap])

    def _off_policy(self, logprobs: torch.Tensor, anchor: torch.Tensor, mask: torch.Tensor, own: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``off_policy_anchor`` with this trainer's settings: the one correction both training paths apply."""
        return off_policy_anchor(logprobs, anchor, mask, own, correct=self.off_policy_correction,
                                 engine_is_cap=self.engine_is_cap)

    def _collect(self, advantages: torch.Tensor, gaps: torch.Tensor) -> None:
        for key, values in (("advantages", advantages), ("logprob_gap", gaps)):
            values = values.detach().float().cpu()
            self.distributions[key] = torch.cat([self.distributions[key], values]) if key in self.distributions \
                else values

    def _remix_micro_step(self, prompts: list[list[int]], completion_ids: torch.Tensor, completion_mask: torch.Tensor,
                          anchor: torch.Tensor, advantages: torch.Tensor, weight: float, rows: list[Row] | None = None,
                          peer: torch.Tensor | None = None) -> dict[str, float]:
        """ReMix: the batch scored under M sampled routings (routing-major rows), each distinct prompt routed
        and run once a routing (``routed_logprobs``); LoRA weights get the policy loss averaged over all M
        routings, the router the RLOO estimator over per-sequence losses. Spread: each row under one of its
        prompt's M routings, the router's baseline its prompt's rows under the others."""
        m = self.routings
        remix = self.policy.remix
        b = completion_ids.shape[0]
        remix.sampled(m, self.routing_generator)
        logprobs = routed_logprobs(self.policy.model, remix, prompts, completion_ids, completion_mask,
                                   pad_id=self.policy.tokenizer.pad_token_id, m=m, temperature=self.temperature,
                                   spread=self.spread_routings)
        reps = 1 if self.spread_routings else m
        completion_mask, anchor, advantages = (t.repeat(reps, *([1] * (t.dim() - 1)))
                                               for t in (completion_mask, anchor, advantages))
        loss_mask, peer_weights = completion_mask, None
        if rows is not None and peer is not None:  # each routing judged on its own; counted once a row
            loss_mask, peer_weights, advantages = self._screened_mask(rows, logprobs, completion_mask,
                                                                      peer.repeat(reps), advantages, count_rows=b)
        # ReMix trains on the HF sampling loop's own log-probs: no engine mismatch to weigh
        anchor, _ = off_policy_anchor(logprobs, anchor, loss_mask, torch.zeros_like(advantages, dtype=torch.bool),
                                      correct=self.off_policy_correction)
        loss, stats = policy_loss(logprobs, anchor, advantages, loss_mask, self.loss_kind,  # type: ignore[arg-type]
                                  token_weights=peer_weights, **self.loss_kwargs)
        # The router's reward is minus each routing's bounded per-sequence value (tapered for negatives).
        per_sequence = sequence_values(logprobs, anchor, advantages, loss_mask, self.loss_kind,  # type: ignore[arg-type]
                                       **self.loss_kwargs)
        if self.spread_routings:
            distinct, units, routing_of = spread_units(prompts, m)
            router_loss = remix.router_loss_spread(per_sequence, units - routing_of * len(distinct), routing_of)
        else:
            router_loss = remix.router_loss(per_sequence, m)
        ((loss + router_loss) * weight).backward()
        remix.deterministic()
        return {"loss": float(loss.detach()), "router_loss": float(router_loss.detach()), **stats}


def _times(a: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor | None:
    """The product of two optional token-weight tensors (None for all ones)."""
    return b if a is None else a if b is None else a * b


def _adamw(groups: list[dict[str, Any]], weight_decay: float) -> torch.optim.Optimizer:
    """AdamW over flat groups: the fused kernel where this torch has it for these tensors (one operation a
    step, the step count kept on the device), else the plain one."""
    try:
        return torch.optim.AdamW(groups, weight_decay=weight_decay, fused=True)
    except (RuntimeError, ValueError):
        return torch.optim.AdamW(groups, weight_decay=weight_decay)
