from __future__ import annotations

import math

import pytest
import torch

from node.train.groups import TrainGroup, assign_advantages


def _group(rewards, peer=""):
    return TrainGroup(key="k", peer_id=peer, epoch=0, prompt_ids=[1], completions=[[2]] * len(rewards),
                      anchor_logprobs=[[-1.0]] * len(rewards), rewards=rewards)


def test_uniform_groups_are_dropped_even_with_an_external_shift():
    local_flat, peer_flat, peer_mixed = _group([0.0, 0.0]), _group([0.0, 0.0, 0.0], "p"), _group([1.0, 0.0], "p")
    kept = assign_advantages([local_flat, peer_flat, peer_mixed], "rloo", external_shift=0.1)
    assert kept == [peer_mixed]
    # RLOO with the baseline lowered by 0.1: A = r - (other - 0.1) -> [1 - (0 - 0.1), 0 - (1 - 0.1)] = [1.1, -0.9]
    assert torch.allclose(peer_mixed.advantages, torch.tensor([1.1, -0.9]))


def test_a_peer_group_of_equal_partial_rewards_is_dropped():
    """Eight completions with the same partial credit (1/3: gcd, spell_backward) gave RLOO advantages of
    about 3e-8 in float32, so the group passed as one with signal although ingestion had not anchored it (it
    anchors only groups whose rewards differ), and the step failed on its missing anchors."""
    for kind in ("rloo", "grpo"):
        flat = _group([1 / 3] * 8, "p")
        flat.anchor_logprobs = [[]] * 8  # as ingestion leaves a re-tokenized group it did not anchor
        assert assign_advantages([flat, _group([0.9] * 8)], kind, external_shift=0.0) == [], kind


def test_a_completion_without_its_anchors_is_an_error_not_a_padded_row():
    _, trainer = _tiny_trainer("topr")
    g = _peer_group(-1.0)
    g.anchor_logprobs[0] = g.anchor_logprobs[0][:1]
    with pytest.raises(ValueError, match="3 tokens has 1 anchor log-probs"):
        trainer.step([g])


def test_global_baseline_uses_every_reward_drawn():
    g = _group([1.0, 1.0])
    g.all_rewards = [1.0, 1.0, 0.0, 0.0]  # baseline 0.5: a group of two positives still carries signal
    (kept,) = assign_advantages([g], "global")
    assert torch.allclose(kept.advantages, torch.tensor([0.5, 0.5]))


