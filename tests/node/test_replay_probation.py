"""``scripts/lab/replay_probation.py`` on running screen figures written by hand: an author whose early failures
are the policy's read alone is paused by the probation counting every failure and not by the one counting the
base's (mutation seen failing: the base's count taking every failure); one failing on the base's read is paused
by both, at the step its fourth failure came; failures after the first 16 completions pause no one; a file
without figures is refused (exit 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = [sys.executable, str(ROOT / "scripts" / "lab" / "replay_probation.py")]


def _figure(step: int, author: int, judged: int, failed: int, policy: int) -> list:
    return [step, 0, author, {"judged": judged, "failed": failed, "policy_failed": policy}]


def test_the_replay_pauses_on_the_counts_each_key_takes(tmp_path):
    figures = [
        # author 1: 8 judged, 2 failed (the policy's alone); then 8, 2 more (the policy's alone): 4 of 16
        _figure(1, 1, 8, 2, 2), _figure(2, 1, 16, 4, 4),
        # author 2: 4 failures of the base's read by step 3 (1, 2, 4 failures after steps 1, 2, 3)
        _figure(1, 2, 4, 1, 0), _figure(2, 2, 8, 2, 0), _figure(3, 2, 12, 4, 0),
        # author 3: none of its first 16 failed, then all of the next 8
        _figure(1, 3, 16, 0, 0), _figure(2, 3, 24, 8, 0),
    ]
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"screen_figures": figures, "screen_pauses": []}))
    out = subprocess.run([*SCRIPT, str(run)], capture_output=True, text=True, timeout=60, check=True).stdout
    assert "| 0 | 1 | 16 | 4 | 0 | 2 | - |" in out
    assert "| 0 | 2 | 12 | 4 | 4 | 3 | 3 |" in out
    assert "| 0 | 3 | 16 | 0 | 0 | - | - |" in out
    assert out.rstrip().endswith("authors: 3; paused by the new-author probation counting every failure: 2; "
                                 "counting the base's: 1")


def test_a_file_without_figures_is_refused(tmp_path):
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"rewards": []}))
    out = subprocess.run([*SCRIPT, str(run)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "screen figures" in out.stderr
