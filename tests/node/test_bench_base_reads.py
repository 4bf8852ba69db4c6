"""``scripts/bench/bench_base_reads.py`` end to end on the tiny base: the same rows read by the frozen base in
two passes and in one, both timed, their log-probs the same up to float rounding (mutation seen failing: the one
pass reading the peer rows only); in one pass in float32 and in bfloat16, their log-probs apart by a few
hundredths of a nat in mean (mutation seen failing: the bfloat16 way read by the float32 book); a count below 1 refused
naming the option."""

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
    largest = re.search(r"^largest log-prob difference between the two: (\S+); mean \S+$", out, re.M)
    assert largest and float(largest.group(1)) < 1e-4


def test_the_bfloat16_reads_are_timed_beside_the_policys_dtype_and_read_near_it(tmp_path):
    out = subprocess.run([*BENCH, "--repeats", "2", "--compare", "bfloat16"], capture_output=True, text=True,
                         timeout=600, check=True, cwd=tmp_path).stdout
    assert len(re.findall(r"^repeat \d: model dtype [\d.]+ s, bfloat16 [\d.]+ s$", out, re.M)) == 2
    assert re.search(r"^bfloat16 / model dtype: [\d.]+$", out, re.M)
    gaps = re.search(r"^largest log-prob difference between the two: (\S+); mean (\S+)$", out, re.M)
    assert gaps and 1e-4 < float(gaps.group(1)) < 1.0 and float(gaps.group(2)) < 0.05, gaps.group(0)


def test_a_count_below_one_is_refused_naming_the_option(tmp_path):
    out = subprocess.run([*BENCH, "--peer-rows", "0"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 2 and "--peer-rows" in out.stderr
