"""``policy_loss`` and ``logprob_gap`` with their figures left on the device: one tensor a micro-batch, summed
over a step's micro-batches on the device and read once a step (a read of a device value makes the host
wait for every kernel queued before it; the trainer's step read 439 of them).

The loss is ``node.train.losses``' own ``sequence_surrogate`` (its formulas, one implementation); the
statistics are those of ``policy_loss`` computed without reading anything, in ``STAT_KEYS`` order, and the
token log-ratio they share is computed once. ``tests/node/test_losses.py`` checks both against
``policy_loss`` and ``logprob_gap`` for every loss kind.
"""

from __future__ import annotations

import torch
from torch import Tensor

from node.modes import LossKind
from node.train.losses import MAX_LOG_RATIO, sequence_surrogate

STAT_KEYS = ("loss", "n_sequences", "n_tokens", "n_negatives", "advantage_mean", "ratio_mean", "ratio_max",
             "clip_frac", "neg_weight_mean")
"""What ``policy_loss_terms`` returns, in order: the keys of ``policy_loss``'s statistics."""

GAP_KEYS = ("gap_abs_sum", "gap_k3_sum", "gap_tokens")


def policy_loss_terms(logprobs: Tensor, anchor_logprobs: Tensor, advantages: Tensor, mask: Tensor, kind: LossKind, *,
                      eps_low: float = 0.2, eps_high: float = 0.28, length_norm: bool = False,
                      token_weights: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``policy_loss``'s loss and its statistics as one float32 tensor ``[len(STAT_KEYS)]`` on the device."""
    per_sequence = sequence_surrogate(logprobs, anchor_logprobs, advantages, mask, kind, eps_low=eps_low,
                                      eps_high=eps_high, length_norm=length_norm, token_weights=token_weights)
    keep = mask != 0
    nonempty = keep.any(dim=-1)
    n_seq = nonempty.sum()
    loss = torch.where(nonempty, per_sequence, torch.zeros_like(per_sequence)).sum() / n_seq.clamp(min=1)
    adv = advantages.detach().float()
    diff = logprobs.detach().float() - anchor_logprobs.detach().float()
    log_ratio = torch.where(keep, torch.nan_to_num(diff, nan=0.0).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO), 0.0)
    rho = torch.exp(log_ratio)
    n_tokens = keep.sum()
    seq_ratio = log_ratio.sum(dim=-1)
    if length_norm:
        seq_ratio = seq_ratio / keep.sum(dim=-1).clamp(min=1)
    w = torch.exp(seq_ratio.clamp(max=0.0))
    negatives = nonempty & (adv < 0)
    n_neg = negatives.sum()
    zero = torch.zeros((), device=logprobs.device)
    one = torch.ones((), device=logprobs.device)
    if kind == "topr":
        clip_frac = (negatives & (w < 1)).sum() / n_seq.clamp(min=1)
        neg_weight = torch.where(n_neg > 0, torch.where(negatives, w, 0.0).sum() / n_neg.clamp(min=1), one)
    else:
        a = adv.unsqueeze(-1)
        if kind == "rec":
            dropped = ~(((a >= 0) & (rho <= 1 + eps_high)) | ((a <= 0) & (rho >= 1 - eps_low)))
        elif kind == "grpo":
            dropped = ((a > 0) & (rho > 1 + eps_high)) | ((a < 0) & (rho < 1 - eps_low))
        else:
            dropped = torch.zeros_like(keep)
        clip_frac = (dropped & keep).sum() / n_tokens.clamp(min=1)
        neg_weight = one
    ratio_max = torch.where(keep, rho, 0.0).max() if rho.numel() else zero
    stats = torch.stack([loss.detach(), n_seq, n_tokens, n_neg,
                         torch.where(nonempty, adv, 0.0).sum() / n_seq.clamp(min=1),
                         torch.where(keep, rho, 0.0).sum() / n_tokens.clamp(min=1), ratio_max, clip_frac,
                         neg_weight]).float()
    return loss, stats


def logprob_gap_terms(logprobs: Tensor, behavior_logprobs: Tensor, mask: Tensor) -> Tensor:
    """``logprob_gap``'s three sums (``|d|``, the k3 estimate, tokens) as one tensor on the device."""
    keep = mask != 0
    d = torch.where(keep, logprobs.detach().float() - behavior_logprobs.detach().float(), 0.0)
    return torch.stack([d.abs().sum(), (torch.expm1(d) - d).sum(), keep.sum().float()])