def test_reinforce_ada_groups_use_the_mean_of_every_draw_whatever_the_advantage_kind():
    """The balanced downsample's own mean is about 0.5 whatever the pass rate; the baseline must be the
    mean of all draws (ALGORITHMS.md): here 2 right of 8 drawn, so 0.25, and GRPO's std is not applied."""
    for kind in ("rloo", "grpo", "global"):
        g = _group([1.0, 1.0, 0.0, 0.0])
        g.all_rewards = [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
        (kept,) = assign_advantages([g], kind)
        assert torch.allclose(kept.advantages, torch.tensor([0.75, 0.75, -0.25, -0.25])), kind
    plain = _group([1.0, 0.0])  # no record of other draws: the configured kind
    (kept,) = assign_advantages([plain], "rloo")
    assert torch.allclose(kept.advantages, torch.tensor([1.0, -1.0]))


def _tiny_trainer(loss: str = "grpo", policy=None, **options):
    from node.config import AdapterConfig, ModelConfig
    from node.policy.model import build_policy
    from node.train.trainer import Trainer

    policy = policy or build_policy(ModelConfig(device="cpu"), AdapterConfig(), seed=0)
    return policy, Trainer(policy, lr=1e-2, norm_lr=1e-2, router_lr=1e-2, weight_decay=0.0, max_grad_norm=1.0,
                           loss=loss, eps_low=0.2, eps_high=0.28, length_norm=False, micro_batch_size=8,
                           temperature=1.0, **options)


def _peer_group(anchor: float) -> TrainGroup:
    g = TrainGroup(key="k", peer_id="p", epoch=0, prompt_ids=[1, 4, 5], completions=[[6, 7, 2], [8, 2]],
                   anchor_logprobs=[[anchor, -1.0, -1.0], [anchor, -1.0]], rewards=[1.0, 0.0])
    (kept,) = assign_advantages([g], "rloo")
    return kept


def test_a_step_against_absurd_behaviour_logprobs_is_finite():
    """With ``train.loss=grpo``, behaviour log-probs of -3e38 made one step turn every parameter non-finite."""
    policy, trainer = _tiny_trainer("grpo")
    before = {k: v.clone() for k, v in policy.trainable_state().items()}
    stats = trainer.step([_peer_group(-3e38)])
    after = policy.trainable_state()
    assert stats["skipped_steps"] == 0.0 and stats["grad_norm"] > 0
    assert all(torch.isfinite(v).all() for v in after.values())
    assert any(not torch.equal(before[k], after[k]) for k in after)


@pytest.mark.parametrize("fused", [True, False])
def test_a_step_with_a_non_finite_gradient_is_skipped_and_counted(fused):
    policy, trainer = _tiny_trainer("topr", fused=fused)
    before = {k: v.clone() for k, v in policy.trainable_state().items()}
    if fused:  # the fused pass writes the adapters' gradients itself: poison what flows into it
        assert trainer.fused is not None
        pass_logprobs = trainer.fused.logprobs

        def poisoned(*args, **kwargs):
            out = pass_logprobs(*args, **kwargs)
            out.register_hook(lambda grad: grad * float("nan"))
            return out

        trainer.fused.logprobs = poisoned  # type: ignore[method-assign]
        stats = trainer.step([_peer_group(-1.0)])
        trainer.fused.logprobs = pass_logprobs  # type: ignore[method-assign]
    else:
        assert trainer.fused is None
        param = next(p for p in policy.model.parameters() if p.requires_grad)
        handle = param.register_hook(lambda grad: grad * float("nan"))
        try:
            stats = trainer.step([_peer_group(-1.0)])
        finally:
            handle.remove()
    assert stats["skipped_steps"] == 1.0 and trainer.skipped_steps == 1 and stats["grad_norm"] == 0.0
    after = policy.trainable_state()
    assert all(torch.equal(before[k], after[k]) for k in after)  # nothing applied
    assert not trainer.optimizer.state  # not even the optimizer's moments
    assert trainer.step([_peer_group(-1.0)])["skipped_steps"] == 1.0  # the next step is applied
    assert any(not torch.equal(before[k], v) for k, v in policy.trainable_state().items())


def _own_group(trainer, behaviour_shift: float, rewards=(1.0, 1.0, 0.0)) -> TrainGroup:
    """The node's own group whose behaviour log-probs are the trainer's own plus ``behaviour_shift`` a token
    (what an engine that rounds differently reports)."""
    from node.policy.logprobs import right_pad, shared_prompt_logprobs

    completions = [[6, 7, 2], [8, 2], [9, 10, 11, 2]][: len(rewards)]
    prompt = [1, 4, 5]
    c_ids, c_mask = right_pad(completions, 0, torch.long)
    with torch.no_grad():  # computed as the trainer computes them, so a shift of 0 is a ratio of exactly 1
        if trainer.fused is not None:
            lps = trainer.fused.logprobs([prompt] * len(completions), completions, pad_id=0)
        else:
            lps = shared_prompt_logprobs(trainer.policy.model, [prompt] * len(completions), c_ids, c_mask, pad_id=0)
    behaviour = [[float(x) + behaviour_shift for x in lps[i, : len(c)]] for i, c in enumerate(completions)]
    g = TrainGroup(key="k", peer_id="", epoch=0, prompt_ids=prompt, completions=completions,
                   anchor_logprobs=behaviour, rewards=list(rewards))
    (kept,) = assign_advantages([g], "rloo")
    return kept


@pytest.mark.parametrize("fused", [True, False])
def test_the_engine_mismatch_correction_weights_own_tokens_by_the_capped_trainer_engine_ratio(fused: bool):
    """``train.engine_is_cap``: an engine that puts every sampled token at a quarter of the trainer's
    probability gives a ratio of 4 a token, capped at 2, so a positives-only TOPR loss doubles; an engine
    that agrees with the trainer changes nothing; a peer's group is left as it was. On both training paths
    (the fused pass and the modules'), which share one correction."""
    from node.train.trainer import Trainer

    def loss_of(cap: float | None, shift: float, peer: str = "") -> float:
        policy, _ = _tiny_trainer("topr")
        trainer = Trainer(policy, lr=1e-2, norm_lr=1e-2, router_lr=1e-2, weight_decay=0.0, max_grad_norm=1.0,
                          loss="topr", eps_low=0.2, eps_high=0.28, length_norm=False, micro_batch_size=8,
                          temperature=1.0, engine_is_cap=cap, fused=fused)
        assert (trainer.fused is not None) == fused
        group = _own_group(trainer, shift, rewards=(1.0, 0.0))
        group.peer_id = peer
        group.advantages = torch.tensor([1.0, 0.5])  # positives only: TOPR's weight is 1 without correction
        return trainer.step([group])["loss"]

    plain = loss_of(None, -1.3862943611198906)  # log(1/4)
    assert loss_of(2.0, -1.3862943611198906) == pytest.approx(2 * plain, rel=1e-5)
    assert loss_of(8.0, -1.3862943611198906) == pytest.approx(4 * plain, rel=1e-5)
    assert loss_of(2.0, 0.0) == pytest.approx(loss_of(None, 0.0), rel=1e-6)
    assert loss_of(2.0, -1.3862943611198906, peer="p") == pytest.approx(plain, rel=1e-6)


def test_with_the_correction_an_own_negative_is_not_tapered_by_the_engine_gap():
    """Without it, an engine that gives a sampled negative more probability than the trainer does shrinks
    its TOPR weight exp(sum(log pi - log mu)) below 1; with it, the ratio to the trainer's own log-probs
    is 1 and only the capped per-token weight (here exp(-0.5) a token) applies."""
    from node.train.trainer import Trainer

    def loss_of(cap: float | None) -> float:
        policy, _ = _tiny_trainer("topr")
        trainer = Trainer(policy, lr=1e-2, norm_lr=1e-2, router_lr=1e-2, weight_decay=0.0, max_grad_norm=1.0,
                          loss="topr", eps_low=0.2, eps_high=0.28, length_norm=False, micro_batch_size=8,
                          temperature=1.0, engine_is_cap=cap)
        group = _own_group(trainer, 0.5, rewards=(1.0, 0.0))
        group.advantages = torch.tensor([0.0, -1.0])  # one negative of two tokens
        return trainer.step([group])["loss"]

    # The negative's surrogate: -w * A * mean_t(logp_t) with A = -1. Uncorrected, w = exp(2 x -0.5) = e^-1
    # (a sequence-level taper); corrected, each token's weight is e^-0.5: the same mean over two tokens
    # times e^-0.5 instead of e^-1.
    assert loss_of(2.0) == pytest.approx(loss_of(None) * math.exp(0.5), rel=1e-5)


def _lever_trainer(**options):
    """A tiny-base trainer with plain REINFORCE and no clipping in reach, and the gradients of every update
    it applies (recorded just before each optimizer step)."""
    from node.config import AdapterConfig, ModelConfig
    from node.policy.model import build_policy
    from node.train.trainer import Trainer

    policy = build_policy(ModelConfig(device="cpu"), AdapterConfig(), seed=0)
    trainer = Trainer(policy, lr=1e-2, norm_lr=1e-2, router_lr=1e-2, weight_decay=0.0, max_grad_norm=1e9,
                      loss="reinforce", eps_low=0.2, eps_high=0.28, length_norm=False, micro_batch_size=8,
                      temperature=1.0, **options)
    grads: list[list[torch.Tensor]] = []
    step = trainer.optimizer.step

    def recording_step(*args, **kwargs):
        grads.append([p.grad.clone() for p in trainer._params() if p.grad is not None])
        return step(*args, **kwargs)

    trainer.optimizer.step = recording_step
    return policy, trainer, grads


def _four_rows(keep=(0, 1, 2, 3)) -> TrainGroup:
    completions = [[6, 7, 2], [8, 2], [9, 2], [10, 11, 2]]
    advantages = [1.0, -1.0, 0.5, -0.5]
    g = TrainGroup(key="k", peer_id="", epoch=0, prompt_ids=[1, 4, 5], completions=[completions[i] for i in keep],
                   anchor_logprobs=[[-1.0] * len(completions[i]) for i in keep], rewards=[0.0] * len(keep))
    g.advantages = torch.tensor([advantages[i] for i in keep])
    return g


def test_a_fixed_loss_denominator_scales_the_gradient_by_the_sequences_trained_on():
    """``train.loss_denominator=fixed``: the loss is the sum of the per-sequence surrogates over a fixed count
    (here 8) instead of their mean over the 4 trained on, so the gradient is 4/8 of the batch mean's."""
    _, batch, batch_grads = _lever_trainer()
    _, fixed, fixed_grads = _lever_trainer(loss_denominator=8)
    batch.step([_four_rows()])
    fixed.step([_four_rows()])
    for a, b in zip(batch_grads[0], fixed_grads[0], strict=True):
        assert torch.allclose(b, a * 4 / 8, atol=1e-8, rtol=1e-5)
    assert any(a.abs().max() > 0 for a in batch_grads[0])


def test_two_optimizer_steps_update_on_alternate_rows_one_after_the_other():
    """``train.optimizer_steps=2``: rows 0 and 2 make the first update (the same gradient as a step on those
    two alone), rows 1 and 3 a second one from the updated weights."""
    policy, two, two_grads = _lever_trainer(optimizer_steps=2)
    alone_policy, alone, alone_grads = _lever_trainer()
    stats = two.step([_four_rows()])
    alone.step([_four_rows(keep=(0, 2))])
    assert len(two_grads) == 2 and stats["optimizer_steps"] == 2.0 and stats["n_sequences"] == 4.0
    for a, b in zip(alone_grads[0], two_grads[0], strict=True):
        assert torch.allclose(a, b, atol=1e-7)
    after_one = alone_policy.trainable_state()
    after_two = policy.trainable_state()
    assert any(not torch.allclose(after_one[k], after_two[k]) for k in after_one)  # the second update moved on
    with pytest.raises(ValueError, match="optimizer_steps"):
        _lever_trainer(optimizer_steps=0)


def _twin_groups(peer_rewards: list[float]) -> list[TrainGroup]:
    """One own group and one peer group of the same completions and anchors; the peer's rewards given."""
    own, peer = (TrainGroup(key="k", peer_id=p, epoch=0, prompt_ids=[1, 4, 5], completions=[[6, 7, 2], [8, 2]],
                            anchor_logprobs=[[-1.0, -1.0, -1.0], [-1.0, -1.0]], rewards=r)
                 for p, r in (("", [1.0, 0.0]), ("p", peer_rewards)))
    return assign_advantages([own, peer], "rloo")


def test_the_alignment_of_own_and_peer_gradients_is_their_cosine_and_leaves_the_update_unchanged():
    """A peer group that is the own group's twin has the same gradient (cosine 1); with its rewards swapped
    under plain REINFORCE, the opposite one (cosine -1). Measuring splits the accumulation in two parts and
    changes nothing in the step but the order of a sum: the same update up to float rounding. Both updates
    are plain SGD here: AdamW's first step divides each gradient entry by its own size, so a near-zero entry
    (two completions' gradients cancelling) can flip sign on a rounding difference, as it did on another
    machine's CPU kernels."""
    def sgd(policy):
        return torch.optim.SGD([{"params": ps, "lr": 1.0, "name": name} for name, ps in policy.param_groups.items()])

    policy, trainer = _tiny_trainer("reinforce")
    trainer.optimizer = sgd(policy)
    start = {k: v.clone() for k, v in policy.trainable_state().items()}
    trainer.measure_alignment = True
    assert trainer.step(_twin_groups([1.0, 0.0]))["peer_alignment"] == pytest.approx(1.0, abs=1e-6)
    measured = {k: v.clone() for k, v in policy.trainable_state().items()}
    assert any(not torch.equal(measured[k], v) for k, v in start.items())  # it did update
    policy.load_trainable_state(start)
    _, plain = _tiny_trainer("reinforce", policy=policy)
    plain.optimizer = sgd(policy)
    assert "peer_alignment" not in plain.step(_twin_groups([1.0, 0.0]))
    for k, v in policy.trainable_state().items():
        torch.testing.assert_close(measured[k] - start[k], v - start[k], atol=1e-6, rtol=1e-5)
    assert trainer.step(_twin_groups([0.0, 1.0]))["peer_alignment"] == pytest.approx(-1.0, abs=1e-6)
    own_only = _twin_groups([1.0, 0.0])[:1]
    assert "peer_alignment" not in trainer.step(own_only)  # one part: nothing to compare


def _screened_group(keep=(0, 1), advantages=(1.0, 0.5)) -> TrainGroup:
    """A peer group of two completions with given advantages."""
    completions = [[6, 7, 2], [8, 9, 2]]
    g = TrainGroup(key="k", peer_id="p", epoch=0, prompt_ids=[1, 4, 5], completions=[completions[i] for i in keep],
                   anchor_logprobs=[[-1.0] * 3 for _ in keep], rewards=[0.0] * len(keep))
    g.advantages = torch.tensor([advantages[i] for i in keep])
    return g


def _row_logprobs(policy, group: TrainGroup) -> torch.Tensor:
    from node.policy.logprobs import right_pad, shared_prompt_logprobs

    ids, mask = right_pad(group.completions, 0, torch.long)
    with torch.no_grad():
        return shared_prompt_logprobs(policy.model, [group.prompt_ids] * len(group.completions), ids, mask, pad_id=0)


@pytest.mark.parametrize("fused", [True, False])
def test_a_peer_row_dropped_by_the_span_bound_is_not_trained_on_and_is_counted(fused):
    """A peer completion whose least plausible span is below the floor contributes no gradient: the step is the
    one on the other completion alone, at its own advantage (1.0: both are pushed up, and no row of the other
    sign takes the dropped one's up); shared among every kept row, it takes the dropped one's too (1.0 + 0.5,
    its group's sum kept). The trainer reports the drop for the author."""
    from node.policy.logprobs import right_pad
    from node.train.screen import PeerScreen, least_plausible_spans

    policy, screened, screened_grads = _lever_trainer(fused=fused)
    assert (screened.fused is not None) == fused  # the fused pass and the modules' path each screen
    lps = _row_logprobs(policy, _screened_group())
    spans = least_plausible_spans(lps, right_pad(_screened_group().completions, 0, torch.long)[1], 2).tolist()
    floor = (spans[0] + spans[1]) / 2 if spans[1] < spans[0] else None
    if floor is None:  # the second row must be the less plausible one for this test: swap roles
        pytest.skip("tiny-base reads row 1 as the more plausible one")
    stats = screened.step([_screened_group()], screen=PeerScreen(token_floor=-1e9, window=2, span_floor=floor))
    _, kept, kept_grads = _lever_trainer(fused=fused)
    kept.step([_screened_group()], screen=PeerScreen(token_floor=-1e9, window=2, span_floor=floor,
                                                     share_dropped="kept"))
    for advantage, grads in ((1.0, screened_grads), (1.5, kept_grads)):
        _, alone, alone_grads = _lever_trainer(fused=fused)
        alone.step([_screened_group(keep=(0,), advantages=(advantage,))])
        assert alone_grads[0] and len(alone_grads[0]) == len(grads[0])
        for a, b in zip(alone_grads[0], grads[0], strict=True):
            # up to the rounding of a padded batch, which moves an entry near 0 by more than rtol of itself
            # (1.7e-7 of 3.8e-5 on two threads): atol is a millionth of the tensor's largest entry
            assert torch.allclose(a, b, atol=1e-6 * float(b.abs().max()), rtol=1e-3)
    # rows, rows dropped, tokens, tokens masked, tokens pushed up (the kept row's 3), their weights (no floor: 1),
    # rows the span bound held (both: both are pushed up), of those the rows that failed (the dropped one)
    assert screened.screened == {"p": [2, 1, 6, 3, 3, 3.0, 2, 1, 0, 0]} and stats["n_sequences"] == 2.0
    _, plain, plain_grads = _lever_trainer(fused=fused)
    plain.step([_screened_group()])
    assert plain.screened == {} and any(not torch.allclose(a, b, atol=1e-6, rtol=1e-2)
                                        for a, b in zip(alone_grads[0], plain_grads[0]))


@pytest.mark.parametrize("fused", [True, False])
def test_a_group_whose_positive_row_is_dropped_does_not_train_its_negative_alone(fused):
    """A peer group of one pushed-up row and one pushed-down row (+1, -1): the span bound drops the pushed-up
    one, its advantage is shared out, and the pushed-down one is left at 0, so the group moves nothing. Without
    the sharing (``share_dropped`` off) the pushed-down row trains alone."""
    from node.policy.logprobs import right_pad
    from node.train.screen import PeerScreen, least_plausible_spans

    policy, screened, grads = _lever_trainer(fused=fused)
    lps = _row_logprobs(policy, _screened_group())
    spans = least_plausible_spans(lps, right_pad(_screened_group().completions, 0, torch.long)[1], 2).tolist()
    assert spans[0] != spans[1]
    low = 0 if spans[0] < spans[1] else 1  # the less plausible row is the pushed-up one
    advantages = (1.0, -1.0) if low == 0 else (-1.0, 1.0)
    screen = PeerScreen(token_floor=-1e9, window=2, span_floor=sum(spans) / 2)
    screened.step([_screened_group(advantages=advantages)], screen=screen)
    assert screened.screened["p"][:2] == [2, 1]
    assert grads[0] and all(float(g.abs().max()) == 0.0 for g in grads[0])
    _, lost, lost_grads = _lever_trainer(fused=fused)
    lost.step([_screened_group(advantages=advantages)], screen=PeerScreen(
        token_floor=-1e9, window=2, span_floor=sum(spans) / 2, share_dropped=None))
    assert any(float(g.abs().max()) > 0.0 for g in lost_grads[0])


@pytest.mark.parametrize("fused", [True, False])
def test_peer_tokens_below_the_floor_stay_in_the_context_but_out_of_the_loss(fused):
    """The loss of a step with a token floor is the policy loss over the peer tokens at or above it, the
    log-probs computed with every token in the context (a masked token conditions those after it)."""
    from node.policy.logprobs import right_pad
    from node.train.losses import policy_loss
    from node.train.screen import PeerScreen

    policy, trainer, _ = _lever_trainer(fused=fused)
    group = _screened_group()
    lps = _row_logprobs(policy, group)
    _, mask = right_pad(group.completions, 0, torch.long)
    # half the tokens below the floor, which sits halfway between two tokens' log-probs: on a token's own
    # value, which side the trainer's pass puts that token rides on float rounding (the thread count moves it)
    ordered = lps[mask].sort().values
    half = len(ordered) // 2
    assert float(ordered[half] - ordered[half - 1]) > 1e-3
    floor = float(ordered[half - 1] + ordered[half]) / 2
    keep = mask & (lps >= floor)
    assert 0 < int(keep.sum()) < int(mask.sum())
    expected, _ = policy_loss(lps, torch.full_like(lps, -1.0), group.advantages, keep, "reinforce")
    unmasked, _ = policy_loss(lps, torch.full_like(lps, -1.0), group.advantages, mask, "reinforce")
    got = trainer.step([group], screen=PeerScreen(token_floor=floor, window=2))["loss"]
    assert got == pytest.approx(float(expected), rel=1e-5) and abs(float(expected) - float(unmasked)) > 1e-4
    assert trainer.screened["p"][3] == int((mask & ~keep).sum())


@pytest.mark.parametrize("fused", [True, False])
def test_a_positive_peer_token_weighs_in_proportion_to_its_probability_below_the_floor(fused):
    """With a positive floor the step's loss is the policy loss with each token of a pushed-up peer row weighted
    min(1, p / exp(floor)) by hand; a negative row of the same step keeps weight 1; the weights are reported."""
    from node.policy.logprobs import right_pad
    from node.train.losses import policy_loss
    from node.train.screen import PeerScreen

    policy, trainer, _ = _lever_trainer(fused=fused)
    group = _screened_group()
    group.advantages = torch.tensor([1.0, -0.5])
    lps = _row_logprobs(policy, group)
    _, mask = right_pad(group.completions, 0, torch.long)
    floor = float(lps[0][mask[0]].median())  # about half of the positive row's tokens below it
    weights = torch.ones_like(lps)
    weights[0] = torch.exp((lps[0] - floor).clamp(max=0.0))
    assert 0 < int((weights[0][mask[0]] < 1).sum()) < int(mask[0].sum())
    anchors = torch.full_like(lps, -1.0)
    expected, _ = policy_loss(lps, anchors, group.advantages, mask, "reinforce", token_weights=weights)
    unweighted, _ = policy_loss(lps, anchors, group.advantages, mask, "reinforce")
    got = trainer.step([group], screen=PeerScreen(token_floor=-1e9, window=2, positive_floor=floor))["loss"]
    assert got == pytest.approx(float(expected), rel=1e-5) and abs(float(expected) - float(unweighted)) > 1e-4
    rows, _, _, _, pushed, weight, _, failed, _, _ = trainer.screened["p"]
    assert (rows, pushed) == (2, 3) and weight == pytest.approx(float(weights[0][mask[0]].sum()), rel=1e-5)
    assert failed == 0  # weighted, not masked: no bound failed


@pytest.mark.parametrize("fused", [True, False])
def test_the_tokens_of_a_verified_answer_escape_the_floor_and_the_weight(fused):
    """A screen that masks every peer token (floors just below 0) still trains the tokens of a row's verified
    answer (``answer_spans``), at full weight: the loss is the policy loss over those tokens alone."""
    from node.policy.logprobs import right_pad
    from node.train.losses import policy_loss
    from node.train.screen import PeerScreen

    policy, trainer, _ = _lever_trainer(fused=fused)
    group = _screened_group()
    group.answer_spans = [(1, 3), None]
    lps = _row_logprobs(policy, group)
    _, mask = right_pad(group.completions, 0, torch.long)
    verified = torch.zeros_like(mask)
    verified[0, 1:3] = True
    expected, _ = policy_loss(lps, torch.full_like(lps, -1.0), group.advantages, verified, "reinforce")
    got = trainer.step([group], screen=PeerScreen(token_floor=-1e-3, window=2, positive_floor=-1e-3))["loss"]
    assert got == pytest.approx(float(expected), rel=1e-5) and float(expected) != 0.0
    rows, dropped, tokens, masked, pushed, weight, held, failed, _, _ = trainer.screened["p"]
    assert (rows, dropped, tokens, masked, pushed, weight) == (2, 0, 6, 4, 2, 2.0)  # pushed up at weight 1
    assert (held, failed) == (2, 2)  # both pushed up, each with a token below the floor outside its answer


@pytest.mark.parametrize("fused", [True, False])
def test_the_screen_leaves_the_nodes_own_rows_alone(fused):
    from node.train.screen import PeerScreen

    _, screened, screened_grads = _lever_trainer(fused=fused)
    _, plain, plain_grads = _lever_trainer(fused=fused)
    own = _screened_group()
    own.peer_id = ""
    screened.step([own], screen=PeerScreen(token_floor=-0.001, window=2, span_floor=-0.001, positive_floor=-0.001))
    plain.step([own])
    assert screened.screened == {}
    for a, b in zip(screened_grads[0], plain_grads[0], strict=True):
        assert torch.allclose(a, b)
