"""Soak a local swarm: N real node processes (each its own Python and p2pd) on 127.0.0.1 for M minutes.

    scripts/soak.sh 16 30                       # or: .venv/bin/python scripts/lab/soak.py 16 30 [key=value ...]

Node 0 bootstraps the others; every node runs ``swarm-node start`` on the tiny model with
``configs/tiny-swarm.yaml`` (overrides after the two numbers go to every node). A bounded sampling loop
(one sample every ``--sample-every`` seconds until the time is up) records the RSS of each node's Python
process and of its p2pd. Then every node gets SIGTERM (it finishes its step, checkpoints, shuts its
network down), stragglers get SIGKILL after ``--stop-timeout`` seconds, and the script checks with ``ps``
that no process it started (node, p2pd, watchdog) is left. It prints per node: steps, batches published,
accepted and rejected, RSS at start (after ``--warmup`` of the run), mid and end, p2pd RSS; then totals,
and writes everything to ``BASE/summary.json``. Exit status 1 if a process was left behind or a node died.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from scripts.lib.netlab.processes import p2pd_of, rss, stop_all, watchdogs_of

ROOT = Path(__file__).resolve().parents[2]
MIB = 1024 * 1024
NODE_DEFAULTS = [
    "train.steps=1000000000",  # bounded by time, not steps
    "train.checkpoint_every=50",
    "train.eval_every=1000000",
    "tasks.eval_size=16",
    "sapo.local_groups=4",
    "sapo.generated_groups=4",
    "sapo.external_groups=4",
    "generation.group_size=4",
    "swarm.epoch_seconds=30",
    # 16 nodes on 2 cores queue every DHT read behind 15 training processes: with the default 5 s most reads
    # of a 16-node soak timed out and 5 nodes accepted nothing; 15 s (as in configs/public-swarm.yaml) lets
    # all of them exchange. An override after the two numbers still wins.
    "swarm.request_timeout=15",
]


def start_node(i: int, base: Path, overrides: list[str], initial: str | None) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "node.cli", "start", "-c", "configs/tiny-swarm.yaml", "--run-dir",
           str(base / f"node{i}"), "--no-progress", f"seed={i}", *NODE_DEFAULTS, *overrides]
    if initial:
        cmd += ["--initial-peers", initial]
    log = open(base / f"node{i}.log", "wb")  # noqa: SIM115 -- kept open by the child
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def wait_address(proc: subprocess.Popen[bytes], log: Path, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = re.search(r"--initial-peers (\S+)", log.read_text(errors="replace")) if log.exists() else None
        if m:
            return m.group(1).split(",")[0]
        if proc.poll() is not None:
            raise SystemExit(f"node0 exited ({proc.returncode}); see {log}")
        time.sleep(0.5)
    raise SystemExit(f"node0 printed no address in {timeout:.0f} s; see {log}")


def sample(procs: list[subprocess.Popen[bytes]]) -> list[dict[str, int]]:
    out = []
    for proc in procs:
        daemons = p2pd_of(proc.pid)
        out.append({"rss": rss(proc.pid), "p2pd_rss": sum(rss(p) for p in daemons), "p2pd": len(daemons)})
    return out


def last_metrics(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "metrics.jsonl"
    last: dict[str, Any] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                last = json.loads(line)
            except json.JSONDecodeError:
                continue
    return last


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("nodes", type=int)
    parser.add_argument("minutes", type=float)
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    parser.add_argument("--base", default=os.environ.get("SWARM_RUNS", "runs/soak"))
    parser.add_argument("--sample-every", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=0.25, help="fraction of the run before the start sample")
    parser.add_argument("--stop-timeout", type=float, default=120.0)
    args = parser.parse_args()
    # SIGTERM (e.g. a test's time-out) unwinds through the ``finally`` below: every node is still stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.nodes < 2 or args.minutes <= 0:
        parser.error("need at least 2 nodes and a positive number of minutes")
    base = Path(args.base).resolve()
    base.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    procs = [start_node(0, base, args.overrides, None)]
    all_daemons: set[int] = set()
    try:
        address = wait_address(procs[0], base / "node0.log", 300)
        procs += [start_node(i, base, args.overrides, address) for i in range(1, args.nodes)]
        t0 = time.monotonic()
        duration = args.minutes * 60
        samples: list[tuple[float, list[dict[str, int]]]] = []
        while time.monotonic() - t0 < duration:  # bounded: ends when the time is up
            time.sleep(min(args.sample_every, max(0.0, duration - (time.monotonic() - t0))))
            samples.append((time.monotonic() - t0, sample(procs)))
            all_daemons |= {p for proc in procs for p in p2pd_of(proc.pid)}
            died = [i for i, proc in enumerate(procs) if proc.poll() is not None]
            if died:
                print(f"nodes {died} exited early; see {base}/node<i>.log", file=sys.stderr)
                break
        load_during = os.getloadavg()
    finally:
        left = stop_all(procs, args.stop_timeout)
    left += watchdogs_of(all_daemons)
    return report(args, base, procs, samples, left, load_before, load_during)


def _at(samples: list[tuple[float, list[dict[str, int]]]], t: float) -> list[dict[str, int]]:
    return min(samples, key=lambda s: abs(s[0] - t))[1]


def report(args: argparse.Namespace, base: Path, procs: list[subprocess.Popen[bytes]],
           samples: list[tuple[float, list[dict[str, int]]]], left: list[int],
           load_before: tuple[float, float, float], load_during: tuple[float, float, float]) -> int:
    duration = samples[-1][0] if samples else 0.0
    start, mid, end = (_at(samples, f * duration) for f in (args.warmup, (1 + args.warmup) / 2, 1.0))
    rows = []
    for i, proc in enumerate(procs):
        m = last_metrics(base / f"node{i}")
        rejected = m.get("batches_rejected") or {}
        rows.append({
            "node": i, "exit_code": proc.returncode, "steps": m.get("step", 0),
            "published": m.get("batches_published", 0), "accepted": m.get("batches_accepted", 0),
            "rejected": sum(rejected.values()), "rejected_by_reason": rejected,
            "rss_start": start[i]["rss"], "rss_mid": mid[i]["rss"], "rss_end": end[i]["rss"],
            "p2pd_rss_start": start[i]["p2pd_rss"], "p2pd_rss_end": end[i]["p2pd_rss"],
        })
    print(f"soak: {args.nodes} nodes x {duration / 60:.1f} min on {os.cpu_count()} CPUs; load average "
          f"before {load_before[0]:.2f}, at the end {load_during[0]:.2f} {load_during[1]:.2f} {load_during[2]:.2f}")
    print(f"RSS start = after {args.warmup:.0%} of the run (warm-up), mid = {(1 + args.warmup) / 2:.0%}, end = 100%")
    print("node  steps  published  accepted  rejected   RSS start/mid/end (MiB)   growth   p2pd start/end (MiB)")
    for r in rows:
        growth = (r["rss_end"] - r["rss_start"]) / max(r["rss_start"], 1)
        print(f"{r['node']:4d} {r['steps']:6d} {r['published']:10d} {r['accepted']:9d} {r['rejected']:9d}   "
              f"{r['rss_start'] / MIB:7.0f} {r['rss_mid'] / MIB:7.0f} {r['rss_end'] / MIB:7.0f}   {growth:+6.1%}   "
              f"{r['p2pd_rss_start'] / MIB:6.0f} {r['p2pd_rss_end'] / MIB:6.0f}")
    total = sum(r["rss_end"] + r["p2pd_rss_end"] for r in rows)
    per_node = total / max(len(rows), 1)
    print(f"memory at the end: {total / MIB:.0f} MiB in total, {per_node / MIB:.0f} MiB per node "
          f"(Python {sum(r['rss_end'] for r in rows) / len(rows) / MIB:.0f} + p2pd "
          f"{sum(r['p2pd_rss_end'] for r in rows) / len(rows) / MIB:.0f})")
    print(f"batches: {sum(r['published'] for r in rows)} published, {sum(r['accepted'] for r in rows)} accepted, "
          f"{sum(r['rejected'] for r in rows)} rejected")
    print(f"processes left behind: {left or 'none'}")
    summary = {"nodes": args.nodes, "seconds": duration, "rows": rows, "left": left,
               "load_before": load_before, "load_end": load_during,
               "samples": [{"t": t, "nodes": s} for t, s in samples]}
    (base / "summary.json").write_text(json.dumps(summary, indent=1))
    died = [r["node"] for r in rows if r["exit_code"] not in (0, None)]
    if died:
        print(f"nodes that did not exit cleanly: {died}")
    return 1 if left or died else 0


if __name__ == "__main__":
    sys.exit(main())
