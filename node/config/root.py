"""``NodeConfig``: every section, and the rules across sections."""

from __future__ import annotations

from pydantic import model_validator

from node.config.generation import GenerationConfig, SamplingConfig
from node.config.model import AdapterConfig, ModelConfig
from node.config.operating import ApiConfig, TrackingConfig
from node.config.section import Section
from node.config.tasks import TasksConfig
from node.config.training import IngestConfig, SapoConfig, TrainConfig
from swarm.settings import SwarmSettings

_VLLM_MAX_TEMPERATURE = 2.0  # vLLM's SamplingParams refuses higher temperatures


class NodeConfig(Section):
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
