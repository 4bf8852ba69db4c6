"""The node's policy: a frozen base causal LM with trainable adapters (peft LoRA or ReMix) and, optionally,
trainable RMSNorm weights.

The embedded default (``tiny-base``) and a user's model (``Qwen/Qwen2.5-0.5B-Instruct`` or a local folder)
load through the same ``AutoModelForCausalLM`` / ``AutoTokenizer`` path.
"""

from __future__ import annotations

import hashlib
import json
import logging
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from node.config import AdapterConfig, ModelConfig
from node.errors import PolicyError
from node.policy.families import resolve_targets
from node.policy.special import mask_output
from node.sources.check import Finding, check_agreement_with, check_folder, refuse
from node.sources.embedded.catalog import embedded_names
from node.sources.fetched import fetch_command, registry_model
from node.sources.locate import ModelLocation, locate_model

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def device_memory_mb(device: torch.device, cap_mb: int | None = None) -> int | None:
    """The device memory a node on ``device`` may take, in MiB: the card's, or ``cap_mb`` below it (None on
    the CPU)."""
    if device.type != "cuda":
        return None
    total = int(torch.cuda.get_device_properties(device).total_memory // 2**20)
    return total if cap_mb is None else min(total, cap_mb)


def cap_device_memory(device: torch.device, cap_mb: int | None) -> None:
    """Hold this process to ``cap_mb`` of ``device``'s memory (``model.memory_mb``): past it the CUDA allocator
    raises out-of-memory instead of taking what other nodes on the card use."""
    if device.type != "cuda" or cap_mb is None:
        return
    total = torch.cuda.get_device_properties(device).total_memory / 2**20
    index = torch.cuda.current_device() if device.index is None else device.index  # "cuda" names no index
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap_mb / total), index)
    logger.info("device memory held to %d of %.0f MiB (model.memory_mb)", min(cap_mb, total), total)


