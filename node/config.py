"""Typed node configuration: YAML files plus ``a.b=value`` overrides, unknown keys rejected.

Every section is a pydantic v2 model with ``extra="forbid"``. ``load_config`` collects every problem at
once and raises one ``ConfigError`` whose message names each bad field and what would fix it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from swarm.settings import SwarmSettings

AdvantageKind = Literal["rloo", "grpo", "global"]
LossKind = Literal["topr", "rec", "grpo", "reinforce"]
SelectionPolicy = Literal["uniform", "highest_reward", "round_robin"]


class ConfigError(Exception):
    """A user's configuration or command line is wrong; the message says which field and how to fix it."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelConfig(_Section):
    name_or_path: str = Field("tiny-base", description="'tiny-base' or 'small-base' (embedded), a hub name or a local folder")
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: str = Field("auto", description="'auto', 'cpu', 'cuda', 'cuda:1', ...")
    chat_template: Literal["auto", "always", "never"] = "auto"
    trust_remote_code: bool = False


class RemixConfig(_Section):
    n: int = Field(8, ge=2)
    k: int = Field(2, ge=1)
    routings: int = Field(2, ge=2, description="M, routings sampled per sequence in training")
    scale: Literal["lora", "rslora"] = "lora"
    router_lr: float = Field(1e-2, gt=0)

    @model_validator(mode="after")
    def _k_at_most_n(self) -> RemixConfig:
        if self.k > self.n:
            raise ValueError(f"k ({self.k}) must be at most n ({self.n})")
        return self


class AdapterConfig(_Section):
    kind: Literal["lora", "remix"] = "lora"
    rank: int = Field(8, ge=1)
    alpha: float = Field(16.0, gt=0)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    train_norms: bool = Field(True, description="also train RMSNorm weights (peft modules_to_save)")
    norm_lr: float = Field(1e-2, gt=0)
    remix: RemixConfig = RemixConfig()


class TasksConfig(_Section):
    source: Literal["arith", "reasoning_gym"] = "arith"
    datasets: list[str] = Field(default_factory=lambda: ["add"])
    weights: list[float] | None = None
    eval_size: int = Field(128, ge=1)
    eval_datasets: list[str] | None = Field(None, description="held-out evaluation datasets (default: datasets)")

    @model_validator(mode="after")
    def _weights_match(self) -> TasksConfig:
        if not self.datasets:
            raise ValueError("datasets must name at least one dataset")
        if self.weights is not None and len(self.weights) != len(self.datasets):
            raise ValueError(f"weights has {len(self.weights)} entries but datasets has {len(self.datasets)}")
        return self


class GenerationConfig(_Section):
    backend: Literal["hf"] = "hf"
    group_size: int = Field(8, ge=1, description="completions per task (G)")
    max_new_tokens: int = Field(8, ge=1)
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    batch_size: int = Field(256, ge=1, description="sequences per generate() call")


class SamplingConfig(_Section):
    mode: Literal["standard", "ada_balanced", "ada_positive"] = "standard"
    round_size: int = Field(8, ge=1, description="Reinforce-Ada: completions per round (M)")
    max_rounds: int = Field(4, ge=1, description="Reinforce-Ada: rounds at most (R)")


class TrainConfig(_Section):
    steps: int = Field(200, ge=0)
    lr: float = Field(1e-3, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    max_grad_norm: float = Field(1.0, gt=0)
    loss: LossKind = "topr"
    advantage: AdvantageKind = "rloo"
    length_norm: bool = False
    eps_low: float = Field(0.2, ge=0)
    eps_high: float = Field(0.28, ge=0)
    external_shift: float = Field(0.0, ge=0, description="AsymRE baseline shift for external groups")
    off_policy_correction: bool = Field(
        True, description="use behaviour log-probs (ratios, tapers); false treats all data as on-policy (ratio 1)"
    )
    micro_batch_size: int = Field(256, ge=1, description="sequences per forward/backward")
    checkpoint_every: int = Field(25, ge=1)
    keep_checkpoints: int = Field(3, ge=1)
    eval_every: int = Field(25, ge=1)


class SapoConfig(_Section):
    local_groups: int = Field(32, ge=1, description="I: local task groups a step")
    external_groups: int = Field(0, ge=0, description="J: external groups a step")
    generated_groups: int | None = Field(
        None, ge=1, description="groups generated (and shared) a step; default I. Train uses I of them"
    )
    selection: SelectionPolicy = "uniform"
    max_per_peer: int | None = Field(None, ge=1)
    staleness_epochs: int = Field(2, ge=0)


class MetricsConfig(_Section):
    prometheus_port: int | None = Field(None, ge=0, le=65535, description="serve /metrics here; None: off")
    prometheus_host: str = "127.0.0.1"


class NodeConfig(_Section):
    seed: int = 0
    run_dir: str = "runs/node"
    metrics: MetricsConfig = MetricsConfig()
    model: ModelConfig = ModelConfig()
    adapter: AdapterConfig = AdapterConfig()
    tasks: TasksConfig = TasksConfig()
    generation: GenerationConfig = GenerationConfig()
    sampling: SamplingConfig = SamplingConfig()
    train: TrainConfig = TrainConfig()
    sapo: SapoConfig = SapoConfig()
    swarm: SwarmSettings = SwarmSettings()


def _parse_scalar(text: str) -> Any:
    """Parse an override value the way YAML would (``3`` -> 3, ``true`` -> True, ``[a, b]`` -> list)."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``a.b.c=value`` overrides to a nested dict (in place) and return it."""
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r} is not of the form key=value (e.g. train.steps=150)")
        parts = key.strip().split(".")
        node = data
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: {part!r} is a value, not a section")
            node = child
        node[parts[-1]] = _parse_scalar(value)
    return data


def _format_errors(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        field = ".".join(str(p) for p in e["loc"]) or "<root>"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key; check the spelling against configs/ and the README"
        elif e["type"] == "literal_error":
            msg = msg.replace("Input should be", "must be")
        lines.append(f"{field}: {msg} (got {e.get('input')!r})" if e["type"] != "extra_forbidden" else f"{field}: {msg}")
    return "; ".join(lines)


def load_config(path: str | os.PathLike[str] | None, overrides: list[str] | None = None) -> NodeConfig:
    """Load a YAML config (or the defaults when ``path`` is None), apply overrides, validate."""
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {str(p)!r} not found; pass an existing file, e.g. configs/tiny-silo.yaml")
        try:
            loaded = yaml.safe_load(p.read_text())
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {str(p)!r} is not valid YAML: {exc}") from exc
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config file {str(p)!r} must hold a mapping of sections at the top level")
        data = loaded or {}
    apply_overrides(data, overrides or [])
    try:
        return NodeConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"invalid config: {_format_errors(exc)}") from None
