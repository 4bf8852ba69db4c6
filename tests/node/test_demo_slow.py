"""The default silo config really learns: sampled reward rises by at least 15 points (slow: minutes)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from node.api.metrics import read_metrics


@pytest.mark.slow
def test_default_silo_run_raises_sampled_reward_by_15_points(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "node.cli", "silo", "-c", "configs/tiny-silo.yaml", "--run-dir", str(tmp_path),
         "--no-progress"],
        capture_output=True, text=True, timeout=3600, env={**os.environ},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert len(rows) == 200
    first = sum(r["reward_mean"] for r in rows[:25]) / 25
    last = sum(r["reward_mean"] for r in rows[-25:]) / 25
    assert last - first >= 0.15, (first, last)
