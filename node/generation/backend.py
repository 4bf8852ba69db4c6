"""The one place that picks and builds a generation backend: the node's loop (``node_backend``, from its
config) and ``swarm-node eval`` (``build_backend``, for any policy) both come here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from node.config import NodeConfig, VllmConfig
from node.config.generation import HfGenerationConfig
from node.errors import ConfigError
from node.generation.base import GenerationBackend
from node.modes import GenerationBackendName

if TYPE_CHECKING:
    from node.policy.model import Policy

__all__ = ["build_backend", "node_backend"]


def build_backend(policy: Policy, kind: GenerationBackendName, *, batch_size: int, dtype: str, seed: int,
                  hf: HfGenerationConfig | None = None, vllm: VllmConfig | None = None,
                  trust_remote_code: bool = False, lora_rank: int = 8) -> GenerationBackend:
    """``hf``: the node's own sampling loop on ``policy`` (settings ``hf``, defaults when omitted); ``vllm``:
    an in-process vLLM engine over the policy's base model, checked importable first (a ``ConfigError``
    naming the package to install otherwise). A ReMix policy runs only on ``hf``."""
    if kind == "hf":
        from node.generation.hf import HFBackend

        h = hf or HfGenerationConfig()
        return HFBackend(policy, batch_size=batch_size, weights=h.weights, cuda_graphs=h.cuda_graphs,
                         keep_graphs=h.keep_graphs)
    from node.generation.vllm_engine import VLLMBackend, base_model_path, require_vllm

    require_vllm(policy.device)
    if policy.remix is not None:
        raise ConfigError("generation.backend=vllm cannot run adapter.kind=remix (its routing needs the node's own "
                          "loop); set generation.backend=hf")
    return VLLMBackend(policy, base_model_path(policy), vllm or VllmConfig(), dtype=dtype, max_num_seqs=batch_size,
                       seed=seed, trust_remote_code=trust_remote_code, lora_rank=lora_rank)


def node_backend(cfg: NodeConfig, policy: Policy) -> GenerationBackend:
    """The backend a node of config ``cfg`` samples with (``generation.*``)."""
    g, m = cfg.generation, cfg.model
    return build_backend(policy, g.backend, batch_size=g.batch_size, dtype=m.dtype, seed=cfg.seed, hf=g.hf,
                         vllm=g.vllm, trust_remote_code=m.trust_remote_code, lora_rank=cfg.adapter.rank)
