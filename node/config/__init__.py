"""Typed node configuration: YAML files plus ``a.b=value`` overrides, unknown keys rejected.

Every section is a pydantic v2 model with ``extra="forbid"``. ``load_config`` collects every problem at
once and raises one ``ConfigError`` whose message names each bad field and what would fix it.

One module a group of sections (a new key goes beside its section):

- ``model``       ``model``, ``adapter`` (with ``adapter.remix``)
- ``tasks``       ``tasks`` (with ``tasks.prompt``)
- ``generation``  ``generation`` (with ``generation.vllm``), ``sampling``
- ``training``    ``train``, ``sapo``, ``ingest``
- ``operating``   ``tracking`` (with ``tracking.wandb``), ``api``
- ``root``        ``NodeConfig``: every section (``swarm`` is ``swarm.settings.SwarmSettings``) and the rules
  across sections
- ``loading``     ``load_config`` (``load_config_data`` then ``validate_config``), ``load_recorded_config`` (a run
  dir's config.yaml, keys renamed since read under their new names), ``apply_overrides``, the
  error message; ``resolve_api`` and ``with_initial_peers`` (what the environment and the command line add)

Also ``host`` (a swarm host's settings) and ``join`` (a member's settings from its swarm's signed descriptor).
It may import tasks/ (dataset names are checked) and node's leaf modules only.
"""

from node.config.generation import GenerationConfig, SamplingConfig, VllmConfig
from node.config.loading import (
    apply_overrides,
    load_config,
    load_config_data,
    load_recorded_config,
    resolve_api,
    resolve_initial_peers,
    validate_config,
    with_initial_peers,
)
from node.config.model import AdapterConfig, ModelConfig, RemixConfig
from node.config.operating import API_TOKEN_ENV, ApiConfig, TrackingConfig, WandbConfig
from node.config.root import NodeConfig
from node.config.tasks import PROMPT_DEFAULT, PromptConfig, PromptExample, TasksConfig
from node.config.training import IngestConfig, SapoConfig, TrainConfig
from node.errors import ConfigError

__all__ = [
    "API_TOKEN_ENV",
    "PROMPT_DEFAULT",
    "AdapterConfig",
    "ApiConfig",
    "ConfigError",
    "GenerationConfig",
    "IngestConfig",
    "ModelConfig",
    "NodeConfig",
    "PromptConfig",
    "PromptExample",
    "RemixConfig",
    "SamplingConfig",
    "SapoConfig",
    "TasksConfig",
    "TrackingConfig",
    "TrainConfig",
    "VllmConfig",
    "WandbConfig",
    "apply_overrides",
    "load_config",
    "load_config_data",
    "load_recorded_config",
    "resolve_api",
    "resolve_initial_peers",
    "validate_config",
    "with_initial_peers",
]
