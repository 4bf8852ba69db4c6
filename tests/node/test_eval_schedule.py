"""When the node evaluates (``train.eval_every``, the last step) and that an evaluation shows while it runs."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from node.api.metrics import read_metrics
from node.config import ConfigError, load_config
from node.run.node import Node


@pytest.mark.parametrize("value", ["0", "null"])
def test_eval_every_0_or_null_is_accepted(value):
    assert load_config("configs/tiny-silo.yaml", [f"train.eval_every={value}"]).train.eval_every in (0, None)


def test_a_negative_eval_every_names_the_field():
    with pytest.raises(ConfigError, match="train.eval_every"):
        load_config("configs/tiny-silo.yaml", ["train.eval_every=-1"])


def _evaluated_steps(cfg) -> list[int]:
    node = Node(cfg, show_progress=False)
    node.setup()
    try:
        node.run()
    finally:
        node.close()
    return [r["step"] for r in read_metrics(Path(cfg.run_dir) / "metrics.jsonl") if "eval_accuracy" in r]


def test_the_node_evaluates_every_n_steps_and_at_the_last(fast_config):
    assert _evaluated_steps(fast_config("train.steps=3", "train.eval_every=2")) == [2, 3]


@pytest.mark.parametrize("value", ["0", "null"])
def test_eval_every_0_or_null_switches_evaluation_off_including_the_last_step(fast_config, value):
    assert _evaluated_steps(fast_config("train.steps=3", f"train.eval_every={value}")) == []


def test_an_evaluation_shows_on_the_progress_bar_and_in_the_log(fast_config, capsys, caplog):
    cfg = fast_config("train.steps=2", "train.eval_every=2")
    node = Node(cfg, show_progress=True)
    node.setup()
    try:
        with caplog.at_level(logging.INFO, logger="node.run.node"):
            node.run()
    finally:
        node.close()
    assert "evaluating 16 tasks" in capsys.readouterr().err  # the bar's description while it runs
    messages = [r.getMessage() for r in caplog.records]
    assert "evaluating 16 held-out tasks (greedy) ..." in messages
    assert any(m.startswith("evaluated 16 held-out tasks in ") for m in messages)
