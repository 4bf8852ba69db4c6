"""``scripts/bench/bench_base_reads.py`` end to end on the tiny base: the same rows read by the frozen base in
two passes and in one, both timed, their log-probs the same up to float rounding (mutation seen failing: the one
pass reading the peer rows only); a count below 1 refused naming the option."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = [sys.executable, str(ROOT / "scripts" / "bench" / "bench_base_reads.py"), "--config",
         str(ROOT / "configs" / "tiny-swarm.yaml")]


def test_both_ways_are_timed_and_read_the_same_log_probs(tmp_path):
    out = subprocess.run([*BENCH, "--repeats", "2"], capture_output=True, text=True, timeout=600, check=True,
                         cwd=tmp_path).stdout
    assert len(re.findall(r"^repeat \d: two passes [\d.]+ s, one pass [\d.]+ s$", out, re.M)) == 2
    assert re.search(r"^rows a repeat: 4 own, 8 peer; prefix kept: True; load ", out, re.M)
    assert re.search(r"^one pass / two passes: [\d.]+$", out, re.M)
    largest = re.search(r"^largest log-prob difference between the two: (\S+)$", out, re.M)
    assert largest and float(largest.group(1)) < 1e-4


def test_a_count_below_one_is_refused_naming_the_option(tmp_path):
    out = subprocess.run([*BENCH, "--peer-rows", "0"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 2 and "--peer-rows" in out.stderr
