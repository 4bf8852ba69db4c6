"""Policy losses against hand-worked values: TOPR, REC one-side, PPO-clip, REINFORCE, aggregation."""

from __future__ import annotations

import math

import pytest
import torch

from node.train.losses import (
    MAX_LOG_RATIO,
    engine_mismatch_weights,
    masked_mean,
    off_policy_anchor,
    policy_loss,
    sequence_surrogate,
    sequence_values,
    tapered_weights,
)

NEG_INF = float("-inf")


def leaf(values: list[list[float]]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32, requires_grad=True)


def grad_of(loss: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    (g,) = torch.autograd.grad(loss, x)
    return g


# --- masked_mean --------------------------------------------------------------------------------------


def test_masked_mean_ignores_padding_and_empty_masks() -> None:
    x = torch.tensor([[1.0, 3.0, float("nan")], [float("inf"), 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    # Row 0: (1 + 3) / 2 = 2; row 1: empty -> 0.  Overall: 4 / 2 = 2.
    torch.testing.assert_close(masked_mean(x, mask, dim=-1), torch.tensor([2.0, 0.0]))
    torch.testing.assert_close(masked_mean(x, mask), torch.tensor(2.0))
    torch.testing.assert_close(masked_mean(x, torch.zeros(2, 3)), torch.tensor(0.0))


# --- TOPR ---------------------------------------------------------------------------------------------
# Sequence 0: A = +1, tokens logp [-1, -2], padding at t=2.
# Sequence 1: A = -2, tokens logp [-0.5, -0.5, -0.5], anchor [-0.4, -0.4, -0.6]:
#   log-ratio sum = -0.1 - 0.1 + 0.1 = -0.1 -> w = exp(-0.1) = 0.904837.
# L_0 = -1 * 1 * (-1 - 2) / 2 = 1.5
# L_1 = -(0.904837 * -2 * -1.5) / 3 = -0.904837
# loss = (1.5 - 0.904837) / 2 = 0.2975813
# dloss/dlogp: seq 0: -A * w / len / B = -1/2/2 = -0.25; seq 1: 2 * 0.904837 / 3 / 2 = 0.3016123.

TOPR_LOGP = [[-1.0, -2.0, NEG_INF], [-0.5, -0.5, -0.5]]
TOPR_ANCHOR = [[-1.5, -1.5, NEG_INF], [-0.4, -0.4, -0.6]]
TOPR_MASK = torch.tensor([[1, 1, 0], [1, 1, 1]])
TOPR_ADV = torch.tensor([1.0, -2.0])


def test_topr_hand_values_and_gradient() -> None:
    logp = leaf(TOPR_LOGP)
    loss, stats = policy_loss(logp, torch.tensor(TOPR_ANCHOR), TOPR_ADV, TOPR_MASK, "topr")
    w = math.exp(-0.1)
    assert loss.item() == pytest.approx((1.5 - w) / 2, abs=1e-6)
    expected_grad = torch.tensor([[-0.25, -0.25, 0.0], [w / 3, w / 3, w / 3]])
    torch.testing.assert_close(grad_of(loss, logp), expected_grad)
    assert stats["n_sequences"] == 2 and stats["n_tokens"] == 5 and stats["n_negatives"] == 1
    assert stats["neg_weight_mean"] == pytest.approx(w, abs=1e-6)
    assert stats["clip_frac"] == pytest.approx(0.5)  # one of two sequences tapered
    assert stats["loss"] == pytest.approx(loss.item())
    # Token ratios: exp(0.5), exp(-0.5), exp(-0.1), exp(-0.1), exp(0.1); mean over 5 tokens.
    ratios = [math.exp(0.5), math.exp(-0.5), math.exp(-0.1), math.exp(-0.1), math.exp(0.1)]
    assert stats["ratio_mean"] == pytest.approx(sum(ratios) / 5, abs=1e-6)
    assert stats["ratio_max"] == pytest.approx(math.exp(0.5), abs=1e-6)


def test_topr_length_normalised_ratio() -> None:
    # Mean token log-ratio of sequence 1 = -0.1 / 3 -> w = exp(-1/30) = 0.9672161.
    logp = leaf(TOPR_LOGP)
    per_seq = sequence_surrogate(
        logp, torch.tensor(TOPR_ANCHOR), TOPR_ADV, TOPR_MASK, "topr", length_norm=True
    )
    w = math.exp(-1 / 30)
    torch.testing.assert_close(per_seq, torch.tensor([1.5, -w]))


def test_topr_negative_above_behaviour_is_not_upweighted() -> None:
    # Policy more likely than behaviour: log-ratio sum +0.3 -> w = exp(min(0, 0.3)) = 1.
    logp = leaf([[-0.5, -0.5, -0.5]])
    anchor = torch.tensor([[-0.6, -0.6, -0.6]])
    loss, stats = policy_loss(logp, anchor, torch.tensor([-1.0]), torch.ones(1, 3), "topr")
    # L = -(1 * -1 * -1.5) / 3 = -0.5; grad = 1/3 each.
    assert loss.item() == pytest.approx(-0.5, abs=1e-6)
    torch.testing.assert_close(grad_of(loss, logp), torch.full((1, 3), 1 / 3))
    assert stats["neg_weight_mean"] == 1.0 and stats["clip_frac"] == 0.0


def test_topr_positive_gradient_does_not_depend_on_behaviour() -> None:
    mask = torch.tensor([[1, 1, 1, 0]])
    grads = []
    for anchor in ([[-0.1, -0.2, -0.3, 0.0]], [[-9.0, -0.01, -4.0, 0.0]]):
        logp = leaf([[-1.0, -0.7, -2.0, -3.0]])
        loss, _ = policy_loss(logp, torch.tensor(anchor), torch.tensor([0.8]), mask, "topr")
        grads.append(grad_of(loss, logp))
    # Both equal -A / len = -0.8 / 3 on the three tokens, 0 on padding.
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=0)
    torch.testing.assert_close(grads[0], torch.tensor([[-0.8 / 3] * 3 + [0.0]]))


@pytest.mark.parametrize("length_norm", [False, True])
def test_topr_negative_weight_bounded_and_vanishes(length_norm: bool) -> None:
    # Policy moves away from a negative sample: logp = anchor + delta per token, 2 tokens.
    anchor = torch.tensor([[-1.0, -2.0]])
    mask = torch.ones(1, 2)
    adv = torch.tensor([-1.5])
    weights = []
    for delta in [3.0, 1.0, 0.0, -0.5, -2.0, -10.0, -50.0]:
        logp = (anchor + delta).requires_grad_(True)
        w = float(tapered_weights(logp, anchor, mask, length_norm=length_norm)[0])
        loss, _ = policy_loss(logp, anchor, adv, mask, "topr", length_norm=length_norm)
        g = grad_of(loss, logp)
        # grad per token = -w * A / len = 1.5 w / 2 <= 0.75.
        torch.testing.assert_close(g, torch.full((1, 2), 0.75 * w))
        assert 0.0 <= w <= 1.0
        clamped = max(-MAX_LOG_RATIO, min(MAX_LOG_RATIO, delta))  # each token's log-ratio is clamped
        log_ratio = 2 * clamped if not length_norm else clamped
        assert w == pytest.approx(math.exp(min(0.0, log_ratio)), rel=1e-5, abs=1e-30)
        weights.append(w)
    assert weights[:3] == [1.0, 1.0, 1.0]
    assert all(a >= b for a, b in zip(weights, weights[1:]))  # non-increasing as it leaves
    assert weights[-1] < 1e-8


def test_tapered_weights_are_detached() -> None:
    logp = leaf([[-1.0, -1.0]])
    w = tapered_weights(logp, torch.tensor([[-0.5, -0.5]]), torch.ones(1, 2))
    assert not w.requires_grad
    assert float(w[0]) == pytest.approx(math.exp(-1.0), abs=1e-6)


# --- REC one-side and PPO-clip ------------------------------------------------------------------------
# One sequence of 4 tokens, anchor -1 everywhere, token ratios rho = [0.5, 0.9, 1.1, 1.5]
# (logp = -1 + log rho). Clip range [1 - 0.2, 1 + 0.28] = [0.8, 1.28].

RHO = [0.5, 0.9, 1.1, 1.5]
CLIP_LOGP = [[-1.0 + math.log(r) for r in RHO]]
CLIP_ANCHOR = torch.full((1, 4), -1.0)
ONE_MASK = torch.ones(1, 4)


def test_rec_positive_drops_tokens_above_one_plus_eps_high() -> None:
    # A = +1: keep rho <= 1.28 -> tokens 0, 1, 2 kept, token 3 dropped.
    # L = -1 * (logp_0 + logp_1 + logp_2) / 4; grad -0.25 on kept tokens.
    logp = leaf(CLIP_LOGP)
    loss, stats = policy_loss(logp, CLIP_ANCHOR, torch.tensor([1.0]), ONE_MASK, "rec")
    expected = -(CLIP_LOGP[0][0] + CLIP_LOGP[0][1] + CLIP_LOGP[0][2]) / 4  # 3.703198 / 4 = 0.9257995
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert loss.item() == pytest.approx(0.9257995, abs=1e-6)
    torch.testing.assert_close(grad_of(loss, logp), torch.tensor([[-0.25, -0.25, -0.25, 0.0]]))
    assert stats["clip_frac"] == pytest.approx(0.25)


def test_rec_negative_drops_tokens_below_one_minus_eps_low() -> None:
    # A = -1: keep rho >= 0.8 -> token 0 dropped, tokens 1, 2, 3 kept.
    # L = +1 * (logp_1 + logp_2 + logp_3) / 4 = -2.604586 / 4 = -0.6511465; grad +0.25 on kept.
    logp = leaf(CLIP_LOGP)
    loss, stats = policy_loss(logp, CLIP_ANCHOR, torch.tensor([-1.0]), ONE_MASK, "rec")
    assert loss.item() == pytest.approx(-0.6511465, abs=1e-6)
    torch.testing.assert_close(grad_of(loss, logp), torch.tensor([[0.0, 0.25, 0.25, 0.25]]))
    assert stats["clip_frac"] == pytest.approx(0.25)
    # Custom range: eps_low = 0.05 -> keep rho >= 0.95: only tokens 2 and 3.
    logp = leaf(CLIP_LOGP)
    loss, _ = policy_loss(logp, CLIP_ANCHOR, torch.tensor([-1.0]), ONE_MASK, "rec", eps_low=0.05)
    torch.testing.assert_close(grad_of(loss, logp), torch.tensor([[0.0, 0.0, 0.25, 0.25]]))


def test_ppo_clip_positive_advantage() -> None:
    # A = +1: min(rho, clip(rho)) = [0.5, 0.9, 1.1, 1.28]; L = -(0.5 + 0.9 + 1.1 + 1.28) / 4 = -0.945.
    # d(-min)/dlogp = -rho where the unclipped term is the min, 0 where clipped (token 3): grad / 4.
    logp = leaf(CLIP_LOGP)
    loss, stats = policy_loss(logp, CLIP_ANCHOR, torch.tensor([1.0]), ONE_MASK, "grpo")
    assert loss.item() == pytest.approx(-0.945, abs=1e-6)
    torch.testing.assert_close(grad_of(loss, logp), torch.tensor([[-0.5, -0.9, -1.1, 0.0]]) / 4)
    assert stats["clip_frac"] == pytest.approx(0.25)


def test_ppo_clip_negative_advantage() -> None:
    # A = -1: min(-rho, -clip(rho)) = -max(rho, clip(rho)) = -[0.8, 0.9, 1.1, 1.5];
    # L = (0.8 + 0.9 + 1.1 + 1.5) / 4 = 1.075. Token 0 is clipped (gradient 0), others +rho / 4.
    logp = leaf(CLIP_LOGP)
    loss, stats = policy_loss(logp, CLIP_ANCHOR, torch.tensor([-1.0]), ONE_MASK, "grpo")
    assert loss.item() == pytest.approx(1.075, abs=1e-6)
    torch.testing.assert_close(grad_of(loss, logp), torch.tensor([[0.0, 0.9, 1.1, 1.5]]) / 4)
    assert stats["clip_frac"] == pytest.approx(0.25)


def test_ppo_clip_at_ratio_one_is_reinforce_gradient() -> None:
    # On-policy (anchor = logp): rho = 1, gradient of -rho*A = -A per token, same as REINFORCE.
    logp = leaf([[-0.3, -1.2, -0.7]])
    adv = torch.tensor([0.6])
    loss, _ = policy_loss(logp, logp.detach(), adv, torch.ones(1, 3), "grpo")
    assert loss.item() == pytest.approx(-0.6, abs=1e-6)  # -(1 * 0.6 * 3) / 3
    torch.testing.assert_close(grad_of(loss, logp), torch.full((1, 3), -0.2))


# --- REINFORCE and aggregation ------------------------------------------------------------------------


def test_reinforce_and_aggregation_with_empty_sequence() -> None:
    # Seq 0: A = 2, logp [-1, -3] -> L_0 = -2 * -4 / 2 = 4.
    # Seq 1: empty mask (and -inf padding) -> not counted.
    # Seq 2: A = -1, logp [-0.5] + padding -> L_2 = 1 * -0.5 / 1 = -0.5.
    # loss = (4 - 0.5) / 2 = 1.75; grads: seq 0: -2/2/2 = -0.5; seq 2: 1/1/2 = 0.5.
    logp = leaf([[-1.0, -3.0], [NEG_INF, NEG_INF], [-0.5, NEG_INF]])
    anchor = torch.tensor([[-1.0, -3.0], [NEG_INF, NEG_INF], [-0.5, NEG_INF]])
    mask = torch.tensor([[True, True], [False, False], [True, False]])
    adv = torch.tensor([2.0, 3.0, -1.0])
    loss, stats = policy_loss(logp, anchor, adv, mask, "reinforce")
    assert loss.item() == pytest.approx(1.75)
    torch.testing.assert_close(grad_of(loss, logp), torch.tensor([[-0.5, -0.5], [0.0, 0.0], [0.5, 0.0]]))
    assert stats["n_sequences"] == 2 and stats["n_tokens"] == 3
    per_seq = sequence_surrogate(logp, anchor, adv, mask, "reinforce")
    torch.testing.assert_close(per_seq, torch.tensor([4.0, 0.0, -0.5]))


@pytest.mark.parametrize("kind", ["topr", "rec", "grpo", "reinforce"])
def test_empty_masks_give_zero_loss_with_grad(kind: str) -> None:
    logp = leaf([[NEG_INF, -1.0], [NEG_INF, NEG_INF]])
    anchor = torch.tensor([[NEG_INF, -2.0], [NEG_INF, NEG_INF]])
    loss, stats = policy_loss(logp, anchor, torch.tensor([1.0, -1.0]), torch.zeros(2, 2), kind)  # type: ignore[arg-type]
    assert loss.item() == 0.0 and loss.grad_fn is not None
    g = grad_of(loss, logp)
    assert torch.equal(g, torch.zeros(2, 2))
    assert stats["n_sequences"] == 0 and all(math.isfinite(v) for v in stats.values())


@pytest.mark.parametrize("kind", ["topr", "rec", "grpo", "reinforce"])
def test_all_kinds_share_the_on_policy_gradient(kind: str) -> None:
    # With anchor = logp every ratio is 1: no taper, no clip, so all four kinds have REINFORCE's
    # gradient (PPO's value differs, -A * rho instead of -A * logp, but d rho / d logp = rho = 1).
    logp = leaf([[-0.2, -0.4, -0.6], [-1.0, -1.0, -1.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv = torch.tensor([0.5, -0.25])
    loss, stats = policy_loss(logp, logp.detach(), adv, mask, kind)  # type: ignore[arg-type]
    # grad = -A / len / B: seq 0: -0.5/3/2 = -1/12; seq 1: 0.25/2/2 = 1/16 on two tokens.
    expected = torch.tensor([[-1 / 12] * 3, [1 / 16, 1 / 16, 0.0]])
    torch.testing.assert_close(grad_of(loss, logp), expected)
    assert stats["ratio_mean"] == pytest.approx(1.0) and stats["clip_frac"] == 0.0


def test_loss_is_differentiable_only_through_logprobs() -> None:
    logp = leaf([[-1.0, -2.0]])
    anchor = torch.tensor([[-1.5, -1.0]], requires_grad=True)
    adv = torch.tensor([-1.0], requires_grad=True)
    for kind in ("topr", "rec", "grpo", "reinforce"):
        loss, _ = policy_loss(logp, anchor, adv, torch.ones(1, 2), kind)
        g_logp, g_anchor, g_adv = torch.autograd.grad(loss, [logp, anchor, adv], allow_unused=True)
        assert g_logp is not None
        assert g_anchor is None and g_adv is None


def test_bad_inputs_raise() -> None:
    logp = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="unknown loss kind"):
        policy_loss(logp, logp, torch.zeros(2), torch.ones(2, 3), "ppo")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="same shape"):
        policy_loss(logp, torch.zeros(2, 4), torch.zeros(2), torch.ones(2, 3), "topr")
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(logp, logp, torch.zeros(3), torch.ones(2, 3), "topr")


# --- bounded per-sequence values (ReMix router) -------------------------------------------------------


def test_sequence_values_bounded_for_negatives() -> None:
    # Positive (A = 1, logp [-1, -2]): its own surrogate, -1 * -3 / 2 = 1.5 (REC drops token 0, whose
    # ratio exp(0.5) = 1.65 > 1.28, so -1 * -2 / 2 = 1.0).
    # Negative (A = -2, log-ratio sum -0.1): |A| * w = 2 * exp(-0.1) = 1.809675, not 2 * -1.5 / 3 = -1.
    logp = leaf(TOPR_LOGP)
    anchor = torch.tensor(TOPR_ANCHOR)
    for kind, positive in (("topr", 1.5), ("rec", 1.0), ("reinforce", 1.5)):
        values = sequence_values(logp, anchor, TOPR_ADV, TOPR_MASK, kind)  # type: ignore[arg-type]
        assert not values.requires_grad
        torch.testing.assert_close(values, torch.tensor([positive, 2 * math.exp(-0.1)]))
    # A negative the policy has left (log-ratio -40 per token, clamped to -20) is worth ~0: 2 * exp(-40),
    # never unboundedly negative.
    far = torch.tensor([[-41.0, -42.0]])
    values = sequence_values(
        far, torch.tensor([[-1.0, -2.0]]), torch.tensor([-2.0]), torch.ones(1, 2), "topr"
    )
    assert float(values[0]) == pytest.approx(2 * math.exp(-2 * MAX_LOG_RATIO), rel=1e-5)
    # PPO's value is already bounded below: |A| * mean max(rho, clip(rho)) = 1 * 1.075 (see above).
    values = sequence_values(leaf(CLIP_LOGP), CLIP_ANCHOR, torch.tensor([-1.0]), ONE_MASK, "grpo")
    torch.testing.assert_close(values, torch.tensor([1.075]))


# --- peers' absurd behaviour log-probs -------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["topr", "rec", "grpo", "reinforce"])
@pytest.mark.parametrize("anchor_value", [-3e38, 3e38, float("nan")])
def test_every_loss_stays_finite_whatever_the_behaviour_logprobs(kind: str, anchor_value: float) -> None:
    """A log-ratio against -3e38 (a finite float32) overflowed exp() in GRPO and tapered weights; every
    token log-ratio is clamped to +-MAX_LOG_RATIO, so loss and gradient stay finite in every loss."""
    logp = leaf([[-1.0, -2.0], [-0.5, -0.25]])
    anchor = torch.tensor([[anchor_value, -2.0], [anchor_value, anchor_value]])
    for adv in ([1.0, -1.0], [-1.0, 1.0]):
        loss, stats = policy_loss(logp, anchor, torch.tensor(adv), torch.ones(2, 2), kind)  # type: ignore[arg-type]
        grad = grad_of(loss, logp)
        assert math.isfinite(float(loss)) and bool(torch.isfinite(grad).all())
        assert all(math.isfinite(v) for v in stats.values())
        assert stats["ratio_max"] <= math.exp(MAX_LOG_RATIO) * (1 + 1e-6)


def test_engine_mismatch_weights_by_hand() -> None:
    logp = leaf([[-1.0, -2.0, -0.1], [-3.0, NEG_INF, NEG_INF]])
    behaviour = torch.tensor([[-1.5, -1.0, -1.5], [-3.0, -9.0, NEG_INF]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    w = engine_mismatch_weights(logp, behaviour, mask, cap=2.0)
    # d = logp - behaviour: [0.5, -1.0, 1.4] -> exp [1.6487, 0.3679, 4.055 -> capped 2]; row 2: [0 -> 1, pads 1]
    expected = torch.tensor([[math.exp(0.5), math.exp(-1.0), 2.0], [1.0, 1.0, 1.0]])
    assert torch.allclose(w, expected, atol=1e-6) and not w.requires_grad


def test_the_off_policy_correction_by_hand() -> None:
    """The one correction both training paths apply (``Trainer._off_policy``). Mutations caught: a peer row
    weighted or re-anchored by the engine cap, an own row keeping its recorded anchor under the cap, the
    correction left on when it is switched off."""
    logp = leaf([[-1.0, -2.0], [-0.5, -4.0]])
    recorded = torch.tensor([[-1.5, -1.0], [-0.1, -3.0]])
    mask = torch.tensor([[1, 1], [1, 1]])
    own = torch.tensor([True, False])
    anchor, weights = off_policy_anchor(logp, recorded, mask, own)  # no engine: the recorded log-probs, no weight
    assert weights is None and torch.equal(anchor, recorded)
    anchor, weights = off_policy_anchor(logp, recorded, mask, own, engine_is_cap=2.0)
    assert weights is not None
    # own row: min(exp(logp - recorded), 2) = [exp(0.5), exp(-1)], anchored at its own log-probs; peer row: 1, kept
    assert torch.allclose(weights, torch.tensor([[math.exp(0.5), math.exp(-1.0)], [1.0, 1.0]]), atol=1e-6)
    assert torch.equal(anchor, torch.tensor([[-1.0, -2.0], [-0.1, -3.0]])) and not anchor.requires_grad
    anchor, weights = off_policy_anchor(logp, recorded, mask, own, correct=False, engine_is_cap=2.0)
    assert weights is None and torch.equal(anchor, logp.detach())


def test_token_weights_scale_each_token_s_surrogate_by_hand() -> None:
    logp = leaf([[-1.0, -3.0]])
    weights = torch.tensor([[2.0, 0.5]])
    loss, _ = policy_loss(logp, logp.detach(), torch.tensor([1.0]), torch.tensor([[1, 1]]), "reinforce",
                          token_weights=weights)
    # -A * mean_t(w_t * logp_t) = -(2 * -1 + 0.5 * -3) / 2 = 1.75
    assert loss.item() == pytest.approx(1.75)
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-1.0, -0.25]]))  # d/dlogp: -A * w_t / 2
