"""SAPO mixing: I, J, the per-peer cap, the staleness window, never blocking, each policy's order."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest
import torch

from node.train.advantages import rloo_advantages
from node.train.sampler import (
    LOCAL_PEER_ID,
    CandidateGroup,
    mix,
    peer_slots,
    preference_weights,
    select_external,
)

SIGNAL = [1.0, 0.0]  # RLOO advantages [1, -1]
NO_SIGNAL = [1.0, 1.0]  # RLOO advantages [0, 0]


def group(
    key: str, peer: str = "peer-a", epoch: int = 10, rewards: list[float] | None = None
) -> CandidateGroup:
    r = torch.tensor(SIGNAL if rewards is None else rewards)
    return CandidateGroup(
        key=key, peer_id=peer, epoch=epoch, rewards=r, advantages=rloo_advantages(r), payload=key
    )


def keys(groups: list[CandidateGroup]) -> list[str]:
    return [g.key for g in groups]


def select(
    candidates: list[CandidateGroup], j: int, policy: str = "uniform", **kw: object
) -> list[CandidateGroup]:
    args: dict[str, Any] = {
        "max_per_peer": None,
        "current_epoch": 10,
        "staleness_epochs": 2,
        "rng": random.Random(0),
    }
    args.update(kw)
    return select_external(candidates, j, policy, **args)  # type: ignore[arg-type]


def test_candidate_group_helpers() -> None:
    g = CandidateGroup("k", "p", 1, rewards=[1.0, 0.0, 0.5], advantages=[0.0, 0.0, 0.0])
    assert g.mean_reward == pytest.approx(0.5) and not g.has_signal()
    assert group("x").has_signal() and not group("y", rewards=NO_SIGNAL).has_signal()


@pytest.mark.parametrize("policy", ["uniform", "highest_reward", "round_robin"])
def test_staleness_window_and_zero_advantage_groups_are_dropped(policy: str) -> None:
    # current 10, window 2: epochs 8, 9, 10 (and a clock-skewed 11) kept; 7 and 3 dropped.
    candidates = [
        group("e3", epoch=3),
        group("e7", epoch=7),
        group("e8", epoch=8),
        group("e9", epoch=9, peer="peer-b"),
        group("e10", epoch=10, peer="peer-c"),
        group("e11", epoch=11),
        group("flat", epoch=10, rewards=NO_SIGNAL),
        group("zero", epoch=10, rewards=[0.0, 0.0, 0.0]),
    ]
    chosen = select(candidates, 10, policy)
    assert sorted(keys(chosen)) == ["e10", "e11", "e8", "e9"]
    assert sorted(keys(select(candidates, 10, policy, staleness_epochs=0))) == ["e10", "e11"]


@pytest.mark.parametrize("policy", ["uniform", "highest_reward", "round_robin"])
def test_j_limit_and_never_blocks(policy: str) -> None:
    candidates = [group(f"g{n}", peer=f"p{n % 3}") for n in range(7)]
    assert len(select(candidates, 4, policy)) == 4
    assert len(set(keys(select(candidates, 7, policy)))) == 7
    assert len(select(candidates, 20, policy)) == 7  # fewer than J: what there is
    assert select(candidates, 0, policy) == []
    assert select([], 5, policy) == []
    assert select([group("stale", epoch=0)], 5, policy) == []


@pytest.mark.parametrize("policy", ["uniform", "highest_reward", "round_robin"])
def test_per_peer_cap(policy: str) -> None:
    # 3 peers x 5 groups, cap 2: at most 6 groups, 2 from each.
    candidates = [group(f"{p}{n}", peer=p, rewards=[1.0, 0.1 * n]) for p in "abc" for n in range(5)]
    chosen = select(candidates, 10, policy, max_per_peer=2)
    assert Counter(g.peer_id for g in chosen) == {"a": 2, "b": 2, "c": 2}
    chosen = select(candidates, 4, policy, max_per_peer=2)
    assert len(chosen) == 4 and max(Counter(g.peer_id for g in chosen).values()) <= 2
    assert select(candidates, 4, policy, max_per_peer=0) == []


@pytest.mark.parametrize("policy", ["uniform", "highest_reward", "round_robin"])
def test_deterministic_with_seeded_rng(policy: str) -> None:
    candidates = [group(f"g{n}", peer=f"p{n % 4}", rewards=[1.0, 0.0, float(n % 3)]) for n in range(12)]
    runs = [keys(select(candidates, 5, policy, rng=random.Random(42))) for _ in range(2)]
    assert runs[0] == runs[1]


def test_uniform_is_uniform() -> None:
    # 4 candidates, J = 1, 4000 seeded draws: each chosen ~1000 times (binomial sd ~27).
    candidates = [group(f"g{n}", peer=f"p{n}") for n in range(4)]
    rng = random.Random(7)
    counts = Counter(keys(select(candidates, 1, rng=rng))[0] for _ in range(4000))
    assert set(counts) == {"g0", "g1", "g2", "g3"}
    assert all(880 <= c <= 1120 for c in counts.values()), counts
    # Different seeds give different orders (not just a fixed prefix of the input).
    orders = {tuple(keys(select(candidates, 4, rng=random.Random(s)))) for s in range(10)}
    assert len(orders) > 1


def test_highest_reward_order() -> None:
    # Means: lo 0.25, mid 0.5, hi 2/3, top 0.75 -> order top, hi, mid, lo.
    candidates = [
        group("mid", rewards=[1.0, 0.0]),
        group("lo", rewards=[1.0, 0.0, 0.0, 0.0]),
        group("top", rewards=[1.0, 1.0, 1.0, 0.0]),
        group("hi", rewards=[1.0, 1.0, 0.0]),
    ]
    assert keys(select(candidates, 4, "highest_reward")) == ["top", "hi", "mid", "lo"]
    assert keys(select(candidates, 2, "highest_reward")) == ["top", "hi"]
    # With a cap of 1 per peer the best group of each peer wins.
    capped = [group("a-best", "a", rewards=[1.0, 1.0, 0.0]), group("a-2", "a"), group("b-1", "b")]
    assert keys(select(capped, 3, "highest_reward", max_per_peer=1)) == ["a-best", "b-1"]


def test_round_robin_order() -> None:
    # Peers a (3 groups), b (1), c (2); each peer's groups newest first.
    candidates = [
        group("a8", "a", 8),
        group("a10", "a", 10),
        group("a9", "a", 9),
        group("b9", "b", 9),
        group("c8", "c", 8),
        group("c10", "c", 10),
    ]
    # Cycling in sorted order from a random start peer:
    expected = {
        "a": ["a10", "b9", "c10", "a9", "c8", "a8"],
        "b": ["b9", "c10", "a10", "c8", "a9", "a8"],
        "c": ["c10", "a10", "b9", "c8", "a9", "a8"],
    }
    starts = set()
    for seed in range(12):
        chosen = keys(select(candidates, 6, "round_robin", rng=random.Random(seed)))
        assert chosen == expected[chosen[0][0]]
        starts.add(chosen[0][0])
        # J = 4 takes a prefix of the same cycle.
        assert keys(select(candidates, 4, "round_robin", rng=random.Random(seed))) == chosen[:4]
    assert starts == {"a", "b", "c"}


def test_mix_takes_i_local_and_j_external() -> None:
    local = [
        group("l0", LOCAL_PEER_ID),
        group("l-flat", LOCAL_PEER_ID, rewards=NO_SIGNAL),
        group("l1", LOCAL_PEER_ID, epoch=0),  # local groups are not filtered by epoch
        group("l2", LOCAL_PEER_ID),
    ]
    external = [group(f"x{n}", peer=f"p{n}") for n in range(5)]
    kw: dict[str, Any] = {"max_per_peer": 1, "current_epoch": 10, "staleness_epochs": 2}
    chosen_local, chosen_external = mix(local, external, 2, 3, "uniform", rng=random.Random(1), **kw)
    assert keys(chosen_local) == ["l0", "l1"]
    assert len(chosen_external) == 3 and set(keys(chosen_external)) <= {f"x{n}" for n in range(5)}
    # Silo (J = 0) and too few of both: never blocks.
    assert mix(local, external, 8, 0, "uniform", rng=random.Random(1), **kw) == (
        [local[0], local[2], local[3]],
        [],
    )
    few_local, few_external = mix(local[:1], external[:2], 4, 4, "round_robin", rng=random.Random(1), **kw)
    assert keys(few_local) == ["l0"] and len(few_external) == 2


def test_bad_arguments_raise() -> None:
    candidates = [group("g")]
    with pytest.raises(ValueError, match="unknown selection policy"):
        select(candidates, 1, "best")
    with pytest.raises(ValueError):
        select(candidates, -1)
    with pytest.raises(ValueError):
        select(candidates, 1, max_per_peer=-1)
    with pytest.raises(ValueError):
        mix(
            [],
            candidates,
            -1,
            1,
            "uniform",
            max_per_peer=None,
            current_epoch=10,
            staleness_epochs=2,
            rng=random.Random(0),
        )


def _ds_group(key: str, dataset: str, peer: str = "peer-a") -> CandidateGroup:
    g = group(key, peer)
    g.dataset = dataset
    return g


def test_preference_weights_hand_computed() -> None:
    mixture = {"add": 0.8, "sub": 0.2}
    rates = {"add": 0.9, "sub": 0.25}  # the node's own recent signal rates
    args: dict[str, Any] = {"mixture": mixture, "signal_rates": rates, "floor": 0.2}
    assert preference_weights(["add", "sub"], "none", **args) is None
    assert preference_weights(["add", "sub", "mul"], "own_mixture", **args) == pytest.approx(
        {"add": 1.0, "sub": 0.25, "mul": 0.0})
    # low_signal: max(floor, 1 - rate); a dataset with no own groups lately weighs 1.
    assert preference_weights(["add", "sub", "mul"], "low_signal", **args) == pytest.approx(
        {"add": 0.2, "sub": 0.75, "mul": 1.0})
    assert preference_weights(["add", "sub", "mul"], "both", **args) == pytest.approx(
        {"add": 0.2, "sub": 0.1875, "mul": 0.0})
    with pytest.raises(ValueError, match="dataset preference"):
        preference_weights(["add"], "most", **args)  # type: ignore[arg-type]


def test_dataset_weights_bias_the_order_and_zero_weight_is_never_taken() -> None:
    cands = [_ds_group(f"a{i}", "add") for i in range(20)] + [_ds_group(f"s{i}", "sub") for i in range(20)]
    firsts: Counter[str] = Counter()
    for seed in range(400):
        (first,) = select(cands, 1, rng=random.Random(seed), dataset_weights={"add": 1.0, "sub": 3.0})
        firsts[first.key[0]] += 1
    # P(first group is a sub group) = 20 * 3 / (20 * 1 + 20 * 3) = 0.75 under weighted sampling.
    assert abs(firsts["s"] / 400 - 0.75) < 0.07
    for policy in ("uniform", "highest_reward", "round_robin"):
        taken = select(cands, 40, policy, dataset_weights={"add": 0.0, "sub": 1.0})
        assert len(taken) == 20 and all(g.dataset == "sub" for g in taken)
    # Without weights the order is exactly the unweighted one (the random stream is unchanged).
    assert keys(select(cands, 40)) == keys(select(cands, 40, dataset_weights=None))


def test_the_peer_filter_keeps_only_groups_above_the_nodes_own_reward_on_their_dataset() -> None:
    """``above_reward``: a group is kept when its mean reward is strictly above its dataset's value; a dataset
    the node has no rate for keeps every group; the policy then orders what is left."""
    candidates = []
    for key, dataset, rewards in [("hi", "add", [1.0, 1.0, 0.0, 0.0]),    # mean 0.5 > 0.25: kept
                                  ("eq", "add", [1.0, 0.0, 0.0, 0.0]),    # mean 0.25, not above: dropped
                                  ("lo", "add", [0.5, 0.0, 0.0, 0.0]),    # mean 0.125: dropped
                                  ("sub", "sub", [0.0, 0.0, 0.0, 0.4]),   # 0.1 > 0.05: kept
                                  ("mul", "mul", [0.0, 0.0, 0.0, 0.1])]:  # no rate for mul: kept
        g = group(key, rewards=rewards)
        g.dataset = dataset
        candidates.append(g)
    floors = {"add": 0.25, "sub": 0.05}
    picked = select_external(candidates, 5, "highest_reward", max_per_peer=None, current_epoch=10,
                             staleness_epochs=0, rng=random.Random(0), above_reward=floors)
    assert keys(picked) == ["hi", "sub", "mul"]
    unfiltered = select_external(candidates, 5, "highest_reward", max_per_peer=None, current_epoch=10,
                                 staleness_epochs=0, rng=random.Random(0))
    assert len(unfiltered) == 5


def test_peer_slots_fixed_gives_j_and_flat_gives_the_steps_flat_groups_at_most_j() -> None:
    # 8 own groups generated, 5 with signal: 3 flat slots.
    assert peer_slots("fixed", 4, 8, 5) == 4
    assert peer_slots("flat", 4, 8, 5) == 3
    assert peer_slots("flat", 2, 8, 5) == 2  # never more than J
    assert peer_slots("flat", 8, 8, 8) == 0  # every own group taught something: no peer group
    assert peer_slots("flat", 8, 8, 0) == 8  # own groups ran dry: the step is all peers'
    with pytest.raises(ValueError, match="peer slots"):
        peer_slots("some", 4, 8, 5)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        peer_slots("flat", 4, 8, 9)


def test_mix_with_flat_slots_fills_only_the_slots_of_flat_own_groups() -> None:
    """Hand-made step: 4 own groups, l1 and l3 flat; 5 peer groups on offer; I = 4, J = 4."""
    local = [group("l0", LOCAL_PEER_ID), group("l1", LOCAL_PEER_ID, rewards=NO_SIGNAL), group("l2", LOCAL_PEER_ID),
             group("l3", LOCAL_PEER_ID, rewards=[0.0, 0.0])]
    external = [group(f"x{n}", peer=f"p{n}") for n in range(5)]
    kw: dict[str, Any] = {"max_per_peer": None, "current_epoch": 10, "staleness_epochs": 2}
    fixed_local, fixed_external = mix(local, external, 4, 4, "uniform", rng=random.Random(3), **kw)
    flat_local, flat_external = mix(local, external, 4, 4, "uniform", rng=random.Random(3), slots="flat", **kw)
    assert keys(fixed_local) == keys(flat_local) == ["l0", "l2"]
    assert len(fixed_external) == 4  # fixed: J whatever the own groups gave
    assert keys(flat_external) == keys(fixed_external)[:2]  # flat: the two flat slots, same order
    # Every own group with signal: nothing from peers; every own group flat: J of them.
    assert mix(local[::2], external, 4, 4, "uniform", rng=random.Random(3), slots="flat", **kw)[1] == []
    assert len(mix(local[1::2], external, 4, 4, "uniform", rng=random.Random(3), slots="flat", **kw)[1]) == 2


def test_learning_band_weights_hand_computed() -> None:
    # Own success rates: add 0.5 (inside [0.05, 0.95]), sub 0.98 (always right), mul 0.0 (always wrong);
    # div not sampled lately.
    args: dict[str, Any] = {"mixture": {"add": 1.0}, "signal_rates": {}, "floor": 0.1,
                            "success_rates": {"add": 0.5, "sub": 0.98, "mul": 0.0}, "band": (0.05, 0.95)}
    assert preference_weights(["add", "sub", "mul", "div"], "learning_band", **args) == pytest.approx(
        {"add": 1.0, "sub": 0.1, "mul": 0.1, "div": 1.0})
    edge = {**args, "success_rates": {"add": 0.05, "sub": 0.95}}  # the band's ends are inside it
    assert preference_weights(["add", "sub"], "learning_band", **edge) == {"add": 1.0, "sub": 1.0}


def test_learning_band_selection_prefers_datasets_inside_the_band() -> None:
    """Peers' groups on add (inside the node's band) and sub (outside): with floor 0, two flat slots take
    add groups only, and with a small floor add groups come first nearly always."""
    cands = [_ds_group(f"a{i}", "add") for i in range(3)] + [_ds_group(f"s{i}", "sub") for i in range(3)]
    band: dict[str, Any] = {"mixture": {}, "signal_rates": {}, "success_rates": {"add": 0.4, "sub": 1.0},
                            "band": (0.05, 0.95)}
    only_band = preference_weights(["add", "sub"], "learning_band", floor=0.0, **band)
    assert only_band == {"add": 1.0, "sub": 0.0}
    for seed in range(20):
        taken = select(cands, 2, rng=random.Random(seed), dataset_weights=only_band)
        assert len(taken) == 2 and {g.dataset for g in taken} == {"add"}
    # Floor 0.01: the first two picks are add groups with probability (3/3.03)(2/2.03) = 0.975 (0.2
    # unweighted: (3/6)(2/5)), so in about 195 of 200 seeds.
    soft = preference_weights(["add", "sub"], "learning_band", floor=0.01, **band)
    both_add = sum({g.dataset for g in select(cands, 2, rng=random.Random(s), dataset_weights=soft)} == {"add"}
                   for s in range(200))
    assert both_add >= 180
