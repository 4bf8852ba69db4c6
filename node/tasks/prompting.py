"""Prompt formatting (chat template or plain) and final-answer extraction for free-text tasks.

A prompt is formatted from the task's text, an optional system prompt and optional worked examples
(``Example``: a user turn and the assistant turn that answers it, shown before the question). Formatting
is local to a node: it never enters a source's ``config_hash``, so nodes that prompt differently still
share tasks.

- Chat (``chat_template`` ``always``, or ``auto`` with a tokenizer that has a template): the system turn,
  then each example as a user turn and an assistant turn, then the question as the last user turn and the
  generation prompt. A template that rejects a system turn gets the system prompt prepended to the first
  user turn instead.
- Plain (``never``, or ``auto`` without a template): ``Question: ...`` / ``Answer: ...`` pairs, the examples
  first (few-shot, the form a base model continues), then the question and ``Answer:``. Plain prompts carry
  no system prompt: a base model would read it as part of the text it continues.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
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


def _tag_content(completion: str) -> tuple[int, int, bool] | None:
    """``(start, end, closed)``: the content of the last ``<answer>...</answer>`` (closed), else the text
    after a last unclosed ``<answer>``; None without a tag."""
    tagged = list(_ANSWER_TAG.finditer(completion))
    if tagged:
        return (*tagged[-1].span(1), True)
    opens = list(_OPEN_TAG.finditer(completion))
    return (opens[-1].end(), len(completion), False) if opens else None


def extract_answer(completion: str) -> str | None:
    """The final answer in a completion, stripped; None when there is nothing to score.

    In order: the content of the last ``<answer>...</answer>``; the text after a last unclosed
    ``<answer>`` (generation may stop at the closing tag); the text after the last ``Answer:``;
    the last non-empty line.
    """
    tag = _tag_content(completion)
    if tag is not None:
        content = completion[tag[0] : tag[1]].strip()
        return content if tag[2] else content or None
    markers = list(_ANSWER_MARKER.finditer(completion))
    if markers:
        return completion[markers[-1].end() :].strip() or None
    lines = [line.strip() for line in completion.splitlines() if line.strip()]
    return lines[-1] if lines else None


def tagged_answer_span(completion: str) -> tuple[int, int] | None:
    """``(start, end)``: where in ``completion`` the answer ``extract_answer`` returns lies, when it comes from
    ``<answer>`` tags and is not empty; None otherwise."""
    tag = _tag_content(completion)
    if tag is None:
        return None
    start, end, _ = tag
    content = completion[start:end]
    if not content.strip():
        return None
    return start + len(content) - len(content.lstrip()), end - (len(content) - len(content.rstrip()))


@dataclass(frozen=True)
class Example:
    """A worked example shown before the question: a user turn and the assistant turn answering it."""

    user: str
    assistant: str


def check_examples(examples: Iterable[Any] | None) -> tuple[Example, ...]:
    """``examples`` as ``Example``s; each may be an ``Example``, a ``(user, assistant)`` pair or a mapping
    with ``user`` and ``assistant``. Raise ``TaskError`` naming the first bad one."""
    checked: list[Example] = []
    for i, item in enumerate(examples or ()):
        if isinstance(item, Example):
            pair: Any = (item.user, item.assistant)
        elif isinstance(item, Mapping):
            pair = (item.get("user"), item.get("assistant"))
        else:
            pair = tuple(item) if isinstance(item, Sequence) and not isinstance(item, str) else None
        if pair is None or len(pair) != 2 or not all(isinstance(x, str) and x.strip() for x in pair):
            raise TaskError(f"prompt example {i} must be a non-empty user text and a non-empty assistant text, "
                            f"got {item!r}")
        checked.append(Example(pair[0], pair[1]))
    return tuple(checked)


def plain_prompt(prompt: str, examples: Sequence[Example] = ()) -> str:
    """The prompt for a model without a chat template: the examples as answered questions, then ``prompt``."""
    shots = "".join(f"Question: {e.user}\nAnswer: {e.assistant}\n\n" for e in examples)
    return f"{shots}Question: {prompt}\nAnswer:"


def has_chat_template(tokenizer: Any) -> bool:
    return tokenizer is not None and bool(getattr(tokenizer, "chat_template", None))


def chat_prompt(prompt: str, tokenizer: Any, system_prompt: str | None, examples: Sequence[Example] = ()) -> str:
    """``prompt`` as the last user turn in the tokenizer's chat template, after the system turn and the
    examples' turns, with the generation prompt appended.

    Templates that reject a system turn get the system prompt prepended to the first user turn instead.
    """
    turns = [{"role": role, "content": text} for e in examples
             for role, text in (("user", e.user), ("assistant", e.assistant))]
    turns.append({"role": "user", "content": prompt})
    if system_prompt:
        try:
            return _apply(tokenizer, [{"role": "system", "content": system_prompt}, *turns])
        except Exception as error:  # jinja raises TemplateError (or anything) for unsupported roles
            logger.debug("chat template rejected a system turn (%s); merging it into the first user turn", error)
            turns[0] = {"role": "user", "content": f"{system_prompt}\n\n{turns[0]['content']}"}
    try:
        return _apply(tokenizer, turns)
    except TaskError:
        raise
    except Exception as error:
        if not examples:
            raise
        raise TaskError(f"the chat template rejected the worked examples ({error}); remove tasks.prompt.examples "
                        "or use a model whose template takes assistant turns") from error


def _apply(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if not isinstance(text, str):
        raise TaskError(f"apply_chat_template returned {type(text).__name__}, expected str")
    return text


def format_for_model(prompt: str, tokenizer: Any, mode: ChatTemplateMode, system_prompt: str | None,
                     examples: Sequence[Example] = ()) -> str:
    """Chat-template ``prompt`` when ``mode`` asks for it (``auto``: when the tokenizer has one), else plain."""
    if mode == "never" or (mode == "auto" and not has_chat_template(tokenizer)):
        return plain_prompt(prompt, examples)
    if not has_chat_template(tokenizer):
        raise TaskError("model.chat_template is 'always' but the tokenizer has no chat template; use 'auto'")
    return chat_prompt(prompt, tokenizer, system_prompt, examples)
