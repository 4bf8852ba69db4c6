"""Checkpoints: a damaged newest checkpoint falls back to the previous intact one; none intact is an error."""

from __future__ import annotations

import logging
import random

import pytest
import torch

from node.errors import CheckpointError
from node.run.checkpoint import CheckpointManager, CheckpointState, capture_rng


def _save(manager: CheckpointManager, step: int) -> None:
    rng = capture_rng(random.Random(step), torch.Generator().manual_seed(step))
    manager.save(CheckpointState(step=step, trainable={"w": torch.full((3,), float(step))},
                                 optimizer={"state": {}, "param_groups": [{"lr": 0.1 * step}]}, rng=rng,
                                 extra={"model": "tiny-base"}))


def _truncate(path, keep: int = 10) -> None:
    data = path.read_bytes()
    assert len(data) > keep
    path.write_bytes(data[:keep])


@pytest.mark.parametrize("damaged", ["adapter.safetensors", "trainer.pt", "state.json"])
def test_a_truncated_file_in_the_newest_checkpoint_falls_back_to_the_previous(tmp_path, caplog, damaged):
    manager = CheckpointManager(tmp_path, keep=3)
    for step in (1, 2, 3):
        _save(manager, step)
    _truncate(tmp_path / "checkpoints" / "step_000003" / damaged)
    with caplog.at_level(logging.WARNING, logger="node.run.checkpoint"):
        found = manager.load_latest()
    assert found is not None
    path, state = found
    assert path.name == "step_000002" and state.step == 2
    torch.testing.assert_close(state.trainable["w"], torch.full((3,), 2.0))
    assert state.optimizer["param_groups"][0]["lr"] == pytest.approx(0.2)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(f"step_000003/{damaged}" in w for w in warnings), warnings
    # The damaged one is moved aside: not resumed from again, not counted among the kept ones.
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["corrupt-step_000003", "step_000001", "step_000002"]
    assert manager.latest() == tmp_path / "checkpoints" / "step_000002"


def test_every_checkpoint_damaged_is_an_error_that_moves_nothing(tmp_path):
    manager = CheckpointManager(tmp_path, keep=3)
    for step in (1, 2):
        _save(manager, step)
    for step in (1, 2):
        _truncate(tmp_path / "checkpoints" / f"step_{step:06d}" / "trainer.pt")
    with pytest.raises(CheckpointError, match=r"none of the 2 checkpoints .* step_000002/trainer.pt .* afresh"):
        manager.load_latest()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000001", "step_000002"]


def test_no_checkpoint_is_a_fresh_start(tmp_path):
    assert CheckpointManager(tmp_path, keep=3).load_latest() is None


def test_milestones_are_kept_beside_the_last_few(tmp_path):
    manager = CheckpointManager(tmp_path, keep=2, keep_every=4)
    for step in range(1, 11):
        _save(manager, step)
    assert manager.steps() == [4, 8, 9, 10]  # every 4th for good, and the last 2
    assert CheckpointManager(tmp_path, keep=2).load_latest()[1].step == 10


def test_a_run_writes_a_checkpoint_at_each_milestone(fast_config):
    from node.run.node import Node

    node = Node(fast_config("train.steps=7", "train.checkpoint_every=5", "train.keep_checkpoints=1",
                            "train.keep_every=3"), show_progress=False)
    node.setup()
    try:
        node.run()
    finally:
        node.close()
    assert node.checkpoints.steps() == [3, 6, 7]  # milestones 3 and 6; step 5 pruned; the last step
