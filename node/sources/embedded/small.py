"""The second embedded model, ``small-base``: its byte-level BPE tokenizer and ChatML chat template.

The folder ``node/sources/assets/small-base/`` is written by ``scripts/build/build_small_base.py``, which trains the
tokenizer with ``train_bpe_tokenizer`` on the task corpora and then pretrains a small Llama model on
formatted solutions. This module holds what the build and the tests share; the node itself loads the
folder like any other model and needs nothing from here.

Tokenizer contract (as for Qwen2.5's): byte-level, so ``decode(encode(s)) == s`` for every string; every
digit is its own token; no special token is added on ``encode`` and there is no BOS; ``<|im_end|>`` ends
a turn and is the EOS, ``<|endoftext|>`` pads. Pieces are not split at spaces before merging, so phrases
every prompt repeats (the answer instruction, the system prompt, role headers) become a few tokens and
sequences stay short enough to train on a CPU.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

SMALL_BASE_NAME = "small-base"

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD_TOKEN, IM_START, IM_END)

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

MODEL_MAX_LENGTH = 512

_SPECIAL_SPLIT = re.compile("|".join(re.escape(t) for t in SPECIAL_TOKENS))


def _backend() -> Tokenizer:
    """An untrained byte-level BPE: digits isolated, bytes mapped, ``<|...|>`` tokens registered."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    return backend


def _wrap(backend: Tokenizer) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        eos_token=IM_END,
        additional_special_tokens=[IM_START],
        model_max_length=MODEL_MAX_LENGTH,
        clean_up_tokenization_spaces=False,
        padding_side="left",
        chat_template=CHAT_TEMPLATE,
    )


def template_tokenizer() -> PreTrainedTokenizerFast:
    """A tokenizer with the chat template but no merges yet: enough to format prompts for the corpus."""
    return _wrap(_backend())


def split_on_special(texts: Iterable[str]) -> Iterator[str]:
    """The pieces of ``texts`` between special tokens: what the BPE model sees (special tokens never merge)."""
    for text in texts:
        for piece in _SPECIAL_SPLIT.split(text):
            if piece:
                yield piece


def train_bpe_tokenizer(texts: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Train the BPE merges on ``texts`` (formatted prompts and completions, special tokens included).

    Deterministic for the same texts in the same order. The 256 byte symbols are always in the vocabulary,
    so any text encodes; the special tokens take ids 0, 1, 2.
    """
    backend = _backend()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(split_on_special(texts), trainer=trainer)
    return _wrap(backend)
