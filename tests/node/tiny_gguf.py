"""A tiny GGUF written here with the gguf package: a 2-layer Llama with a byte-level BPE tokenizer and a ChatML
template, its weights quantized (Q4_1, Q8_0) as a real GGUF's are, about 90 KB. It lets the conversion of any
local GGUF be tested in seconds, beside the one real model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, quants
from gguf.quants import quant_shape_to_byte_shape, quantize
from tokenizers import pre_tokenizers

CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
HIDDEN, LAYERS, HEADS, KV_HEADS, INTERMEDIATE = 64, 2, 4, 2, 128


def write_tiny_gguf(path: Path, *, seed: int = 0, architecture: str = "llama",
                    matrix_type: GGMLQuantizationType = GGMLQuantizationType.Q4_1,
                    extra_tokens: tuple[str, ...] = ()) -> Path:
    """Write the tiny model to ``path``; ``seed`` changes the weights (and so the file's sha256);
    ``extra_tokens`` are appended to the vocabulary as written (e.g. in raw text, as some GGUFs do)."""
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *sorted(pre_tokenizers.ByteLevel.alphabet()), "he", "ll",
              *extra_tokens]
    writer = GGUFWriter(str(path), architecture)
    writer.add_block_count(LAYERS)
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(INTERMEDIATE)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3, 3, 3] + [1] * (len(tokens) - 3))
    writer.add_token_scores([0.0] * len(tokens))
    writer.add_token_merges(["h e", "l l"])
    writer.add_vocab_size(len(tokens))
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_chat_template(CHAT_TEMPLATE)
    rng = np.random.default_rng(seed)

    def tensor(name: str, shape: tuple[int, ...], qtype: GGMLQuantizationType = GGMLQuantizationType.F32) -> None:
        spread = 0.02 if len(shape) == 1 else 0.5 / np.sqrt(shape[-1])  # norms near 1, matrices keep the scale
        values = ((1.0 if len(shape) == 1 else 0.0) + rng.standard_normal(shape) * spread).astype(np.float32)
        if qtype == GGMLQuantizationType.F32:
            writer.add_tensor(name, values)
        elif qtype in quants._type_traits:
            writer.add_tensor(name, quantize(values, qtype), raw_dtype=qtype)
        else:  # a type the gguf package cannot (de)quantize: zero bytes of the right size
            writer.add_tensor(name, np.zeros(quant_shape_to_byte_shape(shape, qtype), np.uint8), raw_dtype=qtype)

    kv_width = KV_HEADS * HIDDEN // HEADS
    tensor("token_embd.weight", (len(tokens), HIDDEN), GGMLQuantizationType.Q8_0)
    tensor("output_norm.weight", (HIDDEN,))
    for i in range(LAYERS):
        tensor(f"blk.{i}.attn_norm.weight", (HIDDEN,))
        tensor(f"blk.{i}.ffn_norm.weight", (HIDDEN,))
        for name, shape in (("attn_q", (HIDDEN, HIDDEN)), ("attn_k", (kv_width, HIDDEN)), ("attn_v", (kv_width, HIDDEN)),
                            ("attn_output", (HIDDEN, HIDDEN)), ("ffn_gate", (INTERMEDIATE, HIDDEN)),
                            ("ffn_up", (INTERMEDIATE, HIDDEN)), ("ffn_down", (HIDDEN, INTERMEDIATE))):
            tensor(f"blk.{i}.{name}.weight", shape, matrix_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# What transformers' GGUF loader (transformers.modeling_gguf_pytorch_utils) undoes, done here as llama.cpp's
# converter does it: Llama's q and k rows permuted for its rotary layout, Gemma's norms stored as 1 + w.
_PERMUTED_QK = frozenset({"llama"})
_NORM_OFFSET = frozenset({"gemma2", "gemma3"})


def _permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's permutation of a q or k projection (its rotary pairs interleaved), which transformers'
    ``LlamaTensorProcessor._reverse_permute_weights`` inverts."""
    return (weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def gguf_architecture(model_type: str) -> str:
    """The GGUF architecture llama.cpp writes a model of ``model_type`` as (Mistral: a Llama named so)."""
    return {"mistral": "llama", "gemma3_text": "gemma3"}.get(model_type, model_type)


def write_model_gguf(model: Any, tokenizer: Any, path: Path, *, name: str | None = None) -> Path:
    """Write the transformers ``model`` (float32, a family of ``node.policy.families``) and its byte-level BPE
    ``tokenizer`` to a GGUF at ``path`` as llama.cpp's converter would (F32 tensors): the config keys
    transformers reads back, the tensors under GGUF names, and the layout changes its loader inverts."""
    from gguf import MODEL_ARCH_NAMES, GGUFWriter, get_tensor_name_map

    config = model.config
    arch = gguf_architecture(config.model_type)
    writer = GGUFWriter(str(path), arch)
    writer.add_name(name or config.model_type)  # transformers reads a "llama" named mistral as a Mistral
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(float(config.rope_parameters.get("rope_theta", 10000.0)
                                    if "rope_theta" in config.rope_parameters
                                    else config.rope_parameters["full_attention"]["rope_theta"]))
    writer.add_rope_dimension_count(head_dim)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    if getattr(config, "sliding_window", None):
        writer.add_sliding_window(config.sliding_window)
    writer.add_vocab_size(config.vocab_size)
    _add_tokenizer(writer, tokenizer)
    ends = model.generation_config.eos_token_id
    ends = [i for i in ([ends] if isinstance(ends, int) else ends or []) if i != tokenizer.eos_token_id]
    if ends:  # an instruct model's end of turn (Gemma's <end_of_turn>), as llama.cpp writes it
        writer.add_eot_token_id(ends[0])
    arch_id = next(k for k, v in MODEL_ARCH_NAMES.items() if v == arch)
    names = get_tensor_name_map(arch_id, config.num_hidden_layers)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    for hf_name, tensor in model.state_dict().items():
        if tied and hf_name == "lm_head.weight":
            continue  # no output.weight: transformers ties the output layer to the embeddings
        base, suffix = hf_name.rsplit(".", 1)
        gguf_name = names.get_name(base)
        if gguf_name is None:
            raise ValueError(f"no GGUF name for {hf_name} of a {arch}")
        values = tensor.detach().float().numpy().copy()
        if arch in _PERMUTED_QK and base.endswith("self_attn.q_proj") and suffix == "weight":
            values = _permute(values, config.num_attention_heads)
        elif arch in _PERMUTED_QK and base.endswith("self_attn.k_proj") and suffix == "weight":
            values = _permute(values, config.num_key_value_heads)
        if arch in _NORM_OFFSET and "norm" in base and suffix == "weight":
            values = values + 1.0
        writer.add_tensor(f"{gguf_name}.{suffix}", values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _add_tokenizer(writer: Any, tokenizer: Any) -> None:
    """``tokenizer`` as GGUF metadata: a byte-level BPE as ``tokenizer.ggml.model = gpt2`` (tokens, merges),
    a sentencepiece-style one with byte fallback (Gemma's kind) as ``llama`` (tokens, scores in merge order,
    byte tokens typed as such), special tokens as control tokens, the special ids, whether a BOS is added and
    the chat template."""
    import json

    state = json.loads(tokenizer.backend_tokenizer.to_str())
    vocab = tokenizer.get_vocab()
    tokens = [token for token, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    special = set(tokenizer.all_special_ids)
    sentencepiece = bool(state["model"].get("byte_fallback"))
    types = [3 if i in special else 6 if sentencepiece and t.startswith("<0x") and len(t) == 6 else 1
             for i, t in enumerate(tokens)]
    writer.add_tokenizer_model("llama" if sentencepiece else "gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    if sentencepiece:  # merges are rebuilt from the token order (transformers' gemma_tokenizer)
        writer.add_token_scores([-float(i) for i in range(len(tokens))])
        writer.add_add_space_prefix(False)
    else:
        writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in state["model"]["merges"]])
    adds_bos = tokenizer.bos_token_id is not None and tokenizer("a")["input_ids"][:1] == [tokenizer.bos_token_id]
    for key, value in (("bos", tokenizer.bos_token_id), ("eos", tokenizer.eos_token_id),
                       ("pad", tokenizer.pad_token_id), ("unk", tokenizer.unk_token_id)):
        if value is not None:
            getattr(writer, f"add_{key}_token_id")(value)
    writer.add_add_bos_token(adds_bos)
    if tokenizer.chat_template:
        writer.add_chat_template(tokenizer.chat_template)
