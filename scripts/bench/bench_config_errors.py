"""How long a user waits for a configuration error: the CLI on bad configs, measured as real processes.

Usage: python scripts/bench/bench_config_errors.py [--reps 3]

Each case runs ``python -m node.cli ...`` (the same code as the ``swarm-node`` command) in a fresh
process and times it from start to exit; every case must exit with code 2 and print exactly one line.
For scale, the same loop times a bare interpreter and ``import torch, transformers, hivemind`` (what a
check after the heavy imports would cost at least). Goal (issue 10): every config error in under 2 s on
an idle machine. The load average is printed before and after: figures taken on a busy machine say so.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PEER_ID = "12D3KooWDePaggDhKViWWG9BiNRGvevgFHi49xfYoAErMVvSS9oA"
GOAL_SECONDS = 2.0


def cases(tmp: Path) -> dict[str, list[str]]:
    """Bad invocations by name: argv after ``python``."""
    blocker = tmp / "a-file"
    blocker.write_text("")
    bad_yaml = tmp / "bad.yaml"
    bad_yaml.write_text("train: [unclosed\n")
    run = str(tmp / "run")
    cli = ["-m", "node.cli"]
    return {
        "bad value (train.loss=ppo)": [*cli, "silo", "--run-dir", run, "train.loss=ppo"],
        "unknown key": [*cli, "silo", "--run-dir", run, "train.lossy=1"],
        "renamed key (swarm.staleness_epochs)": [*cli, "start", "--run-dir", run, "swarm.staleness_epochs=2"],
        "override without =": [*cli, "silo", "--run-dir", run, "train.steps"],
        "missing config file": [*cli, "silo", "-c", str(tmp / "none.yaml")],
        "config file not YAML": [*cli, "silo", "-c", str(bad_yaml)],
        "unknown dataset": [*cli, "silo", "--run-dir", run, "tasks.datasets=[nope]"],
        "run dir not writable": [*cli, "silo", "--run-dir", str(blocker / "run")],
        "model not cached": [*cli, "silo", "--run-dir", run, "model.name_or_path=nobody/no-such-model"],
        "model folder missing": [*cli, "silo", "--run-dir", run, f"model.name_or_path={tmp / 'no-model'}"],
        "start: bad peer id": [*cli, "start", "--run-dir", run, "--initial-peers",
                               "/ip4/127.0.0.1/tcp/31337/p2p/notapeerid"],
        "start: impossible IP": [*cli, "start", "--run-dir", run, "--initial-peers",
                                 f"/ip4/127.0.0.300/tcp/31337/p2p/{PEER_ID}"],
        "start: peer without /p2p": [*cli, "start", "--run-dir", run, "--initial-peers", "/ip4/127.0.0.1/tcp/1"],
        "start: bad listen address": [*cli, "start", "--run-dir", run, "swarm.host_maddrs=[/ip4/0.0.0.0/tcp/x]"],
        "keygen: file exists": [*cli, "keygen", "--out", str(blocker)],
        "summarize_run: no run dir": [str(ROOT / "scripts" / "summarize_run.py"), str(tmp / "none")],
    }


def time_once(argv: list[str]) -> tuple[float, int, str]:
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=ROOT, timeout=600)
    return time.perf_counter() - started, proc.returncode, proc.stderr


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3, help="runs of each case (the median is reported)")
    args = ap.parse_args(argv)
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}  ({os.cpu_count()} CPUs)")
    failures = []
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        references = {"bare interpreter": ["-c", "pass"],
                      "import torch, transformers, hivemind": ["-c", "import torch, transformers, hivemind"]}
        for name, case in [*cases(tmp).items(), *references.items()]:
            runs = [time_once(case) for _ in range(args.reps)]
            seconds = [t for t, _, _ in runs]
            _, code, err = runs[-1]
            lines = [ln for ln in err.strip().splitlines() if ln.strip()]
            if name in references:
                print(f"{'(reference) ' + name:40s} median {statistics.median(seconds):5.2f} s  max {max(seconds):5.2f} s")
                continue
            worst = max(worst, max(seconds))
            ok = code == 2 and len(lines) == 1
            if not ok:
                failures.append(f"{name}: exit {code}, {len(lines)} lines of stderr")
            print(f"{name:40s} median {statistics.median(seconds):5.2f} s  max {max(seconds):5.2f} s  exit {code}  "
                  f"{(lines[0] if lines else '')[:90]}")
    print(f"load average after:  {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"slowest config error: {worst:.2f} s (goal: under {GOAL_SECONDS:.0f} s on an idle machine)")
    for failure in failures:
        print("NOT A ONE-LINE ERROR: " + failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
