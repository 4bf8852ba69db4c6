"""Crash safety with real node processes: SIGKILL at chosen and at random moments, a killed p2pd, a frozen peer.

After every kill the run dir must be usable as it is: the newest complete checkpoint loads, metrics.jsonl
holds steps 1..k exactly once each, and a restart resumes from that checkpoint with the same identity.
Exact moments come from crash points (``node/failpoints.py``: SIGKILL from inside, so the moment is
certain); random moments from ``kill -9`` sent from outside after a random delay.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from node.api.metrics import read_metrics
from node.failpoints import CRASH_ENV
from node.run.checkpoint import CheckpointManager
from tests.node.conftest import FAST

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
NODE_ARGS = [*FAST, "sapo.local_groups=4", "sapo.external_groups=4", "sapo.generated_groups=4",
             "train.eval_every=1000", "swarm.epoch_seconds=5"]
KILLED = -signal.SIGKILL


def node_cmd(run_dir: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "node.cli", "start", "-c", "configs/tiny-swarm.yaml", "--run-dir", str(run_dir),
            "--no-progress", *NODE_ARGS, *args]


def run_node(run_dir: Path, steps: int, crash: str | None = None, timeout: float = 300) -> tuple[int, str]:
    env = {**ENV, CRASH_ENV: crash} if crash else {k: v for k, v in ENV.items() if k != CRASH_ENV}
    # Epochs so short that a batch may go out every step (min_publish_interval: an eighth of an epoch, 1.25 ms,
    # under any step), so crash points count steps however fast the machine runs them.
    proc = subprocess.run(node_cmd(run_dir, f"train.steps={steps}", "swarm.epoch_seconds=0.01"), env=env,
                          capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr


def p2pd_children(pid: int) -> list[psutil.Process]:
    try:
        return [c for c in psutil.Process(pid).children(recursive=True) if "p2pd" in c.name()]
    except psutil.NoSuchProcess:
        return []


def no_p2pd_of(pids: list[int], timeout: float = 15.0) -> bool:
    """True once none of ``pids`` (p2pd processes) is alive any more."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids):
            return True
        time.sleep(0.2)
    return False


def check_run_dir(run_dir: Path) -> tuple[int, int]:
    """Assert the run dir is consistent; return (last metrics step, newest checkpoint step or 0)."""
    steps = [int(r["step"]) for r in read_metrics(run_dir / "metrics.jsonl")] if (run_dir / "metrics.jsonl").exists() else []
    assert steps == list(range(1, len(steps) + 1)), f"metrics steps not 1..k exactly once: {steps}"
    manager = CheckpointManager(run_dir, keep=3)
    latest = manager.latest()
    ckpt_step = 0
    if latest is not None:
        state = manager.load(latest)  # loads: the newest complete checkpoint is usable as it is
        ckpt_step = state.step
        assert latest.name == f"step_{ckpt_step:06d}" and state.trainable and state.optimizer
        assert ckpt_step <= len(steps), "a checkpoint is newer than the metrics"
    return len(steps), ckpt_step


def resumed_at(output: str) -> int | None:
    m = re.search(r"resumed from \S+ at step (\d+)", output)
    return int(m.group(1)) if m else None


def peer_id(output: str) -> str:
    m = re.search(r"peer id ([0-9a-f]{32})", output)
    assert m, output[-2000:]
    return m.group(1)


