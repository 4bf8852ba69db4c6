"""``TrainGroup``, one task's completions ready to train on, and the advantages assigned to groups.

Produced by the node's own sampling (``node.generation.rollouts``) and by ingestion of peers' records
(``node.exchange.ingest``); consumed by the SAPO mix and the trainer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from node.modes import AdvantageKind
from node.train.advantages import group_advantages, nonzero_groups

__all__ = ["TrainGroup", "assign_advantages"]


@dataclass
class TrainGroup:
    """One task's completions, tokenized for this node's policy.

    ``anchor_logprobs`` are the behaviour log-probs used as the ratio's denominator: the sampler's own
    when the tokens came from this node or from a peer with our tokenizer, otherwise the node's own
    log-probs computed when the text was ingested.
    """

    key: str
    peer_id: str  # "" for the node's own groups
    epoch: int
    prompt_ids: list[int]
    completions: list[list[int]]
    anchor_logprobs: list[list[float]]
    rewards: list[float]
    advantages: torch.Tensor | None = None
    routings: list[list[int]] = field(default_factory=list)
    all_rewards: list[float] | None = None  # Reinforce-Ada: every reward drawn for the task (global baseline)
    dataset: str = ""  # the task's dataset (selection prefers some datasets over others)
    # A peer's completions: the tokens [lo, hi) of each one's verified final answer, or None (see
    # node.exchange.plausibility.answer_token_span); empty when not computed.
    answer_spans: list[tuple[int, int] | None] = field(default_factory=list)
    # A peer's completions read by the frozen base before training, one list a completion (the peer-text screen's
    # reference, node.train.screen; an empty list for a completion not read); empty when none was read.
    reference_logprobs: list[list[float]] = field(default_factory=list)

    @property
    def is_local(self) -> bool:
        return self.peer_id == ""

    def keep_only(self, indices: list[int]) -> None:
        """Keep the completions at ``indices`` (before advantages are assigned), with what goes with each."""
        self.completions = [self.completions[i] for i in indices]
        self.anchor_logprobs = [self.anchor_logprobs[i] for i in indices]
        self.rewards = [self.rewards[i] for i in indices]
        if self.routings:
            self.routings = [self.routings[i] for i in indices]
        if self.answer_spans:
            self.answer_spans = [self.answer_spans[i] for i in indices]
        if self.reference_logprobs:
            self.reference_logprobs = [self.reference_logprobs[i] for i in indices]


def assign_advantages(groups: list[TrainGroup], kind: AdvantageKind, external_shift: float = 0.0) -> list[TrainGroup]:
    """Fill ``advantages`` for every group; return only the groups that carry signal.

    A group that remembers every reward drawn for its task (``all_rewards``: Reinforce-Ada sampling) gets
    the global baseline, the mean of all those draws, whatever ``kind`` says: the balanced downsample's
    own mean (about 0.5 by construction) is not an estimate of the task's value. Other groups get ``kind``.

    Signal is judged before the AsymRE shift of external groups: a group whose unshifted advantages are
    all zero (e.g. every completion wrong) is dropped, so the shift never reinforces uniform failures.
    """
    unshifted = []
    for g in groups:
        everything = torch.tensor(g.all_rewards, dtype=torch.float32) if g.all_rewards else None
        group_kind: AdvantageKind = "global" if everything is not None else kind
        rewards = torch.tensor(g.rewards, dtype=torch.float32)
        base = group_advantages(rewards, group_kind, all_rewards=everything)
        shift = 0.0 if g.is_local else external_shift
        g.advantages = base if shift == 0.0 else group_advantages(rewards, group_kind, shift=shift,
                                                                  all_rewards=everything)
        unshifted.append(base)
    keep = set(nonzero_groups(unshifted))
    return [g for i, g in enumerate(groups) if i in keep]
