"""SAPO mixing: which local and external groups a training step uses (docs/algorithms.md, "SAPO mixing").

Each step trains on up to I local groups and up to J external groups; a group is one task's completions
from one source. External candidates are first filtered -- groups older than the staleness window
(``epoch < current_epoch - staleness_epochs``) and groups whose advantages are all zero are dropped --
then selected by a policy, with at most ``max_per_peer`` groups from any one peer:

- ``uniform`` (default): a uniformly random order (``rng.sample``), taken greedily under the cap;
- ``highest_reward``: by mean reward, highest first (ties in random order);
- ``round_robin``: one group per peer in turn, peers in sorted id order starting at a random peer,
  each peer's groups newest epoch first (ties in random order).

Dataset preference (``dataset_weights``, from :func:`preference_weights`): the random order every policy
starts from is drawn with probability proportional to the weight of each group's dataset (weighted
sampling without replacement, Efraimidis-Spirakis keys ``u ** (1 / w)``), and a dataset of weight 0 is
never selected. ``uniform`` takes that order as it is, ``highest_reward`` breaks reward ties by it and
``round_robin`` uses it inside each peer's queue. A node prefers:

- ``own_mixture``: datasets of its own task mixture, ``w_d = weight_d / max weight`` (0 outside it);
- ``low_signal``: datasets where its own recent groups rarely carry signal,
  ``w_d = max(floor, 1 - signal_rate_d)`` (1 for a dataset it has not sampled lately);
- ``both``: the product;
- ``learning_band``: datasets where its own recent success rate (mean reward) lies inside a learning band
  ``[low, high]`` (neither always right nor always wrong), ``w_d = 1`` there and ``floor`` outside (1 for
  a dataset it has not sampled lately).

Peer slots (:func:`peer_slots`): ``fixed`` lets a step train on up to J peer groups whatever its own
groups gave; ``flat`` lets peer groups into the slots the step's own flat groups (all rewards equal, no
signal) leave, at most J: a node whose own groups all carry signal trains on them alone, one whose own
groups ran dry fills its step with peers' groups, and a step never trains on more groups than it generated.

Peer filter (``above_reward``, the node's own mean reward by dataset): a group whose mean reward is not
above its dataset's value is dropped before any policy orders the rest (a dataset missing there keeps
every group), so a node learns only from peers that did better than it does on the task.

Selection never blocks and never raises for too few candidates: it returns what there is. Everything is
deterministic given the state of ``rng``. No I/O, no network, no config objects.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from node.modes import (
    DATASET_PREFERENCES,
    PEER_SLOTS,
    SELECTION_POLICIES,
    DatasetPreference,
    PeerSlots,
    SelectionPolicy,
)
from node.train.advantages import has_signal

LOCAL_PEER_ID = ""
"""The ``peer_id`` of a node's own groups."""


@dataclass
class CandidateGroup:
    """One task's completions from one source, ready to train on.

    Attributes:
        key: the task reference key (which task the group answers).
        peer_id: the author's peer id, or :data:`LOCAL_PEER_ID` for our own groups.
        epoch: the swarm epoch the group was produced in.
        rewards: ``[N]`` rewards as scored locally.
        advantages: ``[N]`` advantages.
        payload: the caller's object (completions, log-probs, ...); opaque here.
        dataset: the task's dataset (for dataset preferences).
    """

    key: str
    peer_id: str
    epoch: int
    rewards: Tensor | Sequence[float]
    advantages: Tensor | Sequence[float]
    payload: Any = None
    dataset: str = ""

    @property
    def mean_reward(self) -> float:
        """Mean of ``rewards`` (0.0 for an empty group)."""
        rewards = torch.as_tensor(self.rewards, dtype=torch.float64)
        return float(rewards.mean()) if rewards.numel() else 0.0

    def has_signal(self, atol: float = 1e-8) -> bool:
        """Whether any advantage is non-zero (within ``atol``)."""
        return has_signal(torch.as_tensor(self.advantages), atol)


