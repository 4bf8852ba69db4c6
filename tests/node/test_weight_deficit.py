"""``scripts/lab/weight_deficit.py``: a peer's correct completions read by another run's checkpoint (``--node``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _table(*argv: str) -> dict[str, tuple[int, float]]:
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "lab" / "weight_deficit.py"), *argv], cwd=ROOT,
                         capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    rows = re.findall(r"^\| (tagged answer|working's answer|the rest) \| (\d+) \| ([0-9.]+) \|", out.stdout, re.M)
    assert len(rows) == 3, out.stdout
    return {part: (int(tokens), float(held)) for part, tokens, held in rows}


def test_another_runs_checkpoint_reads_the_same_peer_text_with_its_own_model(trained_run, trained_lora_run):
    peer = ["--peer", str(trained_run.run_dir), "--peer-step", "4", "--node-step", "4", "--tasks", "16"]
    own = _table(*peer)  # the receiver: the peer's own run (the default)
    other = _table(*peer, "--node", str(trained_lora_run.run_dir))
    assert sum(t for t, _ in own.values()) > 0
    assert {p: t for p, (t, _) in own.items()} == {p: t for p, (t, _) in other.items()}  # the same completions
    assert [h for _, h in own.values()] != [h for _, h in other.values()]  # weighed by another model
