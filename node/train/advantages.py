"""Advantages for groups of completions of one task (formulas: docs/algorithms.md, "Advantages").

A *group* is the completions of one task from one source (our own generation, or one peer). Every
function here takes the group's rewards along the last dimension -- ``[N]`` for one group or ``[..., N]``
for a batch of equal-sized groups -- and returns advantages of the same shape, detached, in floating
point (integer rewards are promoted to float32).

- RLOO (default): ``A_i = r_i - (sum_j r_j - r_i) / (N - 1)``; a group of one has baseline 0, so
  ``A = r``. Unbiased for every ``N``.
- GRPO: ``A_i = (r_i - mean) / (std + eps)``, ``std`` the unbiased sample standard deviation (as in
  ``torch.std``); a group of one has ``std = 0`` and advantage 0.
- Global (Reinforce-Ada): ``A_i = r_i - mean(all rewards drawn for the task)``, no std.

A group whose rewards are all equal gets advantages of exactly zero (plus the shift) from every kind: in
floating point ``r - mean`` of eight rewards of 1/3 is about 3e-8, not 0, which would pass it as a group
with signal (and GRPO's division by ``std + eps`` would make it 0.03).

AsymRE shift: ``shift = delta`` lowers the baseline by delta, ``A = r - (baseline - delta)``. For GRPO the
shift is applied in normalised units, ``A = (r - mean) / (std + eps) + delta`` (shifting the numerator
instead would turn a constant group into ``delta / eps``). A shifted group of equal rewards therefore has
advantage ``delta`` everywhere (not zero) and is kept by :func:`nonzero_groups`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from node.modes import ADVANTAGE_KINDS, AdvantageKind


def _as_float(rewards: Tensor) -> Tensor:
    rewards = torch.as_tensor(rewards).detach()
    return rewards if rewards.is_floating_point() else rewards.to(torch.float32)


def _flat(rewards: Tensor) -> Tensor:
    """``[..., 1]``: True for a group whose rewards are all equal (an empty group counts as flat)."""
    if rewards.dim() == 0:
        return torch.ones((), dtype=torch.bool)
    if rewards.shape[-1] == 0:
        return torch.ones((*rewards.shape[:-1], 1), dtype=torch.bool)
    return (rewards == rewards[..., :1]).all(dim=-1, keepdim=True)


def _zero_where_flat(centred: Tensor, rewards: Tensor) -> Tensor:
    return torch.where(_flat(rewards), torch.zeros_like(centred), centred)


def rloo_advantages(rewards: Tensor, *, shift: float = 0.0) -> Tensor:
    """Leave-one-out advantages ``r_i - (mean of the other N - 1 rewards - shift)``.

    Args:
        rewards: ``[..., N]`` rewards, one group along the last dimension.
        shift: AsymRE delta subtracted from the baseline.

    Returns:
        ``[..., N]`` advantages; for ``N == 1`` the baseline is 0 (so ``A = r + shift``).
    """
    rewards = _as_float(rewards)
    n = rewards.shape[-1] if rewards.dim() > 0 else 1
    if n <= 1:
        return rewards + shift
    baseline = (rewards.sum(dim=-1, keepdim=True) - rewards) / (n - 1)
    return _zero_where_flat(rewards - baseline, rewards) + shift


def grpo_advantages(rewards: Tensor, eps: float = 1e-6, *, shift: float = 0.0) -> Tensor:
    """GRPO advantages ``(r_i - mean) / (std + eps) + shift`` with the unbiased std.

    Args:
        rewards: ``[..., N]`` rewards, one group along the last dimension.
        eps: added to the std so that constant groups divide by ``eps`` rather than 0.
        shift: AsymRE delta, added after normalisation (the baseline lowered by delta std units).

    Returns:
        ``[..., N]`` advantages; a group of one has std 0 and advantage ``shift``.
    """
    rewards = _as_float(rewards)
    n = rewards.shape[-1] if rewards.dim() > 0 else 1
    if n == 0:
        return rewards.clone()
    mean = rewards.mean(dim=-1, keepdim=True)
    if n > 1:
        std = rewards.std(dim=-1, keepdim=True, correction=1)
    else:
        std = torch.zeros_like(mean)
    return _zero_where_flat((rewards - mean) / (std + eps), rewards) + shift


def global_advantages(
    rewards: Tensor, all_rewards_for_task: Tensor | None = None, *, shift: float = 0.0
) -> Tensor:
    """Reinforce-Ada global-baseline advantages ``r_i - (mean(all_rewards_for_task) - shift)``.

    Args:
        rewards: ``[N]`` rewards of the kept completions (or ``[..., N]`` when ``all_rewards_for_task``
            is None).
        all_rewards_for_task: ``[M]`` rewards of every completion drawn for the task, including the
            ones downsampled away; None uses the group's own mean.
        shift: AsymRE delta subtracted from the baseline.

    Returns:
        ``[N]`` advantages, no std normalisation.
    """
    rewards = _as_float(rewards)
    if all_rewards_for_task is None:
        if rewards.numel() == 0:
            return rewards.clone()
        return _zero_where_flat(rewards - rewards.mean(dim=-1, keepdim=True), rewards) + shift
    everything = _as_float(all_rewards_for_task)
    if everything.numel() == 0:
        raise ValueError("all_rewards_for_task is empty: the baseline needs at least one reward")
    centred = rewards - everything.mean()
    if bool(_flat(everything.flatten())) and bool((rewards == everything.flatten()[0]).all()):
        centred = torch.zeros_like(centred)  # every draw the same reward: no signal, exactly
    return centred + shift


def group_advantages(
    rewards: Tensor,
    kind: AdvantageKind,
    *,
    shift: float = 0.0,
    all_rewards: Tensor | None = None,
    eps: float = 1e-6,
) -> Tensor:
    """Advantages of one group by ``kind``.

    Args:
        rewards: ``[N]`` rewards of one group (``[..., N]`` works for every kind except "global" with
            ``all_rewards``).
        kind: "rloo", "grpo" or "global".
        shift: AsymRE delta: the baseline is lowered by it (external groups).
        all_rewards: for "global", every reward drawn for the task; ignored by the other kinds.
        eps: GRPO's std epsilon.

    Returns:
        ``[N]`` detached advantages.

    Raises:
        ValueError: unknown ``kind``.
    """
    if kind == "rloo":
        return rloo_advantages(rewards, shift=shift)
    if kind == "grpo":
        return grpo_advantages(rewards, eps, shift=shift)
    if kind == "global":
        return global_advantages(rewards, all_rewards, shift=shift)
    raise ValueError(f"unknown advantage kind {kind!r}; expected one of {ADVANTAGE_KINDS}")


def batch_advantages(
    groups: Sequence[Tensor], kind: AdvantageKind, shifts: Sequence[float] | None = None
) -> list[Tensor]:
    """Advantages of each group separately (groups may differ in size).

    Args:
        groups: rewards ``[N_g]`` of each group g.
        kind: the advantage kind, as in :func:`group_advantages`.
        shifts: one AsymRE delta per group (e.g. 0 for local, 0.1 for external), or None for no shift.

    Returns:
        One ``[N_g]`` advantage tensor per group, in order.
    """
    if shifts is None:
        shifts = [0.0] * len(groups)
    if len(shifts) != len(groups):
        raise ValueError(f"{len(shifts)} shifts for {len(groups)} groups")
    return [group_advantages(r, kind, shift=s) for r, s in zip(groups, shifts)]


def has_signal(advantages: Tensor, atol: float = 1e-8) -> bool:
    """Whether any advantage in ``advantages`` (any shape) is farther than ``atol`` from zero."""
    advantages = torch.as_tensor(advantages)
    return bool(advantages.numel() > 0 and (advantages.detach().abs() > atol).any())


def nonzero_groups(advantages: Sequence[Tensor], atol: float = 1e-8) -> list[int]:
    """Indices of the groups whose advantages are not all zero (within ``atol``); empty groups count as
    all zero."""
    return [g for g, adv in enumerate(advantages) if has_signal(adv, atol)]
