"""scripts/local_swarm.sh: Ctrl-C stops every node cleanly (real nodes, real p2pd; slow)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from node.api.metrics import read_metrics
from tests.node.conftest import FAST

SMALL = [*FAST, "sapo.local_groups=4", "sapo.external_groups=4", "sapo.generated_groups=4",
         "swarm.epoch_seconds=5", "train.steps=100000", "train.checkpoint_every=100000"]


def _p2pd_of(pid: int) -> list[psutil.Process]:
    try:
        return [c for c in psutil.Process(pid).children(recursive=True) if "p2pd" in c.name()]
    except psutil.NoSuchProcess:
        return []


@pytest.mark.slow
def test_ctrl_c_stops_every_node_cleanly(tmp_path: Path) -> None:
    """The terminal's Ctrl-C goes to the script's whole process group; the nodes (in their own sessions)
    get only the script's SIGTERM, finish their step, checkpoint and shut their p2pd down themselves."""
    env = {**os.environ, "SWARM_RUNS": str(tmp_path), "SWARM_API_PORT": "0", "OMP_NUM_THREADS": "1"}  # free API ports
    script = subprocess.Popen(["bash", "scripts/local_swarm.sh", "2", *SMALL], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True)
    nodes: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 300
        logs = [tmp_path / f"node{i}" / "metrics.jsonl" for i in range(2)]
        while not all(p.exists() and read_metrics(p) for p in logs):
            assert script.poll() is None and time.monotonic() < deadline, "the nodes did not start training"
            time.sleep(0.5)
        nodes = [c for c in psutil.Process(script.pid).children() if "python" in c.name() or "swarm" in c.name()]
        assert len(nodes) == 2 and all(os.getsid(n.pid) == n.pid for n in nodes)  # own sessions
        p2pd = [p for n in nodes for p in _p2pd_of(n.pid)]
        assert len(p2pd) == 2
        os.killpg(script.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        out, _ = script.communicate(timeout=180)
    finally:
        if script.poll() is None:
            os.killpg(script.pid, signal.SIGKILL)
        for n in nodes:
            if n.is_running():
                os.killpg(n.pid, signal.SIGKILL)
    assert script.returncode == 0, out
    assert "stopping 2 nodes" in out
    gone, alive = psutil.wait_procs(p2pd, timeout=15)
    assert not alive, f"p2pd left behind: {alive}"
    for i in range(2):
        log = (tmp_path / f"node{i}.log").read_text()
        assert "stopped at step" in log, log[-3000:]
        assert "signal 15" in log and "signal 2:" not in log  # the script's SIGTERM, never the Ctrl-C itself
        for sign in ("Traceback", "Task exception was never retrieved", " ERROR ", "Warning"):
            assert sign not in log, log[-3000:]
        steps = [r["step"] for r in read_metrics(tmp_path / f"node{i}" / "metrics.jsonl")]
        assert (tmp_path / f"node{i}" / "checkpoints" / f"step_{steps[-1]:06d}").is_dir()
