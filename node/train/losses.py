"""Policy losses for off-policy REINFORCE (formulas: docs/algorithms.md, "Policy losses").

Inputs, for a batch of B completions padded to T tokens:

- ``logprobs`` ``[B, T]``: the current policy's log-probs of the sampled tokens (the only input that
  carries a gradient);
- ``anchor_logprobs`` ``[B, T]``: behaviour log-probs nu (a peer's, our own recorded ones, or the anchor
  computed at ingestion); detached here;
- ``advantages`` ``[B]``: one advantage per completion; detached here;
- ``mask`` ``[B, T]``: 1 for completion tokens, 0 for padding (any dtype; read as ``mask != 0``).

Every ratio is computed in log space, and only on masked tokens: padded positions are replaced by 0
before any ``exp``, so ``-inf`` padding never produces a NaN value or gradient. Every token log-ratio is
clamped to ``[-MAX_LOG_RATIO, MAX_LOG_RATIO]`` before it is used, in every loss: behaviour log-probs come
from peers, and one absurd value (``-3e38``) must not turn a loss or a gradient non-finite (a clamped
token gets no gradient through its ratio).

Aggregation rule (the same for every loss): each sequence b gets a surrogate
``L_b = sum_t m_bt * l_bt / max(1, sum_t m_bt)``, its per-token surrogate ``l_bt`` summed over its
completion tokens and divided by its own token count. The loss is the mean of ``L_b`` over the sequences
whose mask is non-empty; sequences with an empty mask contribute nothing and are not counted. A batch with
no tokens at all gives a loss of exactly 0 that is still connected to ``logprobs`` (zero gradient).

Per-token surrogates ``l_bt`` (with ``rho = exp(logp - anchor)``):

- ``topr``: ``-w_b * A_b * logp_bt``, ``w_b = 1`` for ``A_b >= 0`` and
  ``w_b = exp(min(0, sum_t m (logp - anchor)))`` (detached) for ``A_b < 0``; with ``length_norm`` the
  log-ratio is the mean over tokens instead of the sum;
- ``rec``: ``-A_b * logp_bt`` on kept tokens only, a token being kept iff
  ``(A_b >= 0 and rho <= 1 + eps_high) or (A_b <= 0 and rho >= 1 - eps_low)`` (keep mask detached);
- ``grpo``: ``-min(rho * A_b, clip(rho, 1 - eps_low, 1 + eps_high) * A_b)`` (gradient through rho);
- ``reinforce``: ``-A_b * logp_bt``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from node.modes import LOSS_KINDS, LossKind

MAX_LOG_RATIO = 20.0
"""Bound on ``|log pi - log nu|`` per token (a ratio of about 5e8): far beyond any ratio that still
carries information, well inside float32."""


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``x`` over positions where ``mask`` is non-zero; 0 where the mask is empty.

    Args:
        x: any shape; masked-out entries may be ``inf`` or NaN, they are never read.
        mask: broadcastable to ``x``.
        dim: reduce over this dimension, or over everything when None.

    Returns:
        A scalar (``dim`` None) or ``x`` reduced over ``dim``.
    """
    keep = mask != 0
    kept = torch.where(keep, x, torch.zeros_like(x))
    if dim is None:
        return kept.sum() / keep.sum().clamp(min=1)
    return kept.sum(dim=dim) / keep.sum(dim=dim).clamp(min=1)


def _check_shapes(logprobs: Tensor, anchor_logprobs: Tensor, advantages: Tensor, mask: Tensor) -> None:
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be [B, T], got shape {tuple(logprobs.shape)}")
    if anchor_logprobs.shape != logprobs.shape or mask.shape != logprobs.shape:
        raise ValueError(
            f"logprobs {tuple(logprobs.shape)}, anchor_logprobs {tuple(anchor_logprobs.shape)} and "
            f"mask {tuple(mask.shape)} must have the same shape"
        )
    if advantages.shape != logprobs.shape[:1]:
        raise ValueError(f"advantages must be [B] = [{logprobs.shape[0]}], got {tuple(advantages.shape)}")


def _token_log_ratio(logprobs: Tensor, anchor_logprobs: Tensor, keep: Tensor) -> Tensor:
    """``[B, T]`` log(pi / nu) on kept tokens, clamped to ``+-MAX_LOG_RATIO``; 0 elsewhere."""
    diff = logprobs - anchor_logprobs.detach().to(logprobs.dtype)
    diff = torch.nan_to_num(diff, nan=0.0).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    return torch.where(keep, diff, torch.zeros_like(diff))


