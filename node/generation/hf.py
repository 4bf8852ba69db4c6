"""The HF backend: the node's own sampling loop on the trainable policy, batch by batch.

With ``weights="merged"`` (the default) a LoRA policy samples from a merged copy of its model
(``node.generation.merged``), refreshed by ``sync`` after every optimizer step and whenever its adapters
changed since; with ``"adapter"``, or a ReMix policy (whose routing picks adapters per sequence), from the
policy's own modules, so every update is seen at once.
"""

from __future__ import annotations

import logging
import time

import torch
from torch import nn

from node.generation.base import SamplingSettings, check_prompts_fit
from node.generation.merged import MergedCopy, lora_layers
from node.generation.sampling import Completions, concat_completions, generate
from node.generation.static import DecoderPool
from node.modes import HfWeights
from node.policy.model import Policy

logger = logging.getLogger(__name__)


class HFBackend:
    """Generation on the policy's device, with the policy's weights as of its last update."""

    name = "hf"

    def __init__(self, policy: Policy, *, batch_size: int, weights: HfWeights = "merged",
                 cuda_graphs: bool = False, keep_graphs: bool = False) -> None:
        self.policy = policy
        self.cuda_graphs = cuda_graphs and policy.device.type == "cuda"
        # generation.hf.keep_graphs: captured decode steps kept for the next batch of the same size
        self.decoders = DecoderPool() if self.cuda_graphs and keep_graphs else None
        self.batch_size = batch_size
        self.max_len = policy.context_length
        self.merged: MergedCopy | None = None
        if weights == "merged" and policy.remix is None and lora_layers(policy.model):
            self.merged = MergedCopy(policy.model)
            logger.info("generation from merged weights: %d LoRA layers, %.0f MB more memory",
                        self.merged.merged_layers, self.merged.extra_bytes() / 2**20)

    @property
    def weights(self) -> HfWeights:
        """What generation computes with: ``merged`` or ``adapter``."""
        return "adapter" if self.merged is None else "merged"

    def _model(self) -> nn.Module:
        if self.merged is None:
            return self.policy.model
        self.merged.refresh_if_changed()
        return self.merged.module

    def generate(self, prompts: list[list[int]], settings: SamplingSettings,
                 generator: torch.Generator | None = None) -> Completions:
        check_prompts_fit(prompts, self.max_len)
        p, model = self.policy, self._model()
        parts = [
            generate(model, p.tokenizer, prompts[i : i + self.batch_size], max_new_tokens=settings.max_new_tokens,
                     temperature=settings.temperature, top_p=settings.top_p, greedy=settings.greedy,
                     generator=generator, device=p.device, remix=p.remix, max_len=self.max_len,
                     cuda_graphs=self.cuda_graphs, decoders=self.decoders)
            for i in range(0, len(prompts), self.batch_size)
        ]
        return concat_completions(parts)

    def sync(self) -> dict[str, float]:
        if self.merged is None:
            return {}
        t0 = time.perf_counter()
        self.merged.refresh()
        return {"sync_seconds": time.perf_counter() - t0}

    def close(self) -> None:
        self.merged = None
        if self.decoders is not None:
            self.decoders.clear()
