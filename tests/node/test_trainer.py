from __future__ import annotations

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
