"""Tiny random models of every family ``node.policy.families`` names, built from transformers' own config
classes and saved as a user's model folder is (``save_pretrained`` and a tokenizer): what the family matrix
(``test_families.py``) and the mixed-family swarm tests load through the node's own path.

Each model has two decoder layers of width 64 and an output layer ``EXTRA_VOCAB`` ids wider than its
tokenizer (as Qwen2.5's and Phi-3's are), so the special-token mask of ids past the tokenizer is exercised.
Its weights are drawn at the scale a trained model's have (``1/sqrt(width)``), and every norm weight and
bias is moved off its initial value (Gemma's ``1 + w`` norms start at zero, Qwen2's q/k/v biases at zero):
a loader that drops a bias or an offset changes the logits.
"""

from __future__ import annotations

import math
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    Gemma2Config,
    Gemma3TextConfig,
    LlamaConfig,
    MistralConfig,
    Phi3Config,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2Config,
    Qwen3Config,
)

from node.sources.embedded.catalog import embedded_model
from node.sources.hf_folder import save_tokenizer

HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE = 64, 2, 4, 2, 16, 128
EXTRA_VOCAB = 64
"""Ids of the output layer past the tokenizer's last (Qwen2.5: 151,936 for 151,665 ids)."""


@dataclass(frozen=True)
class TinyFamily:
    """How to build one family's tiny model: its config class, the arguments its family needs, and the tokens
    besides the tokenizer's eos its generation config ends a completion at (as the family's instruct models'
    do: Qwen2.5's and Qwen3's ``<|endoftext|>`` beside ``<|im_end|>``, Gemma's ``<end_of_turn>`` beside ``<eos>``)."""

    name: str  # node.policy.families name
    config_class: type[PretrainedConfig]
    options: tuple[tuple[str, Any], ...] = ()
    end_tokens: tuple[str, ...] = ()


TINY: dict[str, TinyFamily] = {f.name: f for f in (
    TinyFamily("llama", LlamaConfig, (("head_dim", HEAD_DIM),)),
    TinyFamily("mistral", MistralConfig, (("head_dim", HEAD_DIM), ("sliding_window", None))),  # v0.2 on: none
    TinyFamily("qwen2", Qwen2Config, end_tokens=("<|endoftext|>",)),
    # transformers reads no head width from a Qwen3 GGUF: its default (128) is the real models' and this one's
    TinyFamily("qwen3", Qwen3Config, (("head_dim", 128),), ("<|endoftext|>",)),
    # a window shorter than the matrix's sequences, so the sliding layers' masks are exercised
    TinyFamily("gemma2", Gemma2Config, (("head_dim", HEAD_DIM), ("sliding_window", 8)), ("<end_of_turn>",)),
    TinyFamily("gemma3", Gemma3TextConfig, (("head_dim", HEAD_DIM), ("sliding_window", 8)), ("<end_of_turn>",)),
    TinyFamily("phi3", Phi3Config),
)}
NAMES = tuple(TINY)
TITLES = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3", "gemma2": "Gemma 2",
          "gemma3": "Gemma 3", "phi3": "Phi-3"}
"""Each family as docs/models.md and the README name it."""


def shared_tokenizer() -> PreTrainedTokenizerBase:
    """small-base's tokenizer (byte-level BPE, 2,048 ids, ChatML specials, no BOS): the one every tiny model
    of the matrix is saved with."""
    model = embedded_model("small-base")
    assert model is not None
    return AutoTokenizer.from_pretrained(str(model.path))


GEMMA_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<start_of_turn>"
                  "{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n{{ m['content'] }}<end_of_turn>\n"
                  "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
"""Gemma's chat template in short: a BOS first, turns between ``<start_of_turn>`` and ``<end_of_turn>``."""


def gemma_tokenizer() -> PreTrainedTokenizerBase:
    """A tokenizer of Gemma's kind, small: sentencepiece-style BPE with byte fallback (``<0x00>`` ...), Gemma's
    special ids (pad 0, eos 1, bos 2, unk 3, mask 4), a BOS added to every encoding, and ``<start_of_turn>`` /
    ``<end_of_turn>`` turn markers (special tokens; an instruct model's generation config ends a completion at
    ``<end_of_turn>`` beside ``<eos>``)."""
    from transformers import GemmaTokenizer
    from transformers.tokenization_utils_base import generate_merges

    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"]
    pieces = ["\u2581", *string.ascii_letters, *string.digits, *string.punctuation, "\n"]
    words = ["\u2581t", "he", "\u2581the", "\u2581a", "an", "\u2581an", "sw", "er", "\u2581answer", "in", "\u2581in"]
    tokens = [*specials, *(f"<0x{b:02X}>" for b in range(256)), *pieces, *words]
    vocab = {token: i for i, token in enumerate(tokens)}
    merges = generate_merges(vocab, {token: -i for i, token in enumerate(tokens)}, skip_tokens=specials)
    return GemmaTokenizer(vocab=vocab, merges=merges, chat_template=GEMMA_TEMPLATE,
                          additional_special_tokens=["<start_of_turn>", "<end_of_turn>"], add_bos_token=True)


def family_tokenizer(name: str) -> PreTrainedTokenizerBase:
    """The tokenizer the matrix gives family ``name``: Gemma's kind for Gemma 2 and 3 (their BOS, their turn
    markers), the shared one for the others."""
    return gemma_tokenizer() if name.startswith("gemma") else shared_tokenizer()


def tiny_config(name: str, tokenizer: PreTrainedTokenizerBase, *, extra_vocab: int = EXTRA_VOCAB) -> PretrainedConfig:
    """The family's config at the matrix's sizes, its special ids the tokenizer's."""
    family = TINY[name]
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    config = family.config_class(
        hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
        intermediate_size=INTERMEDIATE, vocab_size=len(tokenizer) + extra_vocab, max_position_embeddings=512,
        initializer_range=1 / math.sqrt(HIDDEN), bos_token_id=tokenizer.bos_token_id, eos_token_id=eos,
        pad_token_id=pad, **dict(family.options))
    return config


def build_tiny(name: str, tokenizer: PreTrainedTokenizerBase, *, seed: int = 0,
               extra_vocab: int = EXTRA_VOCAB) -> PreTrainedModel:
    """A random model of family ``name`` (float32, eval mode) for ``tokenizer``."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(name, tokenizer, extra_vocab=extra_vocab),
                                             dtype=torch.float32)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 1:  # norms and biases: away from 0 and 1, where a dropped one would not show
                param.add_(torch.randn_like(param) * 0.2)
    ends = [tokenizer.convert_tokens_to_ids(t) for t in TINY[name].end_tokens]
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, *ends] if ends else tokenizer.eos_token_id
    model.generation_config.pad_token_id = model.config.pad_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    return model.eval()


def save_tiny(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, folder: Path) -> Path:
    """``folder`` as a user's model folder: ``save_pretrained`` weights and configs, and the tokenizer."""
    model.save_pretrained(folder, safe_serialization=True)
    save_tokenizer(tokenizer, folder, model_max_length=512)
    return folder


def tiny_folder(name: str, folder: Path, tokenizer: PreTrainedTokenizerBase | None = None, *,
                seed: int = 0) -> Path:
    """Build family ``name``'s tiny model for ``tokenizer`` (default: the shared one) and save it in ``folder``."""
    tokenizer = tokenizer or shared_tokenizer()
    return save_tiny(build_tiny(name, tokenizer, seed=seed), tokenizer, folder)