def preference_weights(
    datasets: Iterable[str],
    preference: DatasetPreference,
    *,
    mixture: Mapping[str, float],
    signal_rates: Mapping[str, float],
    floor: float,
    success_rates: Mapping[str, float] | None = None,
    band: tuple[float, float] = (0.0, 1.0),
) -> dict[str, float] | None:
    """The selection weight of each dataset in ``datasets`` under ``preference`` (module docstring).

    Args:
        datasets: the datasets of the candidate groups (repeats allowed).
        preference: "none" (returns None: no weighting), "own_mixture", "low_signal", "both" or
            "learning_band".
        mixture: the node's own task weights by dataset.
        signal_rates: the fraction of the node's own recent groups of each dataset that carried signal;
            a dataset missing here has not been sampled lately.
        floor: the lowest ``low_signal`` weight, and the ``learning_band`` weight outside the band, in [0, 1].
        success_rates: the node's own recent mean reward by dataset (``learning_band``; missing: not
            sampled lately).
        band: ``(low, high)``, the success rates (inclusive) inside the learning band.

    Returns:
        ``{dataset: weight >= 0}``, or None for "none".
    """
    if preference not in DATASET_PREFERENCES:
        raise ValueError(f"unknown dataset preference {preference!r}; expected one of {DATASET_PREFERENCES}")
    if preference == "none":
        return None
    top = max(mixture.values(), default=0.0)
    weights: dict[str, float] = {}
    for dataset in set(datasets):
        weight = 1.0
        if preference in ("own_mixture", "both"):
            weight *= mixture.get(dataset, 0.0) / top if top > 0 else 0.0
        if preference in ("low_signal", "both") and dataset in signal_rates:
            weight *= max(floor, 1.0 - signal_rates[dataset])
        if preference == "learning_band" and success_rates is not None and dataset in success_rates:
            weight = 1.0 if band[0] <= success_rates[dataset] <= band[1] else floor
        weights[dataset] = weight
    return weights


def peer_slots(mode: PeerSlots, j: int, generated: int, own_with_signal: int) -> int:
    """How many peer groups a step may train on (module docstring, "Peer slots").

    Args:
        mode: "fixed" (``j``) or "flat" (the step's own flat groups, at most ``j``).
        j: the configured J.
        generated: own groups generated this step.
        own_with_signal: how many of them carry signal.

    Returns:
        ``j`` for "fixed"; ``min(j, generated - own_with_signal)`` for "flat".
    """
    if mode not in PEER_SLOTS:
        raise ValueError(f"unknown peer slots mode {mode!r}; expected one of {PEER_SLOTS}")
    if j < 0 or own_with_signal < 0 or own_with_signal > generated:
        raise ValueError(f"j ({j}) must not be negative and own_with_signal ({own_with_signal}) must be within "
                         f"[0, generated ({generated})]")
    return j if mode == "fixed" else min(j, generated - own_with_signal)


def _weighted_order(
    groups: Sequence[CandidateGroup], weights: Mapping[str, float] | None, rng: random.Random
) -> list[CandidateGroup]:
    """A random order of ``groups``; with ``weights``, drawn proportionally to their datasets' weights
    (Efraimidis-Spirakis), groups of weight-0 datasets left out."""
    if weights is None:
        return rng.sample(list(groups), len(groups))
    keyed: list[tuple[float, CandidateGroup]] = []
    for group in groups:
        u = rng.random()  # one draw per group, kept or not: the stream does not depend on the weights
        weight = weights.get(group.dataset, 0.0)
        if weight > 0:
            keyed.append((u ** (1.0 / weight), group))
    keyed.sort(key=lambda item: -item[0])
    return [group for _, group in keyed]


def _take_capped(ordered: Sequence[CandidateGroup], j: int, max_per_peer: int | None) -> list[CandidateGroup]:
    """The first ``j`` groups of ``ordered`` with at most ``max_per_peer`` from any peer."""
    taken: list[CandidateGroup] = []
    per_peer: dict[str, int] = {}
    for group in ordered:
        if len(taken) >= j:
            break
        count = per_peer.get(group.peer_id, 0)
        if max_per_peer is not None and count >= max_per_peer:
            continue
        per_peer[group.peer_id] = count + 1
        taken.append(group)
    return taken


def _round_robin(
    fresh: Sequence[CandidateGroup],
    j: int,
    max_per_peer: int | None,
    rng: random.Random,
    weights: Mapping[str, float] | None,
) -> list[CandidateGroup]:
    by_peer: dict[str, list[CandidateGroup]] = {}
    for group in _weighted_order(fresh, weights, rng):
        by_peer.setdefault(group.peer_id, []).append(group)
    peers = sorted(by_peer)
    if not peers:
        return []
    start = rng.randrange(len(peers))
    peers = peers[start:] + peers[:start]
    limit = len(fresh) if max_per_peer is None else max_per_peer
    queues = [sorted(by_peer[p], key=lambda g: -g.epoch)[:limit] for p in peers]  # stable: ties stay random
    taken: list[CandidateGroup] = []
    depth = 0
    while len(taken) < j and any(depth < len(q) for q in queues):
        for queue in queues:
            if depth < len(queue) and len(taken) < j:
                taken.append(queue[depth])
        depth += 1
    return taken


