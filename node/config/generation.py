"""``generation`` (with ``generation.vllm``) and ``sampling``: how completions are produced."""

from __future__ import annotations

from pydantic import Field

from node.config.section import Section
from node.modes import EngineSync, GenerationBackendName, HfWeights, SamplingMode

_PEER_TOKENS_FACTOR = 4


class VllmConfig(Section):
    """The vLLM backend's engine (``generation.backend=vllm``), run in the node's own process."""

    sync: EngineSync = Field(
        "auto", description="how each new policy reaches the engine: merged weights pushed in place, or the LoRA "
        "adapter hot-swapped (no trained norms); auto: merge, the faster where measured (docs/backends.md)")
    kv_cache_memory_bytes: int = Field(2**30, ge=2**20, description="KV cache size (CPU RAM or GPU memory)")
    max_model_len: int = Field(4096, ge=16, description="longest prompt + completion, capped by the model's own")
    enforce_eager: bool = Field(True, description="no compilation (torch.compile; CUDA graphs on GPU): starts in "
                                "seconds; false compiles, which on CPU needs a C++ compiler (figures: docs/backends.md)")


class HfGenerationConfig(Section):
    """The node's own sampling loop (``generation.backend=hf``)."""

    weights: HfWeights = Field(
        "merged", description="merged: sample from a copy of the model with the LoRA deltas merged into its weights, "
        "refreshed after every optimizer step (about half the operations a token; the adapted weights held twice; "
        "in bfloat16 it differs from the trainer as an engine does: see train.engine_is_cap); adapter: from the "
        "adapters as trained. ReMix always runs its adapters")
    cuda_graphs: bool = Field(
        True, description="on a GPU, decode over a static KV cache with each step captured in a CUDA graph (one "
        "launch a token instead of hundreds; every row runs to the batch's end): on an H100, smollm2 generated "
        "6.0x faster in the silo and a step took 1.9 s instead of 3.4 (docs/results/gpu-h100.md). No effect on the "
        "CPU or with ReMix")
    keep_graphs: bool = Field(
        True, description="with cuda_graphs: keep each captured decode step and its KV cache for the next "
        "generation of the same batch size (its cache rounded up to 64 positions, so prompts of nearby widths "
        "share it) instead of allocating and capturing again each call; a cache of that size held a batch size "
        "(docs/backends.md)")


class GenerationConfig(Section):
    backend: GenerationBackendName = Field("hf", description="hf: the node's own sampling loop; vllm: a vLLM engine")
    group_size: int = Field(8, ge=1, description="completions per task (G)")
    max_new_tokens: int = Field(8, ge=1)
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    batch_size: int = Field(256, ge=1, description="sequences decoded at once (hf: per forward; vllm: max_num_seqs)")
    hf: HfGenerationConfig = HfGenerationConfig()
    vllm: VllmConfig = VllmConfig()

    @property
    def peer_completion_tokens(self) -> int:
        """Longest peer completion ingested, in this node's tokens: room for a peer whose tokenizer
        splits the same text into more tokens than ours (a character model against a BPE one)."""
        return _PEER_TOKENS_FACTOR * self.max_new_tokens


class SamplingConfig(Section):
    mode: SamplingMode = "standard"
    round_size: int = Field(8, ge=1, description="Reinforce-Ada: completions per round (M)")
    max_rounds: int = Field(4, ge=1, description="Reinforce-Ada: rounds at most (R)")
    positive_threshold: float = Field(
        1.0, gt=0, le=1, description="Reinforce-Ada: a completion is positive when its reward is at least this"
    )

