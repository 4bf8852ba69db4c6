"""A soak of real node processes (slow): ``scripts/lab/soak.py 6 5`` on 127.0.0.1.

Six nodes, each its own Python and p2pd, train and exchange for five minutes. Every batch is honest, so
none may be rejected; each node's RSS may grow by less than 5% after the warm-up (the first quarter of
the run); and after the stop no process the soak started (node, p2pd, watchdog) may be left.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(1500)  # beyond the soak's own bound below, so the soak always gets to stop its nodes
def test_six_nodes_for_five_minutes(tmp_path: Path) -> None:
    base = tmp_path / "soak"
    proc = subprocess.Popen([sys.executable, "scripts/lab/soak.py", "6", "5", "--base", str(base), "--sample-every", "5"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=1200)
    except subprocess.TimeoutExpired:
        proc.terminate()  # soak.py stops its nodes on SIGTERM; SIGKILL would orphan them
        stdout, stderr = proc.communicate(timeout=240)
        raise AssertionError("the soak did not finish in 20 minutes: " + stdout[-3000:]) from None
    print(stdout)  # the soak's table: shown with -s, and with any failure below
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    summary = json.loads((base / "summary.json").read_text())
    assert summary["left"] == [], "processes left behind"
    for row in summary["rows"]:
        assert row["exit_code"] == 0, row
        assert row["steps"] > 0 and row["published"] > 0 and row["accepted"] > 0, row
        assert row["rejected"] == 0, f"an honest batch was rejected: {row}"
        growth = (row["rss_end"] - row["rss_start"]) / row["rss_start"]
        assert growth < 0.05, f"node {row['node']} grew {growth:.1%} after warm-up"
