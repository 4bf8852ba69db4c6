"""``tasks`` (with ``tasks.prompt``): which tasks the node trains and evaluates on, and how it prompts."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from node.config.section import Section
from node.errors import TaskError
from node.modes import ChatTemplateMode, TaskSourceName

PROMPT_DEFAULT: Literal["default"] = "default"
"""``tasks.prompt.system`` and ``tasks.prompt.examples``: the task source's own (see ``PromptConfig``)."""


class PromptExample(Section):
    """A worked example shown before the question: a user turn and the assistant turn answering it."""

    user: str = Field(min_length=1)
    assistant: str = Field(min_length=1)


class PromptConfig(Section):
    """How this node formats its prompts (its own and peers'); node-local, so it never changes which tasks
    the node shares with peers."""

    system: str | None = Field(
        PROMPT_DEFAULT, description="the system turn of chat prompts: 'default' (the source's own: reasoning_gym's "
        "asks for <answer> tags; arith's, used under model.chat_template=always, for the bare zero-padded result), "
        "null for none (the chat template's own default, if it has one), or the text")
    examples: list[PromptExample] | Literal["default"] = Field(
        PROMPT_DEFAULT, description="worked examples before the question, each {user: ..., assistant: ...}: "
        "'default' (reasoning_gym: none; arith under chat_template=always: one of the task's dataset), [] for none")
    answer_instruction: str | None = Field(
        PROMPT_DEFAULT, description="reasoning_gym: the sentence after each question: 'default' (\"Give your final "
        "answer inside <answer></answer> tags, e.g. <answer>42</answer>.\"), null for none, or the text")

    @field_validator("examples", mode="before")
    @classmethod
    def _examples_are_pairs(cls, value: Any) -> Any:
        """One line per mistake instead of one per member of the union."""
        if value == PROMPT_DEFAULT:
            return value
        if not isinstance(value, list):
            raise ValueError("must be 'default', [] (none) or a list of {user: ..., assistant: ...}")
        checked = []
        for i, item in enumerate(value):
            try:
                checked.append(PromptExample.model_validate(item))
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(p) for p in first["loc"])
                raise ValueError(f"example {i}{': ' + where if where else ''}: {first['msg']}; each example is "
                                 "{user: <question>, assistant: <its answer>}") from None
        return checked

    def source_options(self) -> dict[str, Any]:
        """The task-source options these settings give (none for what is left to the source's default)."""
        options: dict[str, Any] = {}
        if self.system != PROMPT_DEFAULT:
            options["system_prompt"] = self.system
        if self.answer_instruction != PROMPT_DEFAULT:
            options["answer_instruction"] = self.answer_instruction
        if isinstance(self.examples, list):
            options["examples"] = [(e.user, e.assistant) for e in self.examples]
        return options


class TasksConfig(Section):
    source: TaskSourceName = "arith"
    datasets: list[str] = Field(default_factory=lambda: ["add"])
    weights: list[float] | None = None
    eval_size: int = Field(128, ge=1)
    eval_datasets: list[str] | None = Field(None, description="held-out evaluation datasets (default: datasets)")
    dataset_configs: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="reasoning_gym: per-dataset settings of reasoning-gym, e.g. "
        "{basic_arithmetic: {min_terms: 2, max_terms: 2}}; part of the tasks' config hash (peers share tasks only "
        "with the same settings)")
    prompt: PromptConfig = PromptConfig()

    @model_validator(mode="after")
    def _weights_match(self) -> TasksConfig:
        if not self.datasets:
            raise ValueError("datasets must name at least one dataset")
        if self.weights is not None and len(self.weights) != len(self.datasets):
            raise ValueError(f"weights has {len(self.weights)} entries but datasets has {len(self.datasets)}")
        from node.tasks.registry import (  # cheap; imported here to keep the config's imports small
            check_dataset_configs,
            check_datasets,
        )

        try:
            check_datasets(self.source, [*self.datasets, *(self.eval_datasets or [])])
        except TaskError as exc:
            raise ValueError(str(exc)) from None
        if self.source != "reasoning_gym" and self.prompt.answer_instruction != PROMPT_DEFAULT:
            raise ValueError(f"prompt.answer_instruction applies to source reasoning_gym (source {self.source} has "
                             "none); remove it")
        try:
            check_dataset_configs(self.source, self.dataset_configs)  # imports reasoning-gym when there are some
        except TaskError as exc:
            raise ValueError(str(exc)) from None
        return self

    def source_options(self, chat_template: ChatTemplateMode) -> dict[str, Any]:
        """Keyword options of ``build_task_source`` for these settings (the same wherever a source is built)."""
        options: dict[str, Any] = {"chat_template": chat_template, **self.prompt.source_options()}
        if self.dataset_configs:
            options["dataset_configs"] = self.dataset_configs
        return options