def tapered_weights(
    logprobs: Tensor, anchor_logprobs: Tensor, mask: Tensor, *, length_norm: bool = False
) -> Tensor:
    """TOPR's truncated sequence ratio ``exp(min(0, log pi(y) - log nu(y)))``, detached, in ``[0, 1]``.

    Args:
        logprobs, anchor_logprobs, mask: ``[B, T]`` as in the module docstring.
        length_norm: use the mean token log-ratio instead of the sum.

    Returns:
        ``[B]`` weights (1 for an empty sequence). Callers apply them to negatives only.
    """
    keep = mask != 0
    log_ratio = _token_log_ratio(logprobs.detach().float(), anchor_logprobs.float(), keep).sum(dim=-1)
    if length_norm:
        log_ratio = log_ratio / keep.sum(dim=-1).clamp(min=1)
    return torch.exp(log_ratio.clamp(max=0.0))


def _token_surrogates(
    logprobs: Tensor,
    anchor_logprobs: Tensor,
    advantages: Tensor,
    keep: Tensor,
    kind: str,
    eps_low: float,
    eps_high: float,
    length_norm: bool,
    token_weights: Tensor | None = None,
) -> Tensor:
    """``[B, T]`` per-token surrogates ``l_bt`` (0 on padding), times ``token_weights`` when given."""
    adv = advantages.unsqueeze(-1)
    safe_logp = torch.where(keep, logprobs, torch.zeros_like(logprobs))
    if kind == "reinforce":
        token = -adv * safe_logp
    elif kind == "topr":
        w = tapered_weights(logprobs, anchor_logprobs, keep, length_norm=length_norm)
        w = torch.where(advantages >= 0, torch.ones_like(w), w).unsqueeze(-1)
        token = -w * adv * safe_logp
    elif kind == "rec":
        rho = torch.exp(_token_log_ratio(logprobs, anchor_logprobs, keep)).detach()
        kept = ((adv >= 0) & (rho <= 1 + eps_high)) | ((adv <= 0) & (rho >= 1 - eps_low))
        token = -adv * torch.where(kept, safe_logp, torch.zeros_like(safe_logp))
    elif kind == "grpo":
        rho = torch.exp(_token_log_ratio(logprobs, anchor_logprobs, keep))
        unclipped = rho * adv
        clipped = rho.clamp(1 - eps_low, 1 + eps_high) * adv
        token = -torch.minimum(unclipped, clipped)
    else:
        raise ValueError(f"unknown loss kind {kind!r}; expected one of {LOSS_KINDS}")
    if token_weights is not None:
        token = token * token_weights.detach().float()
    return torch.where(keep, token, torch.zeros_like(token))


def sequence_surrogate(
    logprobs: Tensor,
    anchor_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    kind: LossKind,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    length_norm: bool = False,
    token_weights: Tensor | None = None,
) -> Tensor:
    """Per-sequence surrogate losses ``L_b`` (differentiable w.r.t. ``logprobs``).

    Args:
        logprobs, anchor_logprobs, mask: ``[B, T]``; advantages: ``[B]`` (module docstring).
        kind: "topr", "rec", "grpo" or "reinforce".
        eps_low, eps_high: clip range of REC and GRPO (``1 - eps_low``, ``1 + eps_high``).
        length_norm: TOPR's length-normalised ratio.
        token_weights: ``[B, T]`` detached factors on each token's surrogate (e.g.
            :func:`engine_mismatch_weights`); None for 1.

    Returns:
        ``[B]`` float32 surrogates, 0 for sequences with an empty mask; their mean over non-empty
        sequences is :func:`policy_loss`.

    Raises:
        ValueError: unknown ``kind`` or mismatched shapes.
    """
    _check_shapes(logprobs, anchor_logprobs, advantages, mask)
    keep = mask != 0
    token = _token_surrogates(
        logprobs.float(),
        anchor_logprobs.float(),
        advantages.detach().float(),
        keep,
        kind,
        eps_low,
        eps_high,
        length_norm,
        token_weights,
    )
    return token.sum(dim=-1) / keep.sum(dim=-1).clamp(min=1)


