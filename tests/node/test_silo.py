"""End to end on the embedded tiny model: training changes adapters and norms only, checkpoints resume
exactly, a SIGKILLed run resumes and finishes, SIGTERM stops cleanly."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from node.api.metrics import read_metrics
from node.run.node import Node
from tests.node.conftest import FAST


def _run(cfg, steps=None):
    node = Node(cfg, cfg.run_dir, show_progress=False)
    node.setup()
    try:
        node.run()
    finally:
        node.close()
    return node


def test_training_changes_adapters_and_norms_but_not_the_base(fast_config):
    cfg = fast_config("train.steps=3")
    node = Node(cfg, cfg.run_dir, show_progress=False)
    node.setup()
    before = {n: p.detach().clone() for n, p in node.policy.model.named_parameters()}
    trainable = {n for n, p in node.policy.model.named_parameters() if p.requires_grad}
    node.run()
    node.close()
    after = dict(node.policy.model.named_parameters())
    changed = {n for n in before if not torch.equal(before[n], after[n].detach())}
    assert changed, "no parameter changed"
    assert changed <= trainable, f"frozen parameters changed: {sorted(changed - trainable)[:3]}"
    assert any("lora_B" in n for n in changed), "LoRA weights did not change"
    assert any("norm" in n for n in changed), "trainable norms did not change"
    base_names = {n for n in before if n not in trainable}
    assert base_names and all(torch.equal(before[n], after[n].detach()) for n in base_names)


def test_metrics_lines_have_the_required_fields(fast_config):
    cfg = fast_config("train.steps=2")
    node = _run(cfg)
    rows = read_metrics(Path(cfg.run_dir) / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    for key in ("step", "time", "reward_mean", "loss", "tokens_per_s", "n_local_groups", "n_peer_groups"):
        assert key in rows[0]
    for row in rows:  # where a step's time went: sampling and training, inside the step
        assert row["gen_seconds"] > 0 and row["train_seconds"] > 0
        assert row["gen_seconds"] + row["train_seconds"] <= row["step_seconds"]
    # The logged accuracy is the greedy evaluation of the final weights: recomputing it gives the same.
    assert "eval_accuracy" not in rows[0]  # train.eval_every=2
    assert rows[1]["eval_accuracy"] == node.evaluate()


def test_resume_gives_the_same_metrics_as_an_uninterrupted_run(tmp_path):
    from tests.node.conftest import make_config

    straight = make_config(str(tmp_path / "a"), "train.steps=4")
    _run(straight)
    first_half = make_config(str(tmp_path / "b"), "train.steps=2")
    _run(first_half)
    resumed = make_config(str(tmp_path / "b"), "train.steps=4")
    node = _run(resumed)
    assert node.step == 4
    a = read_metrics(tmp_path / "a" / "metrics.jsonl")
    b = read_metrics(tmp_path / "b" / "metrics.jsonl")
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    _assert_same_metrics(a, b)
    # The newest checkpoint damaged after the fact: the node falls back to step 2 and redoes 3 and 4.
    adapter = tmp_path / "b" / "checkpoints" / "step_000004" / "adapter.safetensors"
    adapter.write_bytes(adapter.read_bytes()[:100])
    node = _run(resumed)
    assert node.step == 4
    assert (tmp_path / "b" / "checkpoints" / "corrupt-step_000004").is_dir()
    b = read_metrics(tmp_path / "b" / "metrics.jsonl")
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    _assert_same_metrics(a, b)


def _assert_same_metrics(a: list[dict], b: list[dict]) -> None:
    for ra, rb in zip(a, b, strict=True):
        assert ra["reward_mean"] == rb["reward_mean"]
        assert ra["loss"] == pytest.approx(rb["loss"], abs=1e-6)
        assert ra.get("eval_accuracy") == rb.get("eval_accuracy")


def _cli(run_dir: Path, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "node.cli", "silo", "-c", "configs/tiny-silo.yaml", "--run-dir", str(run_dir),
            "--no-progress", *FAST, *overrides]


class _Child:
    """``swarm-node silo`` in a subprocess whose stdout and stderr go to files (a pipe read only at exit can fill
    and stall the child), with Python's fault handler on so that a stalled child can be made to print where."""

    def __init__(self, run: Path, *overrides: str):
        self.out_path, self.err_path = run.parent / "child.out", run.parent / "child.err"
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"}
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.proc = subprocess.Popen(_cli(run, *overrides), env=env, stdout=out, stderr=err)

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def wait_for(self, path: Path, stall: float = 180.0, cap: float = 900.0) -> None:
        """Return once ``path`` exists. Waits as long as the child keeps logging (up to ``cap`` s in all) and
        fails once it has logged nothing for ``stall`` s, with the stacks it was stuck in and its log's tail."""
        start = last_change = time.monotonic()
        size = -1
        while not path.exists():
            if self.proc.poll() is not None:
                raise AssertionError(f"process exited early ({self.proc.returncode}): {self.stderr()[-3000:]}")
            now = time.monotonic()
            if (grown := self.err_path.stat().st_size) != size:
                size, last_change = grown, now
            if now - last_change > stall or now - start > cap:
                self.proc.send_signal(signal.SIGABRT)  # the fault handler prints every thread's stack
                self.proc.send_signal(signal.SIGCONT)  # in case it was stopped
                try:
                    self.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout=30)
                err = self.stderr()
                # from the fault handler's first dump on, whole: a fixed tail can hold only its module list, and
                # walking another thread's frames while it runs can fault, which prints a second, stackless dump
                dump = err.find("Fatal Python error")
                shown = err[dump:dump + 30000] if dump >= 0 else err[-6000:]
                raise AssertionError(f"{path} did not appear after {now - start:.0f} s, the child's log silent for "
                                     f"{now - last_change:.0f} s; its stderr:\n{shown}")
            time.sleep(0.1)


