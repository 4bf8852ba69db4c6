"""Where a library's GGUF conversion disagrees with what the GGUF states, the GGUF's value.

transformers 5.17 converts SmolLM2's GGUF with ``eos_token`` ``<|im_start|>`` (id 1) and no pad token, although
the file states ``tokenizer.ggml.eos_token_id = 2`` and ``padding_token_id = 2``; a node trained on that
conversion samples completions that never end where the model ends them. The fields a GGUF states and a
conversion can get wrong without changing the vocabulary are set back to the file's values here: special
tokens, whether a BOS is added (a Gemma GGUF's is lost), the ids in the model's config and generation config
(with the end-of-turn id a GGUF states among its eos ids), the chat template, and, for a byte-level BPE
(``tokenizer.ggml.model = gpt2``, which decodes losslessly), decoding that loses text
(``clean_up_tokenization_spaces``, a decoder other than byte-level). Each repair is returned as a record for ``build_info.json``; what cannot be
repaired (a different vocabulary) is left to the checks, which refuse it.
"""

from __future__ import annotations

from typing import Any

from node.sources.gguf.facts import SourceTokenizer
from node.sources.golden import FIXED_STRINGS

_BYTE_LEVEL = "tokenizer.ggml.model = gpt2: a byte-level BPE, which decodes losslessly"


def _record(field: str, library: Any, gguf: Any) -> dict[str, Any]:
    return {"field": field, "library": library, "gguf": gguf}


def lossless_failures(tokenizer: Any) -> list[str]:
    """The fixed strings a tokenizer does not give back unchanged after encoding and decoding."""
    failures = []
    for text in FIXED_STRINGS:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if tokenizer.decode(ids, skip_special_tokens=False) != text:
            failures.append(text)
    return failures


def _repair_special_tokens(tokenizer: Any, source: SourceTokenizer) -> list[dict[str, Any]]:
    repairs = []
    tokens = source.tokens or []
    for name, token_id in source.special_ids.items():
        found = getattr(tokenizer, f"{name}_token_id", None)
        if found == token_id or not 0 <= token_id < len(tokens):
            continue
        before = {"token": getattr(tokenizer, f"{name}_token", None), "id": found}
        setattr(tokenizer, f"{name}_token", tokens[token_id])
        repairs.append(_record(f"{name}_token", before, {"token": tokens[token_id], "id": token_id}))
    return repairs


def _repair_config_ids(model: Any, source: SourceTokenizer) -> list[dict[str, Any]]:
    repairs = []
    for holder, where in ((model.config, "config"), (model.generation_config, "generation_config")):
        for name in ("bos", "eos", "pad"):
            want = source.special_ids.get(name)
            found = getattr(holder, f"{name}_token_id", None)
            if want is None or found == want or (isinstance(found, list) and want in found):
                continue
            setattr(holder, f"{name}_token_id", want)
            repairs.append(_record(f"{where}.{name}_token_id", found, want))
    return repairs


def _repair_decoding(tokenizer: Any) -> list[dict[str, Any]]:
    """A byte-level BPE decodes every string it encodes back unchanged. The text clean-up (spaces dropped
    before punctuation) breaks that wherever a transformers version applies it (5.19 ignores it for a BPE,
    with a warning at every load), so it is switched off; where decoding still loses text, a decoder other
    than plain byte-level is replaced."""
    from tokenizers import decoders

    repairs: list[dict[str, Any]] = []
    if getattr(tokenizer, "clean_up_tokenization_spaces", False):
        tokenizer.clean_up_tokenization_spaces = False
        repairs.append(_record("clean_up_tokenization_spaces", True, f"False ({_BYTE_LEVEL})"))
    if not lossless_failures(tokenizer):
        return repairs
    backend = tokenizer.backend_tokenizer
    if lossless_failures(tokenizer) and type(backend.decoder).__name__ != "ByteLevel":
        repairs.append(_record("decoder", type(backend.decoder).__name__, f"ByteLevel ({_BYTE_LEVEL})"))
        backend.decoder = decoders.ByteLevel()
    return repairs


def _repair_end_ids(model: Any, source: SourceTokenizer) -> list[dict[str, Any]]:
    """The ids the GGUF says end a turn (``END_KEYS``) among the generation config's eos ids, after its own eos:
    transformers keeps only ``tokenizer.ggml.eos_token_id``, so an instruct model converted from a GGUF would
    never stop at its end of turn."""
    holder = model.generation_config
    found = holder.eos_token_id
    ids = [found] if isinstance(found, int) else list(found or [])
    missing = [i for i in source.end_ids if i not in ids]
    if not missing:
        return []
    holder.eos_token_id = [*ids, *missing]
    return [_record("generation_config.eos_token_id", found, holder.eos_token_id)]


def _repair_bos(tokenizer: Any, source: SourceTokenizer) -> list[dict[str, Any]]:
    """Whether encoding adds a BOS, as the GGUF states (``tokenizer.ggml.add_bos_token``): transformers 5.19
    converts a Gemma GGUF, which states it, to a tokenizer that adds none."""
    if source.add_bos_token is None or tokenizer.bos_token_id is None:
        return []
    ids = tokenizer("a")["input_ids"]
    adds = bool(ids) and ids[0] == tokenizer.bos_token_id
    if adds == source.add_bos_token:
        return []
    tokenizer.add_bos_token = source.add_bos_token
    return [_record("add_bos_token", adds, source.add_bos_token)]


def repair_from_source(tokenizer: Any, model: Any, source: SourceTokenizer) -> list[dict[str, Any]]:
    """Set what ``tokenizer`` and ``model`` get wrong of what ``source`` states; the repairs made, in order."""
    repairs = _repair_special_tokens(tokenizer, source)
    repairs += _repair_bos(tokenizer, source)
    repairs += _repair_config_ids(model, source)
    repairs += _repair_end_ids(model, source)
    template = getattr(tokenizer, "chat_template", None)
    if source.chat_template is not None and template != source.chat_template:
        tokenizer.chat_template = source.chat_template
        repairs.append(_record("chat_template", template, source.chat_template))
    if source.model == "gpt2":
        repairs += _repair_decoding(tokenizer)
    return repairs