def sequence_values(
    logprobs: Tensor,
    anchor_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    kind: LossKind,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    length_norm: bool = False,
) -> Tensor:
    """Detached, bounded per-sequence loss values, e.g. for ReMix's router (docs/algorithms.md, "ReMix").

    Positives (``A >= 0``) get their :func:`sequence_surrogate` value. Negatives never get
    ``|A| * mean logp``, which is unbounded below and rewards pushing a bad sample to zero forever; they
    get the tapered value ``|A| * w`` with ``w`` from :func:`tapered_weights`, in ``[0, |A|]``, smallest
    when the policy has left the sample -- for every kind except "grpo", whose clipped-ratio value
    ``|A| * mean_t max(rho, clip(rho))`` is already bounded below and is used as is.

    Returns:
        ``[B]`` detached float32 values, 0 for empty sequences.
    """
    with torch.no_grad():
        values = sequence_surrogate(
            logprobs,
            anchor_logprobs,
            advantages,
            mask,
            kind,
            eps_low=eps_low,
            eps_high=eps_high,
            length_norm=length_norm,
        )
        if kind == "grpo":
            return values
        adv = advantages.detach().float()
        w = tapered_weights(logprobs, anchor_logprobs, mask, length_norm=length_norm)
        nonempty = (mask != 0).any(dim=-1)
        bounded = torch.where(nonempty, -adv * w, torch.zeros_like(w))
        return torch.where(adv < 0, bounded, values)


def _stats(
    logprobs: Tensor,
    anchor_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    kind: str,
    eps_low: float,
    eps_high: float,
    length_norm: bool,
) -> dict[str, float]:
    """Detached diagnostics; see :func:`policy_loss`."""
    keep = mask != 0
    nonempty = keep.any(dim=-1)
    adv = advantages.detach().float()
    rho = torch.exp(_token_log_ratio(logprobs.detach().float(), anchor_logprobs.float(), keep))
    negatives = nonempty & (adv < 0)
    w = tapered_weights(logprobs, anchor_logprobs, mask, length_norm=length_norm)
    n_neg = int(negatives.sum())
    if kind == "topr":
        clipped_seq = negatives & (w < 1)
        clip_frac = float(clipped_seq.sum()) / max(1, int(nonempty.sum()))
        neg_weight = float(w[negatives].mean()) if n_neg else 1.0
    else:
        a = adv.unsqueeze(-1)
        if kind == "rec":
            dropped = ~(((a >= 0) & (rho <= 1 + eps_high)) | ((a <= 0) & (rho >= 1 - eps_low)))
        elif kind == "grpo":
            dropped = ((a > 0) & (rho > 1 + eps_high)) | ((a < 0) & (rho < 1 - eps_low))
        else:
            dropped = torch.zeros_like(keep)
        clip_frac = float(masked_mean(dropped.float(), keep))
        neg_weight = 1.0
    return {
        "n_sequences": float(nonempty.sum()),
        "n_tokens": float(keep.sum()),
        "n_negatives": float(n_neg),
        "advantage_mean": float(adv[nonempty].mean()) if bool(nonempty.any()) else 0.0,
        "ratio_mean": float(masked_mean(rho, keep)),
        "ratio_max": float(torch.where(keep, rho, torch.zeros_like(rho)).max()) if rho.numel() else 0.0,
        "clip_frac": clip_frac,
        "neg_weight_mean": neg_weight,
    }