def test_sigkill_after_a_checkpoint_resumes_at_that_step_and_finishes(tmp_path):
    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # A run far longer than the wait, killed once step 2's checkpoint is seen: tiny-base's steps take
    # milliseconds, so a run of a dozen could finish between two polls.
    child = _Child(run, "train.steps=100000")
    child.wait_for(run / "checkpoints" / "step_000002" / "state.json")
    child.proc.send_signal(signal.SIGKILL)
    child.proc.wait(timeout=30)
    steps_done = [r["step"] for r in read_metrics(run / "metrics.jsonl")]
    assert 2 <= max(steps_done) < 100000
    last = max(steps_done) + 3  # past what the killed run reached, so resuming redoes and adds steps
    done = subprocess.run(_cli(run, f"train.steps={last}"), env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    latest = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert latest[-1] == f"step_{last:06d}"
    resumed_at = [ln for ln in done.stderr.splitlines() if "resumed from" in ln]
    assert resumed_at and "at step" in resumed_at[0]
    assert "Warning" not in done.stderr, done.stderr  # a normal run prints no library warning
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == list(range(1, last + 1))


def test_sigterm_finishes_the_step_checkpoints_and_exits_0(tmp_path):
    run = tmp_path / "run"
    child = _Child(run, "train.steps=1000", "train.checkpoint_every=1000")
    child.wait_for(run / "metrics.jsonl")
    while not read_metrics(run / "metrics.jsonl"):
        time.sleep(0.1)
    child.proc.send_signal(signal.SIGTERM)
    child.proc.wait(timeout=120)
    assert child.proc.returncode == 0, child.stderr()[-2000:]
    steps = [r["step"] for r in read_metrics(run / "metrics.jsonl")]
    ckpts = sorted((run / "checkpoints").iterdir())
    assert ckpts and ckpts[-1].name == f"step_{steps[-1]:06d}"
    assert "stopped at step" in child.out_path.read_text()


def test_a_child_that_stalls_is_reported_with_its_stacks(tmp_path):
    """The wait above fails on a stalled child with where it is stuck, not a bare timeout."""
    run = tmp_path / "run"
    child = _Child(run, "train.steps=100000")
    try:
        child.wait_for(run / "metrics.jsonl")  # running, its fault handler on
        child.proc.send_signal(signal.SIGSTOP)  # stopped: it logs nothing more
        with pytest.raises(AssertionError, match="did not appear") as failed:
            child.wait_for(tmp_path / "never", stall=2.0, cap=60.0)
        shown = str(failed.value)
        # The handler writes its header in pieces from whichever thread took the signal while the main thread
        # runs on, so a log line can fall between "Fatal Python error: " and "Aborted" (it did once in CI).
        assert "Fatal Python error" in shown and "Aborted" in shown and "most recent call first" in shown, shown
        assert child.proc.returncode is not None
    finally:
        if child.proc.poll() is None:
            child.proc.kill()
            child.proc.wait(timeout=30)


def _trained_remix_node(run_dir, *, spread: bool) -> Node:
    """A ReMix node (4 LoRAs, 2 routed) run for 2 steps: it changed its LoRAs and routers and nothing frozen."""
    from tests.node.conftest import make_config

    cfg = make_config(str(run_dir), "adapter.kind=remix", "adapter.rank=4", "adapter.remix.n=4", "adapter.remix.k=2",
                      f"adapter.remix.spread={str(spread).lower()}", "train.steps=2")
    node = Node(cfg, cfg.run_dir, show_progress=False)
    node.setup()
    before = {n: p.detach().clone() for n, p in node.policy.model.named_parameters()}
    node.run()
    node.close()
    after = {n: p.detach() for n, p in node.policy.model.named_parameters()}
    trainable = {n for n, p in node.policy.model.named_parameters() if p.requires_grad}
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert changed <= trainable
    assert any("lora_B" in n for n in changed) and any("router" in n for n in changed)
    return node


def test_remix_node_trains_end_to_end_and_resumes(tmp_path):
    from tests.node.conftest import make_config

    node = _trained_remix_node(tmp_path / "rx", spread=False)
    rows = read_metrics(tmp_path / "rx" / "metrics.jsonl")
    # Routers start at zero: uniform, entropy ln 4 (n=4). At step 1 every LoRA's B is still 0, so all M
    # routings give the same loss and the RLOO router gradient is exactly 0: still ln 4. By step 2 the
    # LoRAs differ, the routings' losses differ and the router has moved away from uniform.
    entropies = [r["router_entropy"] for r in rows]
    assert entropies[0] == pytest.approx(math.log(4), abs=1e-6)
    assert 0.0 < entropies[1] < math.log(4) - 0.01, entropies
    # The evaluation at step 2: by dataset, and the held-out prompts' routing (16 prompts, k=2 a layer).
    last = rows[1]
    assert last["eval_by_dataset"] == {"add": pytest.approx(last["eval_accuracy"])}
    usage = last["routing_usage"]["add"]
    assert len(usage) == node.policy.remix.num_layers and all(sum(layer) == 16 * 2 for layer in usage)
    assert 2 / 4 - 1e-9 <= last["routing_balance"] <= 1.0 and last["routing_specialisation"] == 0.0  # one dataset
    assert sorted(last["routing_lora_norm"]) == ["0", "1", "2", "3"]
    assert max(last["routing_lora_norm"].values()) > 0  # the LoRAs trained so far have moved
    resumed = make_config(str(tmp_path / "rx"), "adapter.kind=remix", "adapter.rank=4", "adapter.remix.n=4",
                          "adapter.remix.k=2", "adapter.remix.spread=false", "train.steps=3")
    node2 = _run(resumed)
    assert node2.step == 3
    assert [r["step"] for r in read_metrics(tmp_path / "rx" / "metrics.jsonl")] == [1, 2, 3]


def test_a_spread_remix_node_trains_its_loras_and_routers_on_one_routing_a_completion(tmp_path):
    """``adapter.remix.spread``: each completion scored under one of its prompt's two routings; the LoRAs and
    the routers train, the base does not. Unlike M routings a completion, the router moves at step 1 already,
    while every LoRA's B is 0 and no routing can matter: its baseline is other completions' losses, whose
    differences it learns from as noise (zero in expectation, not in one step)."""
    node = _trained_remix_node(tmp_path / "sp", spread=True)
    assert node.trainer.spread_routings and node.trainer.routings_per_row == 1
    entropies = [r["router_entropy"] for r in read_metrics(tmp_path / "sp" / "metrics.jsonl")]
    assert all(e < math.log(4) - 1e-4 for e in entropies), entropies
