"""How a run dir grows over a long run: runs ``swarm-node silo`` (or ``start``) for N steps as a subprocess
and prints the size of each part of its run dir (metrics.jsonl, checkpoints, node.log, the rest) every
``--every`` steps, then the totals, the wall time, the CPU time and the machine's load average.

    python scripts/experiments/run_dir_growth.py --steps 10000 --every 1000 -- -c configs/tiny-silo.yaml \\
        sapo.local_groups=8 generation.group_size=4 tasks.eval_size=32

Arguments after ``--`` go to ``swarm-node silo`` (``--mode start`` for a swarm node); ``train.steps`` and
``--run-dir`` are set here. The run dir is removed at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def _parts(run: Path) -> dict[str, int]:
    total = _size(run)
    parts = {"metrics.jsonl": _size(run / "metrics.jsonl"), "checkpoints": _size(run / "checkpoints"),
             "node.log*": sum(_size(p) for p in run.glob("node.log*"))}
    parts["other"] = total - sum(parts.values())
    parts["total"] = total
    return parts


def _last_step(metrics: Path) -> int:
    try:
        with open(metrics, "rb") as fh:
            fh.seek(max(0, fh.seek(0, os.SEEK_END) - 65536))
            lines = fh.read().splitlines()
        return int(json.loads(lines[-1])["step"]) if lines else 0
    except (OSError, ValueError, KeyError, IndexError):
        return 0


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10000)
    parser.add_argument("--every", type=int, default=1000, help="steps between size reports")
    parser.add_argument("--mode", choices=("silo", "start"), default="silo")
    parser.add_argument("--run-dir", help="default: a temporary folder")
    parser.add_argument("--keep", action="store_true", help="keep the run dir")
    parser.add_argument("node_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    node_args = [a for a in args.node_args if a != "--"]
    run = Path(args.run_dir or tempfile.mkdtemp(prefix="run-dir-growth-")) / "run"
    cmd = [sys.executable, "-m", "node.cli", args.mode, "--run-dir", str(run), "--no-progress", *node_args,
           f"train.steps={args.steps}"]
    print("command:", " ".join(cmd[2:]), flush=True)
    load_before = os.getloadavg()
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print(f"{'step':>7} {'metrics MiB':>11} {'checkpoints MiB':>15} {'node.log MiB':>12} {'other MiB':>9} "
          f"{'total MiB':>9} {'elapsed s':>9}", flush=True)
    next_report = args.every
    try:
        while proc.poll() is None:
            step = _last_step(run / "metrics.jsonl")
            if step >= next_report:
                p = _parts(run)
                print(f"{step:>7} {_mib(p['metrics.jsonl']):>11} {_mib(p['checkpoints']):>15} "
                      f"{_mib(p['node.log*']):>12} {_mib(p['other']):>9} {_mib(p['total']):>9} "
                      f"{time.monotonic() - t0:>9.0f}", flush=True)
                next_report = (step // args.every + 1) * args.every
            time.sleep(1.0)
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=120)
    wall = time.monotonic() - t0
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = _parts(run)
    print(f"final  metrics {_mib(p['metrics.jsonl'])} MiB, checkpoints {_mib(p['checkpoints'])} MiB, node.log "
          f"{_mib(p['node.log*'])} MiB, other {_mib(p['other'])} MiB: total {_mib(p['total'])} MiB")
    print(f"rc {proc.returncode}; {_last_step(run / 'metrics.jsonl')} steps in {wall:.0f} s wall, "
          f"{usage.ru_utime + usage.ru_stime:.0f} CPU-seconds; load average before "
          f"{'/'.join(f'{x:.1f}' for x in load_before)}, after {'/'.join(f'{x:.1f}' for x in os.getloadavg())}")
    if not args.keep:
        shutil.rmtree(run.parent, ignore_errors=True)
    return proc.returncode or 0


if __name__ == "__main__":
    sys.exit(main())
