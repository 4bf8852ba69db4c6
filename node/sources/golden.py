"""Golden ids: what a model's tokenizer and weights must give, stored in the repository per fetched or embedded
model (``node/sources/assets/golden/NAME.json``), so a folder converted or cached by any library version is compared
with the same numbers.

A record holds the special tokens and their ids, a hash of the vocabulary in id order, the ids and decoded
text of a fixed set of strings (digits and arithmetic, words, unicode, leading and trailing spaces, spaces
before punctuation, the chat markup), the ids of a fixed conversation rendered by the chat template, and,
for ``swarm-node doctor``, the greedy continuation of fixed prompts with the float32 logits behind it.
``python scripts/build/make_golden.py NAME`` writes a record from the model as this machine loads it, after
the conversion checks pass. Light: no torch or transformers at import.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from node.sources.embedded.catalog import ASSETS_DIR
from node.sources.gguf.facts import tokens_sha256

GOLDEN_DIR = ASSETS_DIR / "golden"
MAKE_COMMAND = "python scripts/build/make_golden.py"
SPECIAL_NAMES = ("bos", "eos", "pad", "unk")

# Each should encode to the stored ids and decode back to the stored text (itself, for a byte-level BPE).
FIXED_STRINGS: tuple[str, ...] = (
    "0123456789",
    "12+34=46",
    "3 + 4 = 7.",
    "-17 * 2 = -34, 100/4=25 and 2^10 = 1024",
    "What is 3 + 4?",
    "The quick brown fox jumps over the lazy dog.",
    "a , b . c ? d ! don 't it 's",
    " leading space",
    "trailing space ",
    "  two  spaces  ",
    "tabs\tand\nnew\n\nlines",
    "café naïve Zürich ß",
    "日本語 and emoji 🙂",
    "<|im_start|>user\nWhat is 3 + 4?<|im_end|>\n<|im_start|>assistant\n",
    "3 + 4 = 7.<answer>7</answer><|im_end|>",
    "<|endoftext|>",
)

FIXED_CONVERSATION: tuple[dict[str, str], ...] = (
    {"role": "system", "content": "Solve the task, then give the final answer inside <answer></answer>."},
    {"role": "user", "content": "What is 3 + 4?"},
    {"role": "assistant", "content": "3 + 4 = 7.\n<answer>7</answer>"},
    {"role": "user", "content": "What is 12 - 5?"},
)


def golden_path(name: str) -> Path:
    return GOLDEN_DIR / f"{name}.json"


def load_golden(name: str) -> dict[str, Any] | None:
    """The stored record of the model called ``name``, or None when the repository has none."""
    path = golden_path(name)
    if not path.is_file():
        return None
    record: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return record


def vocabulary(tokenizer: Any) -> list[str]:
    """Every token of ``tokenizer`` in id order, added tokens included."""
    return [str(t) for t in tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))]


def special_tokens(tokenizer: Any) -> dict[str, dict[str, Any]]:
    """``{"eos": {"token": "<|im_end|>", "id": 2}, ...}`` for the special tokens the tokenizer has."""
    out = {}
    for name in SPECIAL_NAMES:
        token = getattr(tokenizer, f"{name}_token", None)
        if token is not None:
            out[name] = {"token": str(token), "id": getattr(tokenizer, f"{name}_token_id", None)}
    return out


def render_conversation(tokenizer: Any) -> list[int] | None:
    """Ids of the fixed conversation as the node renders a prompt (template text, then encoded without
    added special tokens); None when the tokenizer has no chat template."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    text = tokenizer.apply_chat_template(list(FIXED_CONVERSATION), tokenize=False, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def tokenizer_record(tokenizer: Any) -> dict[str, Any]:
    """What the golden checks compare: special tokens, vocabulary hash, fixed strings, rendered chat."""
    vocab = vocabulary(tokenizer)
    strings = []
    for text in FIXED_STRINGS:
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        strings.append({"text": text, "ids": ids, "decoded": tokenizer.decode(ids, skip_special_tokens=False)})
    return {"special": special_tokens(tokenizer), "vocab_size": len(vocab), "vocab_sha256": tokens_sha256(vocab),
            "with_special_tokens": list(tokenizer(FIXED_STRINGS[0])["input_ids"]),
            "strings": strings, "chat_ids": render_conversation(tokenizer)}


