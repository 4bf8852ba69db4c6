"""``scripts/lab/wan_swarm.py`` end to end (slow): real nodes over emulated wide-area links, beside loopback.

Four ``swarm-node start`` processes (tiny-base, ``configs/public-swarm.yaml``) per scenario, on loopback,
on intercontinental links (150 ms +/- 40, 1% loss, 20 Mbit/s) and with two bad-home nodes behind the lab's
NAT (250 ms +/- 80, 3% loss, 5 Mbit/s). The public config's defaults must carry every batch of the window
to every node within two epochs, ban no honest node, and get the NATed nodes' batches through their
hand-offs; nothing of the run (processes, namespaces) may be left behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.swarm.test_netns import _REASON, _REQUIRED

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.skipif(_REASON is not None and not _REQUIRED, reason=str(_REASON))]


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


@pytest.mark.timeout(1800)  # about 3 minutes a scenario on an idle machine, up to twice that when loaded
def test_wan_swarm_delivers_everything_over_every_profile(tmp_path: Path) -> None:
    if _REASON is not None:
        pytest.fail(f"SWARM_NODE_NETNS=require, but network namespaces are unavailable: {_REASON}")
    before = _namespaces()
    out = tmp_path / "wan.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "lab" / "wan_swarm.py"), "--nodes", "4", "--scenarios",
         "loopback,intercontinental,bad-home", "--epoch-seconds", "30", "--warmup", "10", "--window", "60",
         "--base", str(tmp_path / "runs"), "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=1700, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = {r["scenario"]: r for r in json.loads(out.read_text())["results"]}
    assert set(results) == {"loopback", "intercontinental", "bad-home"}, proc.stdout[-3000:]
    for name, result in results.items():
        assert "error" not in result, (name, result.get("error"))
        assert not result["left_behind"] and all(code == 0 for code in result["exit_codes"]), result
        assert result["offences"] == 0, (name, [r["offences"] for r in result["rows"]])
        assert result["pairs_expected"] > 0 and result["min_share"] >= 0.8, (name, proc.stdout[-3000:])
    nat = [r for r in results["bad-home"]["rows"] if r["nat"]]
    assert len(nat) == 2 and results["bad-home"]["nat_share"] >= 0.8
    assert all(r["handoffs_per_batch"] >= 1 for r in nat)
    assert _namespaces() <= before, "namespaces left behind"
    leftover = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True).stdout.split()
    assert not leftover, f"processes left behind: {leftover}"