def policy_loss(
    logprobs: Tensor,
    anchor_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    kind: LossKind,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    length_norm: bool = False,
    token_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """The policy loss: mean of :func:`sequence_surrogate` over sequences with a non-empty mask.

    Args:
        logprobs, anchor_logprobs, mask: ``[B, T]``; advantages: ``[B]`` (module docstring).
        kind: "topr", "rec", "grpo" or "reinforce".
        eps_low, eps_high: clip range of REC and GRPO.
        length_norm: TOPR's length-normalised ratio.
        token_weights: ``[B, T]`` detached factors on each token's surrogate; None for 1.

    Returns:
        The scalar loss (differentiable w.r.t. ``logprobs`` only) and detached float stats:
        ``loss``, ``n_sequences`` (non-empty), ``n_tokens``, ``n_negatives`` (non-empty, ``A < 0``),
        ``advantage_mean``, ``ratio_mean`` / ``ratio_max`` (token ratio pi/nu over completion tokens),
        ``clip_frac`` (topr: fraction of sequences whose weight was tapered below 1; rec: fraction of
        tokens dropped; grpo: fraction of tokens where the clipped term is active; reinforce: 0) and
        ``neg_weight_mean`` (topr: mean taper weight of the negatives, 1 when there are none; 1 for the
        other kinds, which use no importance weight).

    Raises:
        ValueError: unknown ``kind`` or mismatched shapes.
    """
    per_sequence = sequence_surrogate(
        logprobs,
        anchor_logprobs,
        advantages,
        mask,
        kind,
        eps_low=eps_low,
        eps_high=eps_high,
        length_norm=length_norm,
        token_weights=token_weights,
    )
    nonempty = (mask != 0).any(dim=-1)
    loss = torch.where(nonempty, per_sequence, torch.zeros_like(per_sequence)).sum()
    loss = loss / nonempty.sum().clamp(min=1)
    stats = _stats(logprobs, anchor_logprobs, advantages, mask, kind, eps_low, eps_high, length_norm)
    stats["loss"] = float(loss.detach())
    return loss, stats


def engine_mismatch_weights(logprobs: Tensor, behavior_logprobs: Tensor, mask: Tensor, cap: float) -> Tensor:
    """Truncated importance weights for the sampling engine's mismatch with the trainer: per token
    ``min(exp(logp - behavior), cap)`` with ``logp`` the trainer's log-prob before the update (detached),
    1 on padding. ``[B, T]`` in, ``[B, T]`` out.

    A generation engine in reduced precision samples from a slightly different distribution than the one
    the trainer computes (bfloat16: a mean gap of about 0.05 nats a token on smollm2-135m); weighting each
    token of the engine's own samples by the trainer/engine ratio makes the update unbiased for the trainer's
    policy again, and the cap bounds the variance a rare large ratio would add (truncated importance
    sampling: docs/algorithms.md)."""
    keep = mask != 0
    d = torch.where(keep, logprobs.detach().float() - behavior_logprobs.detach().float(), torch.zeros_like(logprobs))
    return torch.exp(d.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)).clamp(max=cap)


def off_policy_anchor(logprobs: Tensor, anchor: Tensor, mask: Tensor, own: Tensor, *, correct: bool = True,
                      engine_is_cap: float | None = None) -> tuple[Tensor, Tensor | None]:
    """The off-policy correction every training path applies: the log-probs each token's ratio is taken
    against and the engine-mismatch weights of its tokens (None: all ones). ``logprobs``, ``anchor``, ``mask``
    ``[B, T]``; ``own`` ``[B]``, the rows the node sampled itself.

    With ``engine_is_cap`` (a generation engine other than the trainer, e.g. vLLM), the node's own rows get
    ``engine_mismatch_weights`` against their recorded log-probs and are then treated as on-policy (their
    anchor becomes the trainer's own detached log-probs: no taper); peers' rows keep their anchor. With
    ``correct`` off every row is treated as on-policy (ratio fixed at 1) and no weight applies."""
    if not correct:
        return logprobs.detach(), None
    if engine_is_cap is None:
        return anchor, None
    own_rows = own[:, None]
    weights = torch.where(own_rows, engine_mismatch_weights(logprobs, anchor, mask, engine_is_cap), 1.0)
    return torch.where(own_rows, logprobs.detach(), anchor), weights


def logprob_gap(logprobs: Tensor, behavior_logprobs: Tensor, mask: Tensor) -> tuple[float, float, int]:
    """How far the trainer's log-probs are from the sampler's, for tokens the sampler drew itself.

    ``logprobs``, ``behavior_logprobs``, ``mask`` ``[B, T]``. Returns sums over masked tokens of
    ``|logprobs - behavior|`` and of the k3 estimate ``exp(d) - 1 - d`` with ``d = logprobs - behavior``
    (unbiased for KL(sampler || trainer) when the tokens were drawn from the sampler, and never negative),
    and the token count; divide by the count for means (sums, so micro-batches add up).
    """
    keep = mask != 0
    d = torch.where(keep, logprobs.detach().float() - behavior_logprobs.detach().float(), torch.zeros_like(logprobs))
    k3 = torch.expm1(d) - d
    return float(d.abs().sum()), float(k3.sum()), int(keep.sum())
