"""Tasks whose prompts the model's context cannot take: set aside and counted in training, scored 0 in
evaluation, and a start-up error when most of the evaluation set is such."""

from __future__ import annotations

import logging
import random
from pathlib import Path

import pytest

from node.api.metrics import read_metrics
from node.cli import main
from node.config import AdapterConfig, ModelConfig
from node.generation.hf import HFBackend
from node.generation.rollouts import encode_prompt, greedy_accuracy, split_by_fit
from node.policy.model import build_policy
from node.run.node import Node
from node.tasks import build_task_source


@pytest.fixture(scope="module")
def policy():
    return build_policy(ModelConfig(name_or_path="tiny-base", device="cpu"), AdapterConfig(), seed=0)


@pytest.fixture(scope="module")
def mixed(policy):
    """Tasks of two prompt lengths (two- and three-digit additions) and the short prompts' length."""
    source = build_task_source("arith", ["add", "add3"], None, 0, chat_template="auto")
    tasks = [source.task(r) for r in source.sample(40, random.Random(0))]
    lengths = {t.ref.dataset: len(encode_prompt(policy, source.format_prompt(t, policy.tokenizer))) for t in tasks}
    assert lengths["add"] < lengths["add3"]
    return source, tasks, lengths["add"]


def test_split_by_fit_keeps_the_prompts_shorter_than_the_limit(policy, mixed):
    source, tasks, short = mixed
    fit, too_long = split_by_fit(policy, source, tasks, short + 1)
    assert {t.ref.dataset for t in fit} == {"add"} and {t.ref.dataset for t in too_long} == {"add3"}
    assert len(fit) + len(too_long) == len(tasks)
    fit, too_long = split_by_fit(policy, source, tasks, short)  # a prompt as long as the limit has no room
    assert not fit and len(too_long) == len(tasks)
    assert split_by_fit(policy, source, tasks, None) == (tasks, [])


def test_evaluation_scores_a_task_that_does_not_fit_as_0(policy, mixed):
    source, tasks, short = mixed
    backend = HFBackend(policy, batch_size=64)
    fit, _ = split_by_fit(policy, source, tasks, short + 4)  # completions of up to 3 tokens: "NN" and EOS
    backend.max_len = short + 4
    on_fit = greedy_accuracy(backend, policy, source, fit, max_new_tokens=3)
    assert on_fit > 0  # the base model answers some additions, so the test below is not 0 == 0
    assert greedy_accuracy(backend, policy, source, tasks, max_new_tokens=3) == pytest.approx(
        on_fit * len(fit) / len(tasks))
    backend.max_len = 2  # nothing fits
    assert greedy_accuracy(backend, policy, source, tasks, max_new_tokens=3) == 0.0


def test_a_training_step_sets_aside_tasks_that_do_not_fit_counts_them_and_warns_once(fast_config, caplog, mixed):
    _, _, short = mixed  # the same tokenizer as the node's: tiny-base
    cfg = fast_config("tasks.datasets=[add, add3]", "sapo.local_groups=8", "train.steps=2")
    node = Node(cfg, cfg.run_dir, show_progress=False)
    node.setup()
    try:
        node.generator.max_len = short + 2  # add3's longer prompts do not fit; add's have room for 2 tokens
        with caplog.at_level(logging.DEBUG, logger="node.run.node"):
            rows = [node.train_step(), node.train_step()]
    finally:
        node.close()
    for row in rows:
        assert row["tasks_too_long"] > 0
        assert row["n_local_groups"] <= 8 - row["tasks_too_long"]
    warnings = [r for r in caplog.records if "skipped this step" in r.getMessage()]
    assert [r.levelno for r in warnings] == [logging.WARNING, logging.DEBUG]
    assert read_metrics(Path(cfg.run_dir) / "metrics.jsonl")[-1]["tasks_too_long"] == rows[-1]["tasks_too_long"]


def test_a_task_set_the_model_cannot_take_is_a_one_line_error_at_start_up(tmp_path, capsys):
    code = main(["silo", "-c", "configs/tiny-silo.yaml", "--run-dir", str(tmp_path), "--no-progress",
                 "tasks.source=reasoning_gym", "tasks.datasets=[propositional_logic]", "tasks.eval_size=8"])
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("swarm-node")]
    assert code == 2 and len(lines) == 1, lines
    assert "8 of 8 evaluation prompts" in lines[0] and "model's 64-token context" in lines[0]
    assert "shorter prompts" in lines[0]