def select_external(
    candidates: Sequence[CandidateGroup],
    j: int,
    policy: SelectionPolicy,
    *,
    max_per_peer: int | None,
    current_epoch: int,
    staleness_epochs: int,
    rng: random.Random,
    dataset_weights: Mapping[str, float] | None = None,
    above_reward: Mapping[str, float] | None = None,
) -> list[CandidateGroup]:
    """Choose up to ``j`` external groups (module docstring for the rules).

    Args:
        candidates: external groups on offer, any order.
        j: how many to take at most (J).
        policy: "uniform", "highest_reward" or "round_robin".
        max_per_peer: at most this many groups per peer id; None for no cap.
        current_epoch: the node's current epoch.
        staleness_epochs: groups with ``epoch < current_epoch - staleness_epochs`` are dropped.
        rng: the only source of randomness.
        dataset_weights: weight of each dataset (None: all equal); groups of a dataset missing or of
            weight 0 are never selected.
        above_reward: by dataset, the mean reward a group must exceed to be selected (None: no filter).

    Returns:
        At most ``j`` groups in selection order; fewer when fewer qualify.

    Raises:
        ValueError: negative ``j`` / ``max_per_peer`` / ``staleness_epochs``, or unknown policy.
    """
    if policy not in SELECTION_POLICIES:
        raise ValueError(f"unknown selection policy {policy!r}; expected one of {SELECTION_POLICIES}")
    if j < 0 or staleness_epochs < 0 or (max_per_peer is not None and max_per_peer < 0):
        raise ValueError(
            f"j ({j}), staleness_epochs ({staleness_epochs}) and max_per_peer ({max_per_peer}) "
            "must not be negative"
        )
    oldest = current_epoch - staleness_epochs
    fresh = [g for g in candidates if g.epoch >= oldest and g.has_signal()
             and (above_reward is None or g.dataset not in above_reward or g.mean_reward > above_reward[g.dataset])]
    if policy == "round_robin":
        return _round_robin(fresh, j, max_per_peer, rng, dataset_weights)
    ordered = _weighted_order(fresh, dataset_weights, rng)
    if policy == "highest_reward":
        ordered.sort(key=lambda g: -g.mean_reward)  # stable: ties keep the random order
    return _take_capped(ordered, j, max_per_peer)


def mix(
    local: Sequence[CandidateGroup],
    external_candidates: Sequence[CandidateGroup],
    i: int,
    j: int,
    policy: SelectionPolicy,
    *,
    max_per_peer: int | None,
    current_epoch: int,
    staleness_epochs: int,
    rng: random.Random,
    dataset_weights: Mapping[str, float] | None = None,
    above_reward: Mapping[str, float] | None = None,
    slots: PeerSlots = "fixed",
) -> tuple[list[CandidateGroup], list[CandidateGroup]]:
    """One step's SAPO batch: up to ``i`` local and up to ``j`` external groups (``slots="flat"``: external
    groups only in the slots of the step's flat local groups, at most ``j``).

    Args:
        local: this step's own groups, in generation order; the first ``i`` with a non-zero advantage
            are taken (local groups are fresh by construction and not filtered by epoch).
        external_candidates, j, policy, max_per_peer, current_epoch, staleness_epochs, rng,
            dataset_weights, above_reward: as in :func:`select_external`.
        slots: "fixed" or "flat" (:func:`peer_slots`, with ``local`` the step's generated groups).

    Returns:
        ``(local_groups, external_groups)``.
    """
    if i < 0:
        raise ValueError(f"i ({i}) must not be negative")
    with_signal = [g for g in local if g.has_signal()]
    chosen_local = with_signal[:i]
    chosen_external = select_external(
        external_candidates,
        peer_slots(slots, j, len(local), len(with_signal)),
        policy,
        max_per_peer=max_per_peer,
        current_epoch=current_epoch,
        staleness_epochs=staleness_epochs,
        rng=rng,
        dataset_weights=dataset_weights,
        above_reward=above_reward,
    )
    return chosen_local, chosen_external
