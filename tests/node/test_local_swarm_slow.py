"""``scripts/local_swarm.sh`` starts N nodes and prints each one's dashboard URL (slow: two real daemons)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_local_swarm_prints_a_working_dashboard_url_per_node(tmp_path):
    env = {**os.environ, "SWARM_RUNS": str(tmp_path), "SWARM_API_PORT": "0", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(["bash", "scripts/local_swarm.sh", "2", "train.steps=100000", "sapo.local_groups=4",
                             "sapo.external_groups=4", "sapo.generated_groups=4", "generation.group_size=4"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    urls: dict[str, str] = {}
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 600
        for line in proc.stdout:
            m = re.match(r"(node\d) dashboard: (http://\S+)", line)
            if m:
                urls[m.group(1)] = m.group(2)
            if len(urls) == 2 or "nodes running" in line or time.monotonic() > deadline:
                break
        assert set(urls) == {"node0", "node1"}, urls
        for name, url in urls.items():
            with urllib.request.urlopen(url + "api/status", timeout=10) as resp:
                status = json.loads(resp.read())
            assert status["mode"] == "swarm" and status["run_dir"] == name
    finally:
        proc.send_signal(signal.SIGTERM)  # the script's trap stops both nodes and waits for them
        proc.wait(timeout=180)
