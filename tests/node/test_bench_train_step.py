"""``scripts/bench/bench_train_step.py`` end to end on a small tiny-base step: each way (fused, shared through the
modules, full) in its own process, the table with the token counts, and the full pass computing every row's
prompt."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_benchmark_times_both_ways_and_counts_the_prompt_tokens_it_saves(tmp_path):
    cmd = [sys.executable, str(ROOT / "scripts" / "bench" / "bench_train_step.py"), "-c", str(ROOT / "configs" / "tiny-silo.yaml"),
           "--groups", "4", "--reps", "1", "generation.group_size=4"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=True, cwd=tmp_path).stdout
    # 4 groups of 4 rows: every row's prompt (16 of them) against the 4 distinct ones.
    counts = re.search(r"16 rows a step \(4 groups\), prompt tokens (\d+) \((\d+) distinct\)", out)
    assert counts and int(counts[1]) == 4 * int(counts[2]) > 0
    for mode in ("fused", "shared", "full"):
        row = re.search(rf"^{mode}\s+([\d.]+)\s+(\d+)$", out, re.M)
        assert row and float(row[1]) > 0 and int(row[2]) > 0
    assert re.search(r"full / shared: [\d.]+x the time, [\d.]+x the peak memory", out)
    assert re.search(r"shared / fused: [\d.]+x the time, [\d.]+x the peak memory; load average", out)
