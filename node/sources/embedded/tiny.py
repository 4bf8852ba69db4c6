"""The embedded default model: a tiny Llama with a character-level tokenizer, shipped in the package.

The folder ``node/sources/assets/tiny-base/`` is produced by ``scripts/build/build_tiny_base.py`` and loads through
``AutoModelForCausalLM`` / ``AutoTokenizer`` like any hub model, so a config names it ``tiny-base`` and
the same loading code serves ``Qwen/Qwen2.5-0.5B-Instruct``.

Tokenizer contract: one id per character, ``decode(encode(s)) == s`` for in-vocabulary text, and no
special tokens are added automatically (``encode`` never prepends ``<bos>``): the generator prepends
``bos_token_id`` itself when the tokenizer has one.
"""

from __future__ import annotations

import logging

from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

from node.sources.locate import (  # noqa: F401  -- re-exported: the embedded model's name and folder
    EMBEDDED_ALIASES,
    TINY_BASE_NAME,
    resolve_model_path,
    tiny_base_path,
)

logger = logging.getLogger(__name__)

PAD_TOKEN = "<pad>"
BOS_TOKEN = "<bos>"
EOS_TOKEN = "<eos>"
UNK_TOKEN = "<unk>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN)

# Ordinary symbols, one token each: digits, lowercase letters, space, punctuation and a newline.
CHAR_VOCAB: tuple[str, ...] = tuple("0123456789abcdefghijklmnopqrstuvwxyz +-*=/.,:?()\n")

MODEL_MAX_LENGTH = 64


def char_vocab() -> dict[str, int]:
    """Return the token -> id map: special tokens first (``<pad>`` = 0), then ``CHAR_VOCAB`` in order."""
    tokens = list(SPECIAL_TOKENS) + list(CHAR_VOCAB)
    return {token: index for index, token in enumerate(tokens)}


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """Build the character-level tokenizer (a BPE with no merges, so every character is one token).

    No pre-tokenizer (spaces and newlines are ordinary characters), no post-processor (no special
    tokens added on ``encode``), and a ``Fuse`` decoder that joins tokens without separators.
    """
    model = models.BPE(vocab=char_vocab(), merges=[], unk_token=UNK_TOKEN)
    backend = Tokenizer(model)
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        model_max_length=MODEL_MAX_LENGTH,
        clean_up_tokenization_spaces=False,
        padding_side="left",
    )
    return tokenizer
