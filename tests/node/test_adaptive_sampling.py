"""Reinforce-Ada adaptive sampling: rounds until a task is balanced (or has a positive), then downsampling."""

from __future__ import annotations

import pytest
import torch

from node.generation.base import SamplingSettings
from node.generation.rollouts import _downsample, sample_groups_adaptive
from node.run.node import Node


def test_downsample_takes_half_positives_and_half_negatives_where_possible():
    gen = torch.Generator().manual_seed(0)
    rewards = [1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    kept = _downsample(list(range(10)), rewards, 4, gen)
    assert len(kept) == 4 and sum(rewards[i] for i in kept) == 2.0
    # Only one negative available: the rest are positives.
    kept = _downsample([0, 1, 2, 3, 5], rewards, 4, gen)
    assert len(kept) == 4 and [rewards[i] for i in kept].count(0.0) == 1


def test_adaptive_groups_have_group_size_completions_and_remember_every_reward(fast_config):
    cfg = fast_config("sampling.mode=ada_balanced", "sampling.round_size=4", "sampling.max_rounds=3",
                      "generation.group_size=4")
    node = Node(cfg, cfg.run_dir, show_progress=False)
    node.setup()
    tasks = [node.source.task(r) for r in node.source.sample(6, node.task_rng)]
    groups = sample_groups_adaptive(node.generator, node.policy, node.source, tasks, group_size=4, round_size=4,
                                    max_rounds=3, mode="ada_balanced", settings=SamplingSettings(max_new_tokens=5),
                                    generator=node.sample_gen)
    node.close()
    assert len(groups) == 6
    for sg in groups:
        g = sg.group
        assert len(g.completions) == len(g.rewards) == len(sg.texts) == 4
        drawn = g.all_rewards
        assert drawn is not None and len(drawn) in (4, 8, 12)  # whole rounds of 4
        n_pos = sum(r >= 1.0 for r in drawn)  # positive: reward at least the threshold (1.0)
        balanced = n_pos >= 2 and len(drawn) - n_pos >= 2
        # A task stops drawing as soon as it is balanced, so only the last round may have balanced it.
        assert balanced or len(drawn) == 12
        if balanced:
            assert sum(r >= 1.0 for r in g.rewards) == 2


def test_a_node_step_runs_with_positive_focused_sampling(fast_config, monkeypatch):
    cfg = fast_config("sampling.mode=ada_positive", "train.steps=1", "train.advantage=global")
    node = Node(cfg, cfg.run_dir, show_progress=False)
    node.setup()
    sampled = []

    def recording(*args, **kwargs):
        sampled.extend(sample_groups_adaptive(*args, **kwargs))
        return sampled

    monkeypatch.setattr("node.run.node.sample_groups_adaptive", recording)
    record = node.train_step()
    node.close()
    drawn = [r for sg in sampled for r in sg.group.all_rewards]
    m = cfg.sampling.round_size
    assert len(sampled) == cfg.sapo.local_groups and len(drawn) >= m * cfg.sapo.local_groups
    # ada_positive: a task stops drawing at its first positive, so only a task's last round may hold one.
    for sg in sampled:
        rounds = [sg.group.all_rewards[i : i + m] for i in range(0, len(sg.group.all_rewards), m)]
        assert all(max(r) == 0.0 for r in rounds[:-1])
    # The logged reward is the mean of every completion drawn, not only of those trained on.
    assert record["reward_mean"] == pytest.approx(sum(drawn) / len(drawn))
    assert record["n_local_groups"] == sum(1 for sg in sampled if len(set(sg.group.all_rewards)) > 1)


def test_partial_credit_is_negative_below_the_positive_threshold():
    """reasoning-gym gives partial credit (e.g. 0.5 for a near miss): with the default threshold 1.0 only a
    fully correct completion is positive; a threshold of 0.5 counts the near misses as positives."""
    rewards = [1.0, 0.5, 0.5, 0.5, 0.0, 0.0]
    strict = _downsample(list(range(6)), rewards, 4, torch.Generator().manual_seed(0))
    assert [rewards[i] for i in strict].count(1.0) == 1  # the one full positive, then 3 "negatives"
    lenient = _downsample(list(range(6)), rewards, 4, torch.Generator().manual_seed(0), positive_threshold=0.5)
    assert sum(rewards[i] >= 0.5 for i in lenient) == 2 and sum(rewards[i] == 0.0 for i in lenient) == 2
