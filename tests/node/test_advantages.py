"""Advantages against hand-worked values, and RLOO's unbiasedness for uneven group sizes."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from node.train.advantages import (
    batch_advantages,
    global_advantages,
    group_advantages,
    grpo_advantages,
    has_signal,
    nonzero_groups,
    rloo_advantages,
)


def close(actual: torch.Tensor, expected: list[float], tol: float = 1e-6) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype), rtol=0, atol=tol)


# --- RLOO ---------------------------------------------------------------------------------------------


def test_rloo_group_of_four() -> None:
    # r = [1, 0, 0, 1], sum 2. A_0 = 1 - (2 - 1)/3 = 2/3; A_1 = 0 - (2 - 0)/3 = -2/3.
    close(rloo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0])), [2 / 3, -2 / 3, -2 / 3, 2 / 3])


def test_rloo_uneven_group_of_three() -> None:
    # r = [1, 0, 1], sum 2. A_0 = 1 - 1/2 = 0.5; A_1 = 0 - 2/2 = -1; A_2 = 0.5.
    close(rloo_advantages(torch.tensor([1.0, 0.0, 1.0])), [0.5, -1.0, 0.5])


def test_rloo_group_of_one_has_zero_baseline() -> None:
    close(rloo_advantages(torch.tensor([0.7])), [0.7])
    close(rloo_advantages(torch.tensor([0.0])), [0.0])


def test_rloo_constant_group_is_zero_and_integer_rewards_promote() -> None:
    close(rloo_advantages(torch.tensor([0.5, 0.5])), [0.0, 0.0])
    adv = rloo_advantages(torch.tensor([2, 0]))  # A_0 = 2 - 0 = 2; A_1 = 0 - 2 = -2
    assert adv.dtype == torch.float32
    close(adv, [2.0, -2.0])


def test_rloo_batched_along_last_dim_and_equals_scaled_mean_centring() -> None:
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.2, 0.4, 0.6, 0.8]])
    adv = rloo_advantages(rewards)
    close(adv[0], [2 / 3, -2 / 3, -2 / 3, 2 / 3])
    # Row 2: sum 2.0. A_0 = 0.2 - 1.8/3 = -0.4; A_1 = 0.4 - 1.6/3 = -2/15; A_2 = 2/15; A_3 = 0.4.
    close(adv[1], [-0.4, -2 / 15, 2 / 15, 0.4])
    # Identity: RLOO = N/(N-1) * (r - mean).
    torch.testing.assert_close(adv, 4 / 3 * (rewards - rewards.mean(-1, keepdim=True)))


def test_rloo_shift_lowers_the_baseline() -> None:
    # Baseline of [1,0,0,1] for i=0 is 1/3, lowered by 0.1 -> A_0 = 1 - 0.2333.. = 0.7667.
    close(
        rloo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), shift=0.1), [23 / 30, -17 / 30, -17 / 30, 23 / 30]
    )
    # A constant group is no longer zero: every A = delta.
    close(rloo_advantages(torch.tensor([1.0, 1.0]), shift=0.1), [0.1, 0.1])
    close(rloo_advantages(torch.tensor([0.3]), shift=0.1), [0.4])


def test_empty_group() -> None:
    assert rloo_advantages(torch.tensor([])).numel() == 0
    assert grpo_advantages(torch.tensor([])).numel() == 0
    assert global_advantages(torch.tensor([])).numel() == 0


# --- GRPO and global ----------------------------------------------------------------------------------


def test_grpo_uses_unbiased_std() -> None:
    # r = [1, 0, 0, 1]: mean 0.5, unbiased var = 4 * 0.25 / 3 = 1/3, std = 0.5773503.
    # A = +-0.5 / (0.5773503 + 1e-6) = +-0.8660239.
    a = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    close(grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0])), [a, -a, -a, a])
    # r = [1, 0, 0]: mean 1/3, deviations [2/3, -1/3, -1/3], var = (4/9 + 1/9 + 1/9)/2 = 1/3.
    s = math.sqrt(1 / 3) + 1e-6
    close(grpo_advantages(torch.tensor([1.0, 0.0, 0.0])), [(2 / 3) / s, (-1 / 3) / s, (-1 / 3) / s])


@pytest.mark.parametrize("value", [1 / 3, 0.9, 0.05, 0.7777])
def test_equal_partial_rewards_give_exactly_zero(value: float) -> None:
    # Eight rewards of 1/3 (partial credit): r - mean is about 3e-8 in float32, which passed such a group as
    # one with signal; GRPO's division by std + eps made it about 0.03.
    rewards = torch.full((8,), value)
    for kind in ("rloo", "grpo", "global"):
        adv = group_advantages(rewards, kind)  # type: ignore[arg-type]
        assert torch.equal(adv, torch.zeros(8)), kind
        assert torch.equal(group_advantages(rewards, kind, shift=0.1), torch.full((8,), 0.1)), kind  # type: ignore[arg-type]
    assert torch.equal(global_advantages(rewards, torch.full((12,), value)), torch.zeros(8))
    assert nonzero_groups([group_advantages(rewards, "rloo"), rloo_advantages(torch.tensor([value, 0.0]))]) == [1]
    batched = rloo_advantages(torch.stack([rewards, torch.tensor([value] * 7 + [0.0])]))
    assert torch.equal(batched[0], torch.zeros(8)) and bool((batched[1] != 0).all())


def test_grpo_degenerate_groups_and_shift() -> None:
    close(grpo_advantages(torch.tensor([0.4])), [0.0])  # std 0, numerator 0
    close(grpo_advantages(torch.tensor([1.0, 1.0, 1.0])), [0.0, 0.0, 0.0])
    # The shift is in normalised units: [1, 0] -> mean 0.5, std sqrt(0.5) = 0.7071068.
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    close(grpo_advantages(torch.tensor([1.0, 0.0]), shift=0.1), [a + 0.1, -a + 0.1])
    close(grpo_advantages(torch.tensor([1.0]), shift=0.1), [0.1])


def test_global_baseline() -> None:
    # 8 draws for the task with 2 positives: baseline 0.25; kept [1, 0] -> [0.75, -0.25].
    everything = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    close(global_advantages(torch.tensor([1.0, 0.0]), everything), [0.75, -0.25])
    close(global_advantages(torch.tensor([1.0, 0.0]), everything, shift=0.1), [0.85, -0.15])
    # Without the full draw, the group's own mean: [1, 0, 0] -> baseline 1/3.
    close(global_advantages(torch.tensor([1.0, 0.0, 0.0])), [2 / 3, -1 / 3, -1 / 3])
    with pytest.raises(ValueError):
        global_advantages(torch.tensor([1.0]), torch.tensor([]))


# --- dispatch, batches, dropping ----------------------------------------------------------------------


def test_group_advantages_dispatch() -> None:
    r = torch.tensor([1.0, 0.0, 1.0])
    torch.testing.assert_close(group_advantages(r, "rloo"), rloo_advantages(r))
    torch.testing.assert_close(group_advantages(r, "grpo", shift=0.2), grpo_advantages(r, shift=0.2))
    close(group_advantages(torch.tensor([1.0]), "global", all_rewards=torch.tensor([1.0, 0.0])), [0.5])
    with pytest.raises(ValueError, match="unknown advantage kind"):
        group_advantages(r, "ppo")  # type: ignore[arg-type]


def test_batch_advantages_uneven_sizes_and_shifts() -> None:
    groups = [torch.tensor([1.0, 0.0]), torch.tensor([1.0]), torch.tensor([0.0, 0.0, 1.0])]
    advs = batch_advantages(groups, "rloo", shifts=[0.0, 0.0, 0.1])
    close(advs[0], [1.0, -1.0])  # 1 - 0, 0 - 1
    close(advs[1], [1.0])  # baseline 0
    # [0, 0, 1]: baselines [0.5, 0.5, 0] lowered by 0.1 -> [-0.4, -0.4, 1.1].
    close(advs[2], [-0.4, -0.4, 1.1])
    assert [a.shape[0] for a in batch_advantages(groups, "grpo")] == [2, 1, 3]
    with pytest.raises(ValueError):
        batch_advantages(groups, "rloo", shifts=[0.0])


def test_nonzero_groups_drops_all_zero_groups() -> None:
    advs = [
        torch.tensor([0.5, -0.5]),
        torch.tensor([0.0, 0.0, 0.0]),
        torch.tensor([]),
        torch.tensor([1e-9, -1e-9]),
        torch.tensor([0.0, 1e-3]),
    ]
    assert nonzero_groups(advs) == [0, 4]
    assert nonzero_groups(advs, atol=1e-2) == [0]
    assert not has_signal(torch.tensor([0.0]))
    # Full pipeline: the all-correct and all-wrong groups carry no signal.
    rewards = [torch.tensor([1.0, 1.0]), torch.tensor([1.0, 0.0]), torch.tensor([0.0, 0.0, 0.0])]
    assert nonzero_groups(batch_advantages(rewards, "rloo")) == [1]
    assert nonzero_groups(batch_advantages(rewards, "grpo")) == [1]


# --- unbiasedness -------------------------------------------------------------------------------------
# Softmax policy p = softmax(theta) over K actions with known rewards r. J = sum_a p_a r_a and the exact
# gradient is dJ/dtheta_k = p_k (r_k - J). A group of N i.i.d. actions gives the score-function estimate
# g = (1/N) sum_i A_i (e_{a_i} - p). With RLOO advantages E[g] = grad J for every N >= 2; with the
# self-inclusive mean-centred advantage A_i = r_i - mean(r) (GRPO without the std), A_i equals
# (N-1)/N times the RLOO advantage, so E[g] = (N-1)/N grad J: a different shrink factor per group size.

THETA = torch.tensor([0.3, -0.2, 0.5, 0.0], dtype=torch.float64)
REWARDS = torch.tensor([1.0, 0.0, 0.8, 0.1], dtype=torch.float64)


def exact_gradient() -> torch.Tensor:
    p = torch.softmax(THETA, 0)
    return p * (REWARDS - (p * REWARDS).sum())


def group_estimates(actions: torch.Tensor, centred: bool) -> torch.Tensor:
    """[S, N] action indices -> [S, K] gradient estimates, one per group."""
    p = torch.softmax(THETA, 0)
    r = REWARDS[actions]
    adv = r - r.mean(-1, keepdim=True) if centred else rloo_advantages(r)
    score = torch.nn.functional.one_hot(actions, len(THETA)).double() - p  # [S, N, K]
    return (adv.unsqueeze(-1) * score).mean(dim=1)


@pytest.mark.parametrize("n", [2, 3])
def test_rloo_unbiased_exact_enumeration(n: int) -> None:
    # Enumerate all K^N outcomes of a group, weight each by its probability.
    p = torch.softmax(THETA, 0)
    outcomes = torch.tensor(list(itertools.product(range(len(THETA)), repeat=n)))
    prob = p[outcomes].prod(dim=1, keepdim=True)
    expect_rloo = (prob * group_estimates(outcomes, centred=False)).sum(0)
    expect_centred = (prob * group_estimates(outcomes, centred=True)).sum(0)
    torch.testing.assert_close(expect_rloo, exact_gradient(), rtol=0, atol=1e-12)
    torch.testing.assert_close(expect_centred, (n - 1) / n * exact_gradient(), rtol=0, atol=1e-12)


def test_rloo_unbiased_monte_carlo_uneven_groups() -> None:
    gen = torch.Generator().manual_seed(1234)
    p = torch.softmax(THETA, 0)
    truth = exact_gradient()  # about [0.1192, -0.0977, 0.0771, -0.0986]
    samples = 100_000
    pooled_rloo = []
    for n in (2, 5):
        actions = torch.multinomial(p.expand(samples, -1), n, replacement=True, generator=gen)
        rloo = group_estimates(actions, centred=False)
        centred = group_estimates(actions, centred=True)
        se = rloo.std(0) / math.sqrt(samples)  # standard error of each component, < 1e-3
        assert float(se.max()) < 1e-3
        # RLOO: within 4 standard errors of the exact gradient.
        assert bool(((rloo.mean(0) - truth).abs() < 4 * se).all()), (n, rloo.mean(0), truth)
        # Mean-centred: matches (N-1)/N * truth (0.5 for N=2, 0.8 for N=5) ...
        assert bool(((centred.mean(0) - (n - 1) / n * truth).abs() < 4 * se).all())
        # ... and is clearly off the truth: the bias |truth| / N is at least 0.0771 / 5 = 0.015 >> 4 se.
        assert bool(((centred.mean(0) - truth).abs() > 4 * se).all())
        pooled_rloo.append(rloo)
    # Pooling groups of both sizes (as local + peer groups are) stays unbiased for RLOO.
    pooled = torch.cat(pooled_rloo)
    se = pooled.std(0) / math.sqrt(pooled.shape[0])
    assert bool(((pooled.mean(0) - truth).abs() < 4 * se).all())
