"""A model folder checked against what its source states, whatever library version converted or cached it.

Three sources, each used where it exists:

- the GGUF it was converted from (``node.sources.gguf.facts``): special token ids, the vocabulary in id order,
  the chat template, whether a BOS is added; at conversion the file itself, later the summary the conversion
  recorded in ``build_info.json`` (``source_tokenizer``);
- the repository's golden ids for a fetched or embedded model (``node.sources.golden``): fixed strings'
  ids and decoded text, a fixed conversation rendered by the chat template, special tokens, vocabulary hash;
- the folder itself: the tokenizer's bos, eos and pad ids against ``config.json`` and
  ``generation_config.json`` (a tokenizer whose eos is ``<|im_start|>`` beside a config whose eos id is 2).

Each broken invariant is a ``Finding``; ``refuse`` turns findings into one ``PolicyError`` line naming the
field, both values and the library versions. Light: no torch import (a tokenizer object is passed in).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from node.errors import PolicyError
from node.sources.cache import DONE_FILE
from node.sources.gguf.facts import SPECIAL_KEYS, SourceTokenizer, tokens_sha256
from node.sources.gguf.repair import lossless_failures
from node.sources.golden import (
    MAKE_COMMAND,
    SPECIAL_NAMES,
    compare_tokenizer,
    golden_path,
    load_golden,
    tokenizer_record,
    vocabulary,
)


@dataclass(frozen=True)
class Finding:
    """One invariant a folder breaks: ``what`` is ``found`` where ``source`` states ``expected``."""

    what: str
    found: Any
    expected: Any
    source: str

    def line(self) -> str:
        return f"{self.what} is {_short(self.found)} where {self.source} states {_short(self.expected)}"


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def check_source(tokenizer: Any, source: SourceTokenizer, *, what: str = "the GGUF") -> list[Finding]:
    """Where ``tokenizer`` differs from what its GGUF states: special ids, vocabulary, chat template, BOS."""
    findings = []
    for name, expected in source.special_ids.items():
        found = getattr(tokenizer, f"{name}_token_id", None)
        if found != expected:
            findings.append(Finding(f"{name}_token_id", found, expected, f"{what}'s {SPECIAL_KEYS[name]}"))
    vocab = vocabulary(tokenizer)
    if source.tokens is not None:
        first = next((i for i, (a, b) in enumerate(zip(vocab, source.tokens)) if a != b), None)
        if first is not None:
            findings.append(Finding(f"token {first}", vocab[first], source.tokens[first], f"{what}'s token list"))
    if len(vocab) != source.n_tokens:
        findings.append(Finding("vocabulary size", len(vocab), source.n_tokens, f"{what}'s token list"))
    elif source.tokens is None and tokens_sha256(vocab) != source.vocab_sha256:
        findings.append(Finding("vocabulary sha256", tokens_sha256(vocab)[:16], source.vocab_sha256[:16],
                                f"{what}'s token list"))
    template = getattr(tokenizer, "chat_template", None)
    if source.chat_template is not None and template != source.chat_template:
        findings.append(Finding("chat_template", template, source.chat_template, f"{what}'s tokenizer.chat_template"))
    if source.add_bos_token is not None and tokenizer.bos_token_id is not None:
        ids = tokenizer("a")["input_ids"]
        if (bool(ids) and ids[0] == tokenizer.bos_token_id) != source.add_bos_token:
            findings.append(Finding("adds BOS", not source.add_bos_token, source.add_bos_token,
                                    f"{what}'s tokenizer.ggml.add_bos_token"))
    return findings


def check_lossless(tokenizer: Any) -> list[Finding]:
    """A byte-level BPE (the GGUF's ``tokenizer.ggml.model = gpt2``) gives every fixed string back unchanged."""
    findings = []
    for text in lossless_failures(tokenizer):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        findings.append(Finding(f"decoding of {text!r}", tokenizer.decode(ids, skip_special_tokens=False), text,
                                "a byte-level BPE (tokenizer.ggml.model = gpt2)"))
    return findings


def _ids(value: Any) -> set[int] | None:
    if isinstance(value, int):
        return {value}
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        return set(value)
    return None


def check_agreement(folder: Path, tokenizer: Any) -> list[Finding]:
    """Where the tokenizer's bos, eos or pad id is not the one ``config.json`` or ``generation_config.json``
    states (a list of eos ids must hold the tokenizer's). Only ids both sides state are compared."""
    return check_agreement_with(tokenizer, {file: read_json(folder / file)
                                            for file in ("config.json", "generation_config.json")})


def check_agreement_with(tokenizer: Any, configs: dict[str, dict[str, Any]]) -> list[Finding]:
    """``check_agreement`` with the configs given as dicts, by file name."""
    findings = []
    for file, config in configs.items():
        for name in ("bos", "eos", "pad"):
            found = getattr(tokenizer, f"{name}_token_id", None)
            stated = _ids(config.get(f"{name}_token_id"))
            if found is not None and stated is not None and found not in stated:
                token = getattr(tokenizer, f"{name}_token", None)
                findings.append(Finding(f"the tokenizer's {name}_token_id ({token!r})", found,
                                        config.get(f"{name}_token_id"), f"{file}'s {name}_token_id"))
    return findings


def check_golden(tokenizer: Any, name: str) -> list[Finding]:
    """Where ``tokenizer`` differs from the repository's golden record of the model ``name`` (none: [])."""
    golden = load_golden(name)
    if golden is None:
        return []
    source = f"the golden record ({golden_path(name).name}, `{MAKE_COMMAND} {name}`)"
    return [Finding(what, found, stored, source)
            for what, found, stored in compare_tokenizer(tokenizer_record(tokenizer), golden["tokenizer"])]


def check_folder(folder: Path, tokenizer: Any, *, golden_name: str | None = None) -> list[Finding]:
    """Every check that applies to the loaded ``folder``: what its conversion recorded of its GGUF, the golden
    record of ``golden_name`` (a fetched or embedded model), and its own files' agreement."""
    findings = check_agreement(folder, tokenizer)
    recorded = read_json(folder / DONE_FILE).get("source_tokenizer")
    if isinstance(recorded, dict):
        source = SourceTokenizer.from_summary(recorded)
        findings += check_source(tokenizer, source, what="its GGUF")
        if source.model == "gpt2":
            findings += check_lossless(tokenizer)
    if golden_name is not None:
        findings += check_golden(tokenizer, golden_name)
    return findings


def folder_problem(folder: Path, *, golden_name: str | None) -> str | None:
    """The first failed check of the model folder ``folder`` as one line, or None when it passes them all."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
    except (OSError, ValueError) as exc:
        return f"its tokenizer does not load ({str(exc).strip().splitlines()[0]})"
    findings = check_folder(folder, tokenizer, golden_name=golden_name)
    return findings[0].line() if findings else None


def library_versions(folder: Path | None = None) -> str:
    """``transformers X, tokenizers Y`` here, and the versions that converted ``folder`` when they differ."""
    import importlib.metadata as md

    here = {pkg: md.version(pkg) for pkg in ("transformers", "tokenizers")}
    text = ", ".join(f"{k} {v}" for k, v in here.items())
    made = read_json(folder / DONE_FILE).get("versions", {}) if folder is not None else {}
    made = {k: made[k] for k in here if isinstance(made, dict) and k in made}
    if made and made != here:
        text += "; converted with " + ", ".join(f"{k} {v}" for k, v in made.items())
    return text


def refuse(findings: list[Finding], *, model: str, folder: Path | None, fix: str) -> None:
    """Raise one ``PolicyError`` line for ``findings`` (nothing when there are none)."""
    if not findings:
        return
    more = f" (and {len(findings) - 1} more)" if len(findings) > 1 else ""
    raise PolicyError(f"model {model}: {findings[0].line()}{more} [{library_versions(folder)}]; {fix}")


__all__ = ["SPECIAL_NAMES", "Finding", "check_agreement", "check_agreement_with", "check_folder", "check_golden", "folder_problem", "check_lossless",
           "check_source", "library_versions", "refuse"]
