"""Outbound records: the node's own sampled groups as protocol records, ready to sign and publish.

The inverse direction (a peer's records into training groups) is ``node.exchange.ingest``.
"""

from __future__ import annotations

from node.generation.rollouts import SampledGroup
from node.policy.model import Policy
from protocol.records import Rollout, RolloutGroup, SamplingParams

__all__ = ["to_rollout_groups"]


def to_rollout_groups(policy: Policy, groups: list[SampledGroup], *, policy_step: int, temperature: float,
                      top_p: float) -> list[RolloutGroup]:
    """The node's own groups as protocol records (behaviour log-probs of the sampling distribution)."""
    sampling = SamplingParams(temperature=temperature, top_p=top_p)
    out = []
    for sg in groups:
        prompt_text = str(policy.tokenizer.decode(sg.group.prompt_ids, skip_special_tokens=True))
        rollouts = tuple(
            Rollout(task=sg.task.ref, prompt=prompt_text, completion=text, completion_ids=tuple(ids),
                    tokenizer_fingerprint=policy.tokenizer_fingerprint, behavior_logprobs=tuple(lps),
                    sampling=sampling, model_fingerprint=policy.model_fingerprint, policy_step=policy_step,
                    finish_reason=reason, reward=reward, routing=tuple(routing))
            for ids, lps, text, reason, reward, routing in zip(
                sg.group.completions, sg.group.anchor_logprobs, sg.texts, sg.finish_reasons, sg.group.rewards,
                sg.group.routings or [[] for _ in sg.texts])
        )
        out.append(RolloutGroup(task=sg.task.ref, rollouts=rollouts))
    return out