def compare_tokenizer(found: dict[str, Any], stored: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(what, found, stored)`` for each golden tokenizer field where ``found`` differs from ``stored``."""
    out: list[tuple[str, Any, Any]] = []
    for name in sorted(set(found["special"]) | set(stored["special"])):
        here, there = found["special"].get(name), stored["special"].get(name)
        if here != there:
            out.append((f"{name}_token", here, there))
    for key in ("vocab_size", "vocab_sha256", "with_special_tokens", "chat_ids"):
        if found.get(key) != stored.get(key):
            out.append((key, found.get(key), stored.get(key)))
    stored_strings = {s["text"]: s for s in stored["strings"]}
    for item in found["strings"]:
        want = stored_strings.get(item["text"])
        if want is None:
            continue
        if item["ids"] != want["ids"]:
            out.append((f"ids of {item['text']!r}", item["ids"], want["ids"]))
        elif item["decoded"] != want["decoded"]:
            out.append((f"decoding of {item['text']!r}", item["decoded"], want["decoded"]))
    return out


# -- greedy continuations (swarm-node doctor) --------------------------------------------------------------

GREEDY_TEXTS: tuple[str, ...] = ("12+34=", "The quick brown fox")
GREEDY_NEW_TOKENS = 8
GREEDY_TOP = 5
# Largest difference of a stored float32 logit a device may show: CPU kernels of other torch versions stay
# well within the first; a GPU's float32 (TF32 off, torch's default for matmuls) within the second.
LOGIT_TOLERANCE = {"cpu": 1e-3, "other": 2e-2}


def greedy_prompts(tokenizer: Any) -> list[list[int]]:
    """The fixed prompts as the node encodes them (BOS in front where the tokenizer has one): the rendered
    conversation where there is a chat template, then the plain texts."""
    prompts = [ids for ids in [render_conversation(tokenizer)] if ids is not None]
    prompts += [list(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in GREEDY_TEXTS]
    bos = tokenizer.bos_token_id
    return [[bos, *ids] if bos is not None and (not ids or ids[0] != bos) else ids for ids in prompts]


def _positions_logits(model: Any, prompt: list[int], continuation: list[int]) -> Any:
    """float32 logits ``[len(continuation), V]`` that predict each continuation token (one forward pass)."""
    import torch

    device = next(model.parameters()).device
    ids = torch.tensor([prompt + continuation[:-1]], device=device)
    with torch.inference_mode():
        logits = model(input_ids=ids, logits_to_keep=len(continuation)).logits[0]
    return logits.float().cpu()


def greedy_record(model: Any, prompt: list[int], new_tokens: int = GREEDY_NEW_TOKENS) -> dict[str, Any]:
    """The greedy continuation of ``prompt`` (full forward passes, no cache) with the top logits behind it."""
    continuation: list[int] = []
    for _ in range(new_tokens):
        logits = _positions_logits(model, prompt, [*continuation, 0])
        continuation.append(int(logits[-1].argmax()))
    logits = _positions_logits(model, prompt, continuation)
    top = logits.topk(GREEDY_TOP, dim=-1)
    return {"prompt_ids": prompt, "ids": continuation, "top_ids": top.indices.tolist(),
            "top_logits": [[round(float(v), 5) for v in row] for row in top.values],
            "margin": round(float((top.values[:, 0] - top.values[:, 1]).min()), 5)}


def compare_greedy(model: Any, stored: dict[str, Any], tolerance: float) -> tuple[list[tuple[str, Any, Any]], float]:
    """``(differences, largest logit difference)``: a difference ``(what, found, stored)`` where ``model``
    predicts the stored continuation otherwise, a logit further than ``tolerance`` from the stored one or
    another greedy token where the stored margin exceeds twice ``tolerance`` (the first of either)."""
    import torch

    logits = _positions_logits(model, stored["prompt_ids"], stored["ids"])
    found_ids = logits.argmax(-1).tolist()
    largest = 0.0
    for pos, (top_ids, top_values) in enumerate(zip(stored["top_ids"], stored["top_logits"])):
        values = logits[pos, torch.tensor(top_ids)]
        diff = float((values - torch.tensor(top_values)).abs().max())
        largest = max(largest, diff)
        if diff > tolerance:
            return [(f"logit of the greedy token at new token {pos}", round(float(values[0]), 4), top_values[0])], largest
        if found_ids[pos] != stored["ids"][pos] and top_values[0] - top_values[1] > 2 * tolerance:
            return [(f"greedy token {pos}", found_ids[pos], stored["ids"][pos])], largest
    return [], largest
