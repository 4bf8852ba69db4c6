"""``scripts/bench/bench_screen.py`` end to end on tiny-base nodes: the screened and unscreened victims and an
``--arm`` victim with its own keys, each reported with its step ratio (mutation seen failing: the arm's victim
not built); a malformed ``--arm`` refused."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = [sys.executable, str(ROOT / "scripts" / "bench" / "bench_screen.py"), "--config",
         str(ROOT / "configs" / "tiny-swarm.yaml"), "--threads", "1"]


def test_an_arm_is_a_further_screened_victim_reported_beside_the_others(tmp_path):
    cmd = [*BENCH, "--steps", "1", "--arm", "whole:ingest.screen_prefix_cache=false"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=True, cwd=tmp_path).stdout
    for victim in ("screen", "no screen", "whole"):
        assert re.search(rf"^\| {victim} \| [\d.]+ \| [\d.]+ \| [\d.]+ \([\d.]+\) \| [\d.]+ \| \d+ \|$", out, re.M), victim
    for victim in ("screen", "whole"):
        assert re.search(rf"^step ratio, {victim} / no screen: [\d.]+$", out, re.M), victim
        assert re.search(rf"^{victim}:$", out, re.M), "each screened victim's steps"


def test_a_malformed_arm_is_refused_naming_the_option(tmp_path):
    for arm in ("whole", "screen:ingest.screen=false", ":ingest.screen=false"):
        out = subprocess.run([*BENCH, "--arm", arm], capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert out.returncode == 2 and "--arm" in out.stderr, arm
