"""Every mode the configuration can select, as ``Literal`` types, defined once.

Imported by the typed config (``node.config``) and by the pure modules that implement the modes
(advantages, losses, the SAPO sampler, prompting), so a mode is spelled in exactly one place. This
module imports nothing heavy: the config must validate before torch is loaded.
"""

from __future__ import annotations

from typing import Literal, get_args

AdvantageKind = Literal["rloo", "grpo", "global"]
LossKind = Literal["topr", "rec", "grpo", "reinforce"]
LossDenominator = Literal["batch", "fixed"]
SelectionPolicy = Literal["uniform", "highest_reward", "round_robin"]
DatasetPreference = Literal["none", "own_mixture", "low_signal", "both", "learning_band"]
PeerSlots = Literal["fixed", "flat"]
TakePeers = Literal["always", "decide"]
PeerFilter = Literal["none", "above_own"]
SamplingMode = Literal["standard", "ada_balanced", "ada_positive"]
ChatTemplateMode = Literal["auto", "always", "never"]
TaskSourceName = Literal["arith", "reasoning_gym"]
GenerationBackendName = Literal["hf", "vllm"]
EngineSync = Literal["auto", "merge", "lora"]
HfWeights = Literal["merged", "adapter"]

ADVANTAGE_KINDS: tuple[str, ...] = get_args(AdvantageKind)
LOSS_KINDS: tuple[str, ...] = get_args(LossKind)
LOSS_DENOMINATORS: tuple[str, ...] = get_args(LossDenominator)
SELECTION_POLICIES: tuple[str, ...] = get_args(SelectionPolicy)
DATASET_PREFERENCES: tuple[str, ...] = get_args(DatasetPreference)
PEER_FILTERS: tuple[str, ...] = get_args(PeerFilter)
PEER_SLOTS: tuple[str, ...] = get_args(PeerSlots)
TAKE_PEERS: tuple[str, ...] = get_args(TakePeers)
SAMPLING_MODES: tuple[str, ...] = get_args(SamplingMode)
CHAT_TEMPLATE_MODES: tuple[str, ...] = get_args(ChatTemplateMode)
TASK_SOURCES: tuple[str, ...] = get_args(TaskSourceName)
GENERATION_BACKENDS: tuple[str, ...] = get_args(GenerationBackendName)
ENGINE_SYNCS: tuple[str, ...] = get_args(EngineSync)
HF_WEIGHTS: tuple[str, ...] = get_args(HfWeights)
