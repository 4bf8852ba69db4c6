"""``scripts/experiments/probe_peer_text.py`` end to end on small-base reading its own samples (a few seconds)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "experiments" / "probe_peer_text.py"), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


def test_a_model_reads_its_own_samples_at_a_finite_negative_log_prob():
    out = _run("--models", "small-base", "--tasks", "1", "--samples", "2", "--threads", "1")
    assert out.returncode == 0, out.stderr[-2000:]
    row = re.search(r"\| small-base \| small-base \| (-?[0-9.]+) \| (\d+)/(\d+) \| ([0-9.]+) \| (\d+)/(\d+) \|", out.stdout)
    assert row, out.stdout
    logprob, spelled, seen = float(row.group(1)), int(row.group(2)), int(row.group(3))
    assert logprob < 0 and seen == 4 and spelled == 4  # 2 tasks (one a dataset) x 2 samples, its own text
    assert int(row.group(6)) == 2


def test_an_unknown_model_is_a_one_line_error():
    out = _run("--models", "gpt-9")
    assert out.returncode != 0 and "--models: unknown model 'gpt-9'" in out.stderr
