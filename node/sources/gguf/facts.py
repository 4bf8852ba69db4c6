"""What a GGUF file states about its tokenizer, read with the ``gguf`` package alone: the source a conversion
is checked against (``node.sources.check``), whatever library version did the converting.

A GGUF keeps its tokenizer as metadata (``tokenizer.ggml.*``): the token list, the special token ids, the
tokenizer model (``gpt2`` for byte-level BPE) and the chat template. ``summary()`` is what a converted
folder's ``build_info.json`` records of them (``source_tokenizer``), so a cached conversion can be checked
again later without its GGUF. Light: no torch, no transformers.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from node.errors import PolicyError

# The special tokens the node relies on, by their name in a tokenizer (``eos_token``) and in a GGUF
# (``tokenizer.ggml.eos_token_id``).
SPECIAL_KEYS: dict[str, str] = {
    "bos": "tokenizer.ggml.bos_token_id",
    "eos": "tokenizer.ggml.eos_token_id",
    "pad": "tokenizer.ggml.padding_token_id",
    "unk": "tokenizer.ggml.unknown_token_id",
}
# Ids a GGUF states end a turn besides its eos (llama.cpp's end-of-turn and end-of-message tokens: Gemma's
# <end_of_turn>, Phi-3's <|end|>), which an instruct model's generation config lists as eos ids.
END_KEYS: tuple[str, ...] = ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")


def _byte_alphabet() -> dict[int, str]:
    """GPT-2's byte-level spelling: each byte as a printable character (printable Latin-1 bytes as
    themselves, the others shifted to 256 and up), the alphabet byte-level BPE vocabularies are written in."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = [b for b in range(256) if b not in kept]
    return {**{b: chr(b) for b in kept}, **{b: chr(256 + i) for i, b in enumerate(shifted)}}


_BYTE_ALPHABET = _byte_alphabet()
_BYTE_CHARS = frozenset(_BYTE_ALPHABET.values())


def byte_level_spelling(token: str) -> str:
    """``token`` in the byte-level alphabet, as transformers spells a GGUF token written in raw text."""
    if set(token) <= _BYTE_CHARS:
        return token
    return "".join(_BYTE_ALPHABET[b] for b in token.encode("utf-8"))


def tokens_sha256(tokens: list[str]) -> str:
    """One hash of a vocabulary in id order: equal hashes, the same token at every id."""
    return hashlib.sha256(json.dumps(tokens, ensure_ascii=False).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class SourceTokenizer:
    """A tokenizer as its source states it: ``tokens`` in id order (None when only their hash is known, e.g.
    from a ``build_info.json``), special ids by name, and what else the GGUF says."""

    model: str | None  # tokenizer.ggml.model: "gpt2" (byte-level BPE), "llama" (sentencepiece), ...
    pre: str | None  # tokenizer.ggml.pre: the pre-tokenizer's split rule ("smollm", "llama3", ...)
    n_tokens: int
    vocab_sha256: str
    special_ids: dict[str, int]
    add_bos_token: bool | None
    chat_template: str | None
    tokens: list[str] | None = None
    end_ids: tuple[int, ...] = ()  # END_KEYS: ids that end a turn besides the eos (Gemma's <end_of_turn>)

    def summary(self) -> dict[str, Any]:
        """What ``build_info.json`` keeps: everything but the token list itself (its hash stays)."""
        return {"model": self.model, "pre": self.pre, "n_tokens": self.n_tokens, "vocab_sha256": self.vocab_sha256,
                "special_ids": dict(self.special_ids), "add_bos_token": self.add_bos_token,
                "chat_template": self.chat_template, "end_ids": list(self.end_ids)}

    @classmethod
    def from_summary(cls, record: dict[str, Any]) -> SourceTokenizer:
        return cls(model=record.get("model"), pre=record.get("pre"), n_tokens=int(record["n_tokens"]),
                   vocab_sha256=str(record["vocab_sha256"]),
                   special_ids={str(k): int(v) for k, v in record.get("special_ids", {}).items()},
                   add_bos_token=record.get("add_bos_token"), chat_template=record.get("chat_template"),
                   end_ids=tuple(int(i) for i in record.get("end_ids", [])))


def read_source_tokenizer(path: Path) -> SourceTokenizer:
    """The tokenizer the GGUF at ``path`` states; ``PolicyError`` (one line) when it states none."""
    try:
        from gguf import GGUFReader, GGUFValueType

        fields = GGUFReader(path).fields
    except ImportError:
        raise PolicyError("reading a GGUF file needs the gguf package: pip install gguf") from None
    except (ValueError, OSError) as exc:
        raise PolicyError(f"{path.name} is not a readable GGUF file ({exc})") from None

    def scalar(key: str) -> Any:
        field = fields.get(key)
        if field is None:
            return None
        if field.types and field.types[0] == GGUFValueType.STRING:
            return bytes(field.parts[-1]).decode("utf-8")
        return field.parts[-1].tolist()[0]

    token_field = fields.get("tokenizer.ggml.tokens")
    if token_field is None:
        raise PolicyError(f"{path.name} states no tokenizer (no tokenizer.ggml.tokens): nothing to check its "
                          "conversion against")
    tokens = [bytes(token_field.parts[i]).decode("utf-8") for i in token_field.data]
    model = scalar("tokenizer.ggml.model")
    if model == "gpt2":  # a byte-level vocabulary: every token as the alphabet spells it
        tokens = [byte_level_spelling(t) for t in tokens]
    special = {name: int(scalar(key)) for name, key in SPECIAL_KEYS.items() if scalar(key) is not None}
    add_bos = scalar("tokenizer.ggml.add_bos_token")
    return SourceTokenizer(model=model, pre=scalar("tokenizer.ggml.pre"),
                           n_tokens=len(tokens), vocab_sha256=tokens_sha256(tokens), special_ids=special,
                           add_bos_token=None if add_bos is None else bool(add_bos),
                           chat_template=scalar("tokenizer.chat_template"), tokens=tokens,
                           end_ids=tuple(dict.fromkeys(int(scalar(k)) for k in END_KEYS if scalar(k) is not None)))
