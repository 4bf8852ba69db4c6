"""``adapter.init_from``: a new run starts from another run's adapter weights (a trained tiny run here)."""

from __future__ import annotations

import pytest
import torch

from node.errors import ConfigError
from node.run.checkpoint import CheckpointManager
from node.run.saved import init_source
from tests.node.conftest import make_config


def _node(cfg):
    from node.run.node import Node

    node = Node(cfg, show_progress=False)
    node.setup()
    return node


def _saved(run_dir, step: int) -> dict[str, torch.Tensor]:
    manager = CheckpointManager(run_dir, keep=3)
    return manager.load(run_dir / "checkpoints" / f"step_{step:06d}").trainable


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """Two steps of the tiny silo at its own learning rate: trained, and still with signal to train on
    (``trained_run``'s large rate leaves a policy that scores nothing, so nothing would train on from it)."""
    run = tmp_path_factory.mktemp("source") / "run"
    node = _node(make_config(str(run), "train.steps=2"))
    try:
        node.run()
    finally:
        node.close()
    return run


def test_a_new_run_starts_from_the_named_runs_adapter_with_a_fresh_optimizer(tmp_path, source):
    node = _node(make_config(str(tmp_path / "new"), f"adapter.init_from={source}", "train.steps=2"))
    try:
        started = {k: v.clone() for k, v in node.policy.trainable_state().items()}  # not views of the live ones
        assert _same(started, _saved(source, 2))  # the source's newest checkpoint
        assert node.step == 0 and node.trainer.optimizer.state_dict()["state"] == {}
        base = {n: p.detach().clone() for n, p in node.policy.model.named_parameters() if not p.requires_grad}
        node.run()
        after = node.policy.trainable_state()
        assert any(not torch.equal(started[k], after[k]) for k in started)  # it trains on from there
        assert all(torch.equal(p, base[n]) for n, p in node.policy.model.named_parameters() if n in base)
    finally:
        node.close()


def test_a_checkpoint_folder_picks_that_step(tmp_path, trained_run):
    folder = trained_run.run_dir / "checkpoints" / "step_000002"
    cfg = make_config(str(tmp_path / "new"), f"adapter.init_from={folder}")
    picked = init_source(cfg)
    assert picked is not None and picked.step == 2  # not the run's newest (step 4)
    node = _node(cfg)
    try:
        assert _same(node.policy.trainable_state(), _saved(trained_run.run_dir, 2))
        # Steps 3 and 4 may both have had no group with signal (then nothing trained and 2 equals 4): the
        # weights tell the two apart only where they differ.
        if not _same(_saved(trained_run.run_dir, 2), _saved(trained_run.run_dir, 4)):
            assert not _same(node.policy.trainable_state(), _saved(trained_run.run_dir, 4))
    finally:
        node.close()


def test_a_run_with_checkpoints_of_its_own_resumes_from_them(tmp_path, trained_run):
    run = tmp_path / "new"
    first = _node(make_config(str(run), f"adapter.init_from={trained_run.run_dir}", "train.steps=2"))
    try:
        first.run()
    finally:
        first.close()
    again = _node(make_config(str(run), f"adapter.init_from={trained_run.run_dir}", "train.steps=3"))
    try:
        assert again.step == 2 and _same(again.policy.trainable_state(), _saved(run, 2))
    finally:
        again.close()


@pytest.mark.parametrize(("override", "named"), [
    ("adapter.rank=4", "adapter.rank=8 (this node: 4)"),
    ("adapter.train_norms=false", "adapter.train_norms=True (this node: False)"),
    ("adapter.kind=remix", "adapter.kind='lora' (this node: 'remix')"),
])
def test_an_adapter_of_another_shape_is_a_one_line_error_naming_the_field(tmp_path, trained_run, override, named):
    cfg = make_config(str(tmp_path / "new"), f"adapter.init_from={trained_run.run_dir}", override)
    with pytest.raises(ConfigError) as err:
        init_source(cfg)
    assert named in str(err.value) and "\n" not in str(err.value)


def test_a_folder_that_is_no_run_or_a_step_not_kept_is_a_one_line_error(tmp_path, trained_run):
    with pytest.raises(ConfigError, match="neither a run dir nor a checkpoint"):
        init_source(make_config(str(tmp_path / "new"), f"adapter.init_from={tmp_path}"))
    missing = trained_run.run_dir / "checkpoints" / "step_000003"
    with pytest.raises(ConfigError, match=r"no such checkpoint \(it has \[2, 4\]\)"):
        init_source(make_config(str(tmp_path / "new"), f"adapter.init_from={missing}"))


LLAMA_LIST = "adapter.target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]"


def test_a_run_of_an_explicit_target_list_resumes_with_auto_and_seeds_an_auto_run(tmp_path):
    """Runs recorded before ``auto`` became the default name a Llama's seven projections: such a run resumes
    under ``auto`` (the same layers), and ``adapter.init_from`` takes it for an ``auto`` run; a run of other
    layers is refused in one line when its tensors load. Mutation seen failing: ``_shape_differences``
    comparing ``auto`` with a list as unequal (the init_from refused)."""
    from node.errors import PolicyError

    run = tmp_path / "old"
    node = _node(make_config(str(run), LLAMA_LIST, "train.steps=1", "train.checkpoint_every=1"))
    try:
        node.run()
    finally:
        node.close()
    resumed = _node(make_config(str(run), "train.steps=2"))
    try:
        assert resumed.cfg.adapter.target_modules == "auto" and resumed.step == 1
        assert _same(resumed.policy.trainable_state(), _saved(run, 1))
    finally:
        resumed.close()
    assert init_source(make_config(str(tmp_path / "new"), f"adapter.init_from={run}")) is not None
    other = tmp_path / "other"
    node = _node(make_config(str(other), "adapter.target_modules=[q_proj]", "train.steps=1", "train.checkpoint_every=1"))
    try:
        node.run()
    finally:
        node.close()
    from node.run.node import Node

    refusing = Node(make_config(str(tmp_path / "new2"), f"adapter.init_from={other}"), show_progress=False)
    try:
        with pytest.raises(PolicyError, match="checkpoint adapters do not match this policy") as refused:
            refusing.setup()
    finally:
        refusing.close()
    assert "\n" not in str(refused.value)
