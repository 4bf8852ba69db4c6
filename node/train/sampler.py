"""SAPO mixing: which local and external groups a training step uses (docs/algorithms.md, "SAPO mixing").

Each step trains on up to I local groups and up to J external groups; a group is one task's completions
from one source. External candidates are first filtered -- groups older than the staleness window
(``epoch < current_epoch - staleness_epochs``) and groups whose advantages are all zero are dropped --
then selected by a policy, with at most ``max_per_peer`` groups from any one peer:

- ``uniform`` (default): a uniformly random order (``rng.sample``), taken greedily under the cap;
- ``highest_reward``: by mean reward, highest first (ties in random order);
- ``round_robin``: one group per peer in turn, peers in sorted id order starting at a random peer,
  each peer's groups newest epoch first (ties in random order).

Selection never blocks and never raises for too few candidates: it returns what there is. Everything is
deterministic given the state of ``rng``. No I/O, no network, no config objects.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from node.modes import SELECTION_POLICIES, SelectionPolicy
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
    """

    key: str
    peer_id: str
    epoch: int
    rewards: Tensor | Sequence[float]
    advantages: Tensor | Sequence[float]
    payload: Any = None

    @property
    def mean_reward(self) -> float:
        """Mean of ``rewards`` (0.0 for an empty group)."""
        rewards = torch.as_tensor(self.rewards, dtype=torch.float64)
        return float(rewards.mean()) if rewards.numel() else 0.0

    def has_signal(self, atol: float = 1e-8) -> bool:
        """Whether any advantage is non-zero (within ``atol``)."""
        return has_signal(torch.as_tensor(self.advantages), atol)


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
    fresh: Sequence[CandidateGroup], j: int, max_per_peer: int | None, rng: random.Random
) -> list[CandidateGroup]:
    by_peer: dict[str, list[CandidateGroup]] = {}
    for group in rng.sample(list(fresh), len(fresh)):
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
    fresh = [g for g in candidates if g.epoch >= oldest and g.has_signal()]
    if policy == "round_robin":
        return _round_robin(fresh, j, max_per_peer, rng)
    ordered = rng.sample(fresh, len(fresh))
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
) -> tuple[list[CandidateGroup], list[CandidateGroup]]:
    """One step's SAPO batch: up to ``i`` local and up to ``j`` external groups.

    Args:
        local: this step's own groups, in generation order; the first ``i`` with a non-zero advantage
            are taken (local groups are fresh by construction and not filtered by epoch).
        external_candidates, j, policy, max_per_peer, current_epoch, staleness_epochs, rng: as in
            :func:`select_external`.

    Returns:
        ``(local_groups, external_groups)``.
    """
    if i < 0:
        raise ValueError(f"i ({i}) must not be negative")
    chosen_local = [g for g in local if g.has_signal()][:i]
    chosen_external = select_external(
        external_candidates,
        j,
        policy,
        max_per_peer=max_per_peer,
        current_epoch=current_epoch,
        staleness_epochs=staleness_epochs,
        rng=rng,
    )
    return chosen_local, chosen_external