def device_label(device: torch.device) -> str:
    """``cpu``, or ``cuda:0 (NVIDIA H100 80GB HBM3)``: where the node runs, as its start line and status say."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"cuda:{index} ({torch.cuda.get_device_name(index)})"
    return str(device)


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """A hash of the vocabulary and the settings that change token ids: equal fingerprints, equal ids."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    settings = {
        "cls": type(tokenizer).__name__,
        "special": {k: str(v) for k, v in sorted(tokenizer.special_tokens_map.items())},
        "vocab": vocab,
    }
    blob = json.dumps(settings, sort_keys=True, ensure_ascii=False).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def model_fingerprint(name_or_path: str, model: PreTrainedModel) -> str:
    """Names the base model: its config (architecture and sizes) and where it came from."""
    cfg = model.config.to_dict()
    keep = {k: cfg.get(k) for k in ("model_type", "hidden_size", "num_hidden_layers", "vocab_size")}
    blob = json.dumps({"name": name_or_path.rstrip("/").split("/")[-1], **keep}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def load_base(cfg: ModelConfig) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load the base model and tokenizer by name or path; the model comes back frozen, in eval mode.

    The tokenizer is checked before the weights load (``check_loaded``): a folder whose tokenizer disagrees
    with its configs, its GGUF or its golden record is refused in one line."""
    where = locate_model(cfg.name_or_path, gguf_file=cfg.gguf_file)  # a hub name not in the cache fails here
    if where.build is not None:
        where.build()  # a model made once on this machine and cached (e.g. fetched and converted)
    options: dict[str, Any] = {"trust_remote_code": cfg.trust_remote_code, "local_files_only": where.local_files_only}
    folder = Path(where.path) if Path(where.path).is_dir() else None
    tokenizer = _from_pretrained(cfg, AutoTokenizer, where.path, **options)
    if folder is not None:
        check_loaded(where, cfg.name_or_path, check_folder(folder, tokenizer, golden_name=where.golden))
    model = _from_pretrained(cfg, AutoModelForCausalLM, where.path, dtype=_DTYPES[cfg.dtype], **options)
    if folder is None:  # a hub name in the local cache: its configs as loaded
        configs = {"config.json": model.config.to_dict(), "generation_config.json": model.generation_config.to_dict()}
        check_loaded(where, cfg.name_or_path, check_agreement_with(tokenizer, configs))
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token_id is None:
            raise PolicyError(f"tokenizer of {cfg.name_or_path!r} has neither a pad nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    model.requires_grad_(False)
    model.eval()
    return model, tokenizer


def _from_pretrained(cfg: ModelConfig, loader: Any, path: str, **options: Any) -> Any:
    try:
        return loader.from_pretrained(path, **options)
    except (OSError, ValueError) as exc:
        raise PolicyError(
            f"model.name_or_path={cfg.name_or_path!r} could not be loaded ({str(exc).strip().splitlines()[0]}); "
            f"give a local folder in save_pretrained format, a model in the local Hugging Face cache, or one of "
            f"{embedded_names()}"
        ) from exc


def check_loaded(where: ModelLocation, name: str, findings: list[Finding]) -> None:
    """Refuse (one ``PolicyError`` line) a model whose tokenizer disagrees with its configs, with what its
    conversion recorded of its GGUF, or with the repository's golden record of it (``node.sources.check``),
    naming the command that fixes it."""
    fetched = registry_model(where.golden or "")
    if fetched is not None:
        fix = f"run `{fetch_command(fetched.name)}` to convert it again"
    elif where.golden is not None:
        fix = "the package's model folder was changed: reinstall swarm-node"
    else:
        fix = "make its tokenizer and configs agree, or convert it again (`swarm-node fetch` for a .gguf file)"
    folder = Path(where.path)
    refuse(findings, model=name, folder=folder if folder.is_dir() else None, fix=fix)


def _norm_module_names(model: nn.Module) -> list[str]:
    """Leaf names of the RMSNorm-like modules (``input_layernorm``, ``post_attention_layernorm``, ``norm``)."""
    names = {name.rsplit(".", 1)[-1] for name, mod in model.named_modules() if type(mod).__name__.endswith("RMSNorm")}
    return sorted(names)


def _attach_lora(model: PreTrainedModel, cfg: AdapterConfig) -> nn.Module:
    from peft import LoraConfig, get_peft_model

    targets = resolve_targets(model, cfg.target_modules)
    present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = [t for t in targets if t not in present]
    if missing or not targets:
        linear = {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, nn.Linear)}
        what = (f"adapter.target_modules {missing} are not modules of this model" if targets else
                "adapter.target_modules=auto found no linear layer inside this model's decoder layers")
        raise PolicyError(f"{what}; name some of its own: it has e.g. {sorted(linear - {'lm_head'})[:8]}")
    logger.info("LoRA on %s", ", ".join(targets))
    lora = LoraConfig(
        r=cfg.rank,
        lora_alpha=cfg.alpha,  # type: ignore[arg-type]  # peft accepts floats
        lora_dropout=cfg.dropout,
        target_modules=targets,
        modules_to_save=_norm_module_names(model) if cfg.train_norms else None,
        bias="none",
        task_type="CAUSAL_LM",
    )
    with warnings.catch_warnings():  # peft reads a property transformers deprecated: not the user's concern
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        return get_peft_model(model, lora)


def _attach_remix(model: PreTrainedModel, cfg: AdapterConfig) -> tuple[nn.Module, Any]:
    from node.policy.remix.attach import attach_remix

    adapter = attach_remix(model, n=cfg.remix.n, k=cfg.remix.k, rank=cfg.rank, scale=cfg.remix.scale, alpha=cfg.alpha,
                           centre=cfg.remix.centre)
    if cfg.train_norms:
        for name, mod in model.named_modules():
            if type(mod).__name__.endswith("RMSNorm"):
                mod.requires_grad_(True)
                logger.debug("training norm %s", name)
    return model, adapter


@dataclass
class Policy:
    """The trainable policy and everything generation and training need to know about it."""

    model: nn.Module
    tokenizer: PreTrainedTokenizerBase
    device: torch.device
    name_or_path: str
    tokenizer_fingerprint: str
    model_fingerprint: str
    remix: Any = None  # node.policy.remix.adapter.RemixAdapter when adapter.kind == "remix"
    param_groups: dict[str, list[nn.Parameter]] = field(default_factory=dict)

    @property
    def context_length(self) -> int | None:
        """The longest prompt plus completion the model takes (its position embeddings), if it says."""
        n = getattr(getattr(self.model, "config", None), "max_position_embeddings", None)
        return int(n) if n else None

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """Every trainable tensor by parameter name: what a checkpoint stores."""
        # copies: with the fused pass the parameters are views of one flat tensor, which a file must not share
        return {n: p.detach().to("cpu", copy=True).contiguous() for n, p in self.model.named_parameters()
                if p.requires_grad}

    def load_trainable_state(self, state: dict[str, torch.Tensor]) -> None:
        params = {n: p for n, p in self.model.named_parameters() if p.requires_grad}
        if set(params) != set(state):
            missing, extra = sorted(set(params) - set(state)), sorted(set(state) - set(params))
            raise PolicyError(
                f"checkpoint adapters do not match this policy (missing {missing[:3]}, unexpected {extra[:3]}); "
                "was it written with another adapter config?"
            )
        with torch.no_grad():
            for name, tensor in state.items():
                if params[name].shape != tensor.shape:
                    raise PolicyError(f"checkpoint tensor {name} has shape {tuple(tensor.shape)}, expected "
                                      f"{tuple(params[name].shape)}")
                params[name].copy_(tensor)


def build_policy(model_cfg: ModelConfig, adapter_cfg: AdapterConfig, seed: int) -> Policy:
    """Load the base, attach adapters, split trainable parameters into optimizer groups."""
    torch.manual_seed(seed)  # adapter initialisation is part of the run's seeded state
    base, tokenizer = load_base(model_cfg)
    mask_output(base, tokenizer)  # the policy never samples a special token but its end-of-sequence ids
    device = pick_device(model_cfg.device)
    cap_device_memory(device, model_cfg.memory_mb)
    remix = None
    if adapter_cfg.kind == "lora":
        model = _attach_lora(base, adapter_cfg)
    else:
        model, remix = _attach_remix(base, adapter_cfg)
    model.to(device)
    groups: dict[str, list[nn.Parameter]] = {"adapter": [], "norm": [], "router": []}
    router_ids = set()
    if remix is not None:
        router_ids = {id(p) for p in remix.trainable_parameters()["router"]}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if id(p) in router_ids:
            groups["router"].append(p)
        elif any("norm" in part for part in name.split(".")):
            groups["norm"].append(p)
        else:
            groups["adapter"].append(p)
    n_train = sum(p.numel() for g in groups.values() for p in g)
    n_total = sum(p.numel() for p in model.parameters())
    logger.info("policy %s: %d trainable of %d parameters (%s)", model_cfg.name_or_path, n_train, n_total,
                {k: sum(p.numel() for p in v) for k, v in groups.items()})
    return Policy(
        model=model,
        tokenizer=tokenizer,
        device=device,
        name_or_path=model_cfg.name_or_path,
        tokenizer_fingerprint=tokenizer_fingerprint(tokenizer),
        model_fingerprint=model_fingerprint(model_cfg.name_or_path, base),
        remix=remix,
        param_groups={k: v for k, v in groups.items() if v},
    )
