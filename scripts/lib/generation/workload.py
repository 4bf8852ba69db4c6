"""What the generation benchmarks share: the models they load (embedded, fetched, or random weights of a hub
model's shape), the prompts a step samples from, a step's workload at a scale, and the vLLM engine's settings."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from node.config import AdapterConfig, ModelConfig, VllmConfig
from node.errors import PolicyError
from node.policy.model import Policy, build_policy
from node.sources.embedded.catalog import embedded_model
from node.sources.embedded.tiny import build_char_tokenizer, resolve_model_path

# sequences (tasks x group) and new tokens of one step, per model, at --scale 1
WORKLOADS = {"tiny": (256, 8), "small": (256, 64), "small-long": (256, 64), "qwen0.5b": (32, 32), "smollm2": (64, 64)}
TASKS = {"smollm2": ("reasoning_gym", ["basic_arithmetic"])}  # a model's prompts (default: arith addition, raw)
NODE_CONFIGS = {"tiny": "configs/tiny-silo.yaml", "small": "configs/small-silo.yaml",
                "smollm2": "configs/smollm2-silo.yaml"}  # the adapter the node trains each model with


def random_model_folder(kind: str, root: Path, dtype: torch.dtype) -> str:
    """Save a random-init model of the named shape (and the char tokenizer, for its special ids) to a folder."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    tok = build_char_tokenizer()
    special = dict(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    if kind == "small":
        cfg: Any = LlamaConfig(vocab_size=8192, hidden_size=512, intermediate_size=1024, num_hidden_layers=8,
                          num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=1024,
                          tie_word_embeddings=True, **special)
        model: Any = LlamaForCausalLM(cfg)
    else:  # Qwen2.5-0.5B's shape
        cfg = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                          num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                          rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, rms_norm_eps=1e-6,
                          tie_word_embeddings=True, **special)
        model = Qwen2ForCausalLM(cfg)
    folder = root / kind
    model.to(dtype).save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def load_model(kind: str, root: Path, dtype: str, device: str,
               adapter: AdapterConfig | None = None) -> tuple[Policy, str, str, bool]:
    """The policy, the folder its base model loads from, a label, and whether its tokenizer can encode the
    node's task prompts (else the prompts are random ids). The adapter: rank 8 on every projection, no
    trained norms, unless ``adapter`` says otherwise."""
    adapter = adapter or AdapterConfig(train_norms=False)
    if kind == "tiny":
        return build_policy(ModelConfig(name_or_path="tiny-base", dtype=dtype, device=device), adapter, 0), \
            resolve_model_path("tiny-base"), "tiny-base", True
    if kind == "small":
        try:
            policy = build_policy(ModelConfig(name_or_path="small-base", dtype=dtype, device=device), adapter, 0)
            from node.generation.vllm_engine import base_model_path

            return policy, base_model_path(policy), "small-base", True
        except PolicyError:
            pass
    if kind == "smollm2":
        from node.generation.vllm_engine import base_model_path

        policy = build_policy(ModelConfig(name_or_path="smollm2-135m", dtype=dtype, device=device), adapter, 0)
        return policy, base_model_path(policy), "smollm2-135m (pretrained)", True
    if kind == "small-long":  # small-base's config and tokenizer, fresh weights
        small_base = embedded_model("small-base")
        assert small_base is not None
        folder = random_weights_copy(str(small_base.path), root / kind, getattr(torch, dtype))
        policy = build_policy(ModelConfig(name_or_path=folder, dtype=dtype, device=device), adapter, 0)
        return policy, folder, "small-base shape, random weights (long completions)", True
    folder = random_model_folder(kind, root, getattr(torch, dtype))
    policy = build_policy(ModelConfig(name_or_path=folder, dtype=dtype, device=device), adapter, 0)
    label = "small-base stand-in (random init)" if kind == "small" else "Qwen2.5-0.5B shape (random init)"
    return policy, folder, label, False


def random_weights_copy(source: str, folder: Path, dtype: torch.dtype) -> str:
    """A copy of the model folder ``source`` (config, tokenizer) with freshly initialised weights (seed 0)."""
    import shutil

    from transformers import AutoConfig, AutoModelForCausalLM

    shutil.copytree(source, folder, ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(source)).to(dtype).save_pretrained(folder)
    return str(folder)


def step_prompts(policy: Policy, n: int, *, tasks: bool, kind: str = "") -> list[list[int]]:
    """``n`` prompts, 8 copies each (a group): arithmetic tasks formatted for the model when its tokenizer
    can encode them (``tasks``), else random ids of 24 to 39 tokens (random-init models of a hub shape)."""
    distinct = max(1, n // 8)
    if tasks:
        import random

        from node.generation.rollouts import encode_prompt
        from node.tasks import build_task_source

        name, datasets = TASKS.get(kind, ("arith", ["add"]))
        source = build_task_source(name, datasets, None, 0, chat_template="auto")
        refs = source.sample(distinct, random.Random(0))
        prompts = [encode_prompt(policy, source.format_prompt(source.task(r), policy.tokenizer)) for r in refs]
    else:
        gen = torch.Generator().manual_seed(0)
        vocab = int(policy.model.config.vocab_size)  # type: ignore[union-attr,arg-type]
        prompts = [[1, *torch.randint(4, vocab, (23 + i % 16,), generator=gen).tolist()] for i in range(distinct)]
    return [prompts[i // 8 % len(prompts)] for i in range(n)]


def sync_device() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def engine_config(args: argparse.Namespace, sync: str = "merge", *, compiled: bool = False) -> VllmConfig:
    return VllmConfig(sync=sync, kv_cache_memory_bytes=args.kv_bytes, enforce_eager=not compiled)  # type: ignore[arg-type]


def workload(kind: str, args: argparse.Namespace) -> tuple[int, int]:
    """Sequences and new tokens of a step: the model's workload times ``--scale``, or as given."""
    sequences, tokens = WORKLOADS[kind]
    sequences, tokens = max(1, int(sequences * args.scale)), max(1, int(tokens * args.scale))
    return args.sequences or sequences, args.tokens or tokens
