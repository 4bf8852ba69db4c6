"""A tiny GGUF written here with the gguf package: a 2-layer Llama with a byte-level BPE tokenizer and a ChatML
template, its weights quantized (Q4_1, Q8_0) as a real GGUF's are, about 90 KB. It lets the conversion of any
local GGUF be tested in seconds, beside the one real model."""

from __future__ import annotations

from pathlib import Path

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
