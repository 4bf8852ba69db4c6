"""Prompt formatting (chat template or plain) and final-answer extraction for free-text tasks."""

from __future__ import annotations

import logging
import re
from typing import Any

from node.errors import TaskError
from node.modes import ChatTemplateMode

logger = logging.getLogger(__name__)

ANSWER_INSTRUCTION = "Give your final answer inside <answer></answer> tags, e.g. <answer>42</answer>."
DEFAULT_SYSTEM_PROMPT = (
    "You are a careful problem solver. Think step by step if needed, then give only the final answer "
    "inside <answer></answer> tags."
)

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_OPEN_TAG = re.compile(r"<answer>", re.IGNORECASE)
_ANSWER_MARKER = re.compile(r"answer\s*:", re.IGNORECASE)


def extract_answer(completion: str) -> str | None:
    """The final answer in a completion, stripped; None when there is nothing to score.

    In order: the content of the last ``<answer>...</answer>``; the text after a last unclosed
    ``<answer>`` (generation may stop at the closing tag); the text after the last ``Answer:``;
    the last non-empty line.
    """
    tagged: list[str] = _ANSWER_TAG.findall(completion)
    if tagged:
        return tagged[-1].strip()
    opens = list(_OPEN_TAG.finditer(completion))
    if opens:
        return completion[opens[-1].end() :].strip() or None
    markers = list(_ANSWER_MARKER.finditer(completion))
    if markers:
        return completion[markers[-1].end() :].strip() or None
    lines = [line.strip() for line in completion.splitlines() if line.strip()]
    return lines[-1] if lines else None


def plain_prompt(prompt: str) -> str:
    """The prompt for a model without a chat template."""
    return f"Question: {prompt}\nAnswer:"


def has_chat_template(tokenizer: Any) -> bool:
    return tokenizer is not None and bool(getattr(tokenizer, "chat_template", None))


def chat_prompt(prompt: str, tokenizer: Any, system_prompt: str | None) -> str:
    """``prompt`` as one user turn in the tokenizer's chat template, with the generation prompt appended.

    Templates that reject a system turn get the system prompt prepended to the user turn instead.
    """
    user = {"role": "user", "content": prompt}
    if system_prompt:
        try:
            return _apply(tokenizer, [{"role": "system", "content": system_prompt}, user])
        except Exception as error:  # jinja raises TemplateError (or anything) for unsupported roles
            logger.debug("chat template rejected a system turn (%s); merging it into the user turn", error)
            user = {"role": "user", "content": f"{system_prompt}\n\n{prompt}"}
    return _apply(tokenizer, [user])


def _apply(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if not isinstance(text, str):
        raise TaskError(f"apply_chat_template returned {type(text).__name__}, expected str")
    return text


def format_for_model(prompt: str, tokenizer: Any, mode: ChatTemplateMode, system_prompt: str | None) -> str:
    """Chat-template ``prompt`` when ``mode`` asks for it (``auto``: when the tokenizer has one)."""
    if mode == "never" or (mode == "auto" and not has_chat_template(tokenizer)):
        return plain_prompt(prompt)
    if not has_chat_template(tokenizer):
        raise TaskError("model.chat_template is 'always' but the tokenizer has no chat template; use 'auto'")
    return chat_prompt(prompt, tokenizer, system_prompt)