def test_kill_at_checkpoint_write_and_publish_then_resume(tmp_path: Path) -> None:
    """The default run's share of the kill matrix: SIGKILL while a checkpoint is being written (files
    written, not yet renamed) and right after a batch was published; each restart resumes from the newest
    complete checkpoint, metrics stay 1..k, and the identity is the same."""
    run = tmp_path / "run"
    rc, out = run_node(run, steps=6, crash="checkpoint_files:2")  # dies writing step 4's checkpoint
    assert rc == KILLED, out[-3000:]
    identity = (run / "identity.pem").read_bytes()
    first_peer = peer_id(out)
    assert check_run_dir(run) == (4, 2)
    assert list((run / "checkpoints").glob(".tmp-*")), "the half-written checkpoint was under its temporary name"

    rc, out = run_node(run, steps=6, crash="publish:1")  # resumes at 2, dies after publishing step 3's batch
    assert rc == KILLED, out[-3000:]
    assert resumed_at(out) == 2
    assert check_run_dir(run) == (2, 2)  # step 3's metrics line was never written

    rc, out = run_node(run, steps=6)
    assert rc == 0, out[-3000:]
    assert resumed_at(out) == 2
    assert check_run_dir(run) == (6, 6)
    assert (run / "identity.pem").read_bytes() == identity and peer_id(out) == first_peer
    assert not list((run / "checkpoints").glob(".tmp-*")) and not list((run / "checkpoints").glob(".trash-*"))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("crash", "expected"),
    [
        ("generation:3", (2, 2)),  # during step 3's generation
        ("publish:4", (3, 2)),  # step 4's batch published, step 4 not trained
        ("checkpoint_files:1", (2, 0)),  # the first checkpoint's files written, not renamed
        ("checkpoint_renamed:2", (4, 4)),  # step 4's checkpoint in place, step 2's not yet pruned
    ],
)
def test_kill_matrix(tmp_path: Path, crash: str, expected: tuple[int, int]) -> None:
    run = tmp_path / "run"
    rc, out = run_node(run, steps=6, crash=crash)
    assert rc == KILLED, out[-3000:]
    assert check_run_dir(run) == expected
    identity = (run / "identity.pem").read_bytes()
    rc, out = run_node(run, steps=6)
    assert rc == 0, out[-3000:]
    assert resumed_at(out) == (expected[1] or None)
    assert check_run_dir(run) == (6, 6)
    assert (run / "identity.pem").read_bytes() == identity


