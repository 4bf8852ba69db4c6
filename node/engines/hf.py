"""The HF backend: the node's own sampling loop on the trainable policy, batch by batch."""

from __future__ import annotations

import torch

from node.engines.base import SamplingSettings, check_prompts_fit
from node.generation import Completions, concat_completions, generate
from node.policy.model import Policy


class HFBackend:
    """Generation shares the policy's modules, so every step's update is seen at once: ``sync`` is free."""

    name = "hf"

    def __init__(self, policy: Policy, *, batch_size: int) -> None:
        self.policy = policy
        self.batch_size = batch_size
        self.max_len = policy.context_length

    def generate(self, prompts: list[list[int]], settings: SamplingSettings,
                 generator: torch.Generator | None = None) -> Completions:
        check_prompts_fit(prompts, self.max_len)
        p = self.policy
        parts = [
            generate(p.model, p.tokenizer, prompts[i : i + self.batch_size], max_new_tokens=settings.max_new_tokens,
                     temperature=settings.temperature, top_p=settings.top_p, greedy=settings.greedy,
                     generator=generator, device=p.device, remix=p.remix, max_len=self.max_len)
            for i in range(0, len(prompts), self.batch_size)
        ]
        return concat_completions(parts)

    def sync(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        pass