@pytest.mark.slow
def test_kill_at_random_moments(tmp_path: Path) -> None:
    """``kill -9`` from outside after random delays, five times on one run dir, then run to the end."""
    run = tmp_path / "run"
    rng = random.Random(int(os.environ.get("CRASH_SEED", "13")))
    identity = None
    orphans: list[int] = []
    for _ in range(5):
        proc = subprocess.Popen(node_cmd(run, "train.steps=12"), env=ENV, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        # Wait until it trains (a metrics line past the resumed step, or the file exists), then a random delay.
        before = check_run_dir(run)[0]
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            if (run / "metrics.jsonl").exists() and check_run_dir(run)[0] > before:
                break
            time.sleep(0.1)
        time.sleep(rng.uniform(0.0, 4.0))
        orphans += [p.pid for p in p2pd_children(proc.pid)]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        check_run_dir(run)
        identity = identity or (run / "identity.pem").read_bytes()
        assert (run / "identity.pem").read_bytes() == identity
    rc, out = run_node(run, steps=12)
    assert rc == 0, out[-3000:]
    assert check_run_dir(run) == (12, 12)
    assert no_p2pd_of(orphans), "a killed node's p2pd outlived it"


def test_killed_p2pd_is_restarted_while_training_goes_on(tmp_path: Path) -> None:
    run = tmp_path / "run"
    with open(tmp_path / "node.err", "w") as err:  # a file, not a pipe that nothing reads until the end
        proc = subprocess.Popen(node_cmd(run, "train.steps=100000", "train.checkpoint_every=100000"), env=ENV,
                                stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 240
        while not p2pd_children(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        (old,) = p2pd_children(proc.pid)
        while len(read_metrics(run / "metrics.jsonl") if (run / "metrics.jsonl").exists() else []) < 2:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.2)
        old.kill()
        killed_at = time.time()
        new: list[psutil.Process] = []
        while not new and time.monotonic() < deadline:
            new = [p for p in p2pd_children(proc.pid) if p.pid != old.pid]
            time.sleep(0.2)
        assert new, "no new p2pd after the old one was killed"
        steps_during = [r for r in read_metrics(run / "metrics.jsonl") if r["time"] > killed_at]
        # Training never waited for the network: it stepped on while p2pd was down or restarting.
        while not any(r["network_running"] for r in steps_during if r["time"] > killed_at + 1):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.5)
            steps_during = [r for r in read_metrics(run / "metrics.jsonl") if r["time"] > killed_at]
        assert len(steps_during) >= 2
    finally:
        children = [p.pid for p in p2pd_children(proc.pid)]
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert rc == 0, (tmp_path / "node.err").read_text()[-3000:]
    assert no_p2pd_of(children)


def _address(proc: subprocess.Popen, timeout: float = 240.0) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    for line in proc.stdout:
        m = re.search(r"--initial-peers (\S+)", line)
        if m:  # keep reading its output, so the pipe never fills
            threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()  # type: ignore[union-attr]
            return m.group(1)
        assert time.monotonic() < deadline, "node printed no address"
    raise AssertionError("node exited before printing its address")


def _rows(run: Path) -> list[dict]:
    return read_metrics(run / "metrics.jsonl") if (run / "metrics.jsonl").exists() else []


@pytest.mark.slow
def test_a_frozen_peer_does_not_stall_the_node(tmp_path: Path) -> None:
    """SIGSTOP a peer (its Python and its p2pd) for three times the request timeout: the other node keeps
    stepping at its own pace, and takes the peer's batches again once it is continued."""
    long_run = ["train.steps=100000", "train.checkpoint_every=100000", "swarm.request_timeout=3",
                "swarm.publish_timeout=5"]
    a = subprocess.Popen(node_cmd(tmp_path / "a", *long_run), env=ENV, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    b = None
    try:
        addr = _address(a)
        b = subprocess.Popen(node_cmd(tmp_path / "b", *long_run, "seed=1", "--initial-peers", addr), env=ENV,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 300
        while not (_rows(tmp_path / "a") and _rows(tmp_path / "a")[-1]["batches_accepted"] > 0):
            assert time.monotonic() < deadline, "a never accepted a batch of b"
            time.sleep(0.5)
        before = _rows(tmp_path / "a")
        daemons = [p.pid for p in p2pd_children(b.pid)]  # p2pd runs in a session of its own
        assert daemons, "b has no p2pd"
        os.killpg(b.pid, signal.SIGSTOP)  # b's Python (and its scoring child)
        for pid in daemons:
            os.kill(pid, signal.SIGSTOP)
        frozen_at = time.time()
        time.sleep(9.0)
        for pid in daemons:
            os.kill(pid, signal.SIGCONT)
        os.killpg(b.pid, signal.SIGCONT)
        continued_at = time.time()
        during = [r for r in _rows(tmp_path / "a") if frozen_at <= r["time"] <= continued_at]
        gaps = [y["time"] - x["time"] for x, y in zip(before[-5:], before[-4:])]
        # a never waited for the frozen peer: it stepped all along, no step much slower than before.
        assert len(during) >= 3, during
        assert max(r["step_seconds"] for r in during) < max(3.0, 4 * max(gaps)), during
        accepted = _rows(tmp_path / "a")[-1]["batches_accepted"]
        while _rows(tmp_path / "a")[-1]["batches_accepted"] <= accepted:
            assert time.monotonic() < deadline + 60, "no batch of b accepted after it was continued"
            time.sleep(0.5)
    finally:
        for proc in (a, b):
            if proc is not None and proc.poll() is None:
                if proc is b:
                    for child in p2pd_children(proc.pid):
                        os.kill(child.pid, signal.SIGCONT)
                    os.killpg(proc.pid, signal.SIGCONT)
                proc.send_signal(signal.SIGTERM)
        for proc in (a, b):
            if proc is not None:
                try:
                    proc.wait(timeout=120)
                except subprocess.TimeoutExpired:
                    proc.kill()
