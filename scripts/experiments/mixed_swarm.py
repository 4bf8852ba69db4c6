"""A swarm of three tokenizers on one machine: a tiny-base, a small-base and a smollm2-135m node as three
``swarm-node start`` processes on 127.0.0.1, each training on the other two's groups (re-tokenized,
re-scored and anchored by the receiver), then a table of who accepted and trained on whose groups.

    python scripts/experiments/mixed_swarm.py [--seconds 900] [--until-trained] [--out runs/mixed-swarm]
                                  [--backend hf|vllm] [key=value ...]      # overrides for every node

The three share the task source and swarm of ``configs/tiny-swarm.yaml`` (2-digit addition, swarm
``tiny-swarm``): tiny-base and small-base read the raw prompt (``07+35=``), smollm2 the same task in its chat
template (``configs/smollm2-arith-swarm.yaml``). Node 0 (tiny-base) bootstraps the others. Each node serves
its status API on a free port; the script polls ``/api/peers`` for the groups each node ingested and trained
on from each other node, prints progress, and after ``--seconds`` (or, with ``--until-trained``, once every
node trained on groups of both others) stops them with SIGTERM (each finishes its step, checkpoints and
exits 0). Logs, metrics and ``summary.json`` go to ``--out``.
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
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
NODES = (("tiny-base", "configs/tiny-swarm.yaml"), ("small-base", "configs/small-swarm.yaml"),
         ("smollm2", "configs/smollm2-arith-swarm.yaml"))
# Small steps, so the slowest node (smollm2, 134.5M parameters) publishes every few tens of seconds on 2 cores.
COMMON = ["sapo.local_groups=4", "sapo.generated_groups=4", "sapo.external_groups=4", "tasks.eval_size=16",
          "train.eval_every=20", "train.checkpoint_every=20", "swarm.epoch_seconds=30"]


@dataclass
class Proc:
    name: str
    run_dir: Path
    process: subprocess.Popen[bytes]
    log: Path
    peer_id: str = ""
    url: str = ""
    peers: dict[str, Any] = field(default_factory=dict)


def _launch(name: str, config: str, run_dir: Path, seed: int, extra: list[str], peers: str | None) -> Proc:
    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_dir.parent / f"{name}.log"
    command = [sys.executable, "-m", "node.cli", "start", "-c", config, "--run-dir", str(run_dir), "--no-progress",
               f"seed={seed}", "api.port=0", *COMMON, *extra]
    if peers:
        command += ["--initial-peers", peers]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    with open(log, "wb") as out:  # the child keeps its own descriptor
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    return Proc(name, run_dir, process, log)


def _wait_for(proc: Proc, pattern: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(pattern, proc.log.read_text(errors="replace")) if proc.log.exists() else None
        if found:
            return found.group(1)
        if proc.process.poll() is not None:
            raise RuntimeError(f"{proc.name} exited ({proc.process.returncode}); see {proc.log}")
        time.sleep(0.5)
    raise RuntimeError(f"{proc.name}: no {pattern!r} in its output within {timeout:.0f} s; see {proc.log}")


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def _poll(procs: list[Proc]) -> None:
    for p in procs:
        if not p.url:
            api_url = p.run_dir / "api_url"
            if not api_url.is_file():
                continue
            p.url = api_url.read_text().strip()
        try:
            doc = _get(p.url + "api/peers")
        except OSError:
            continue
        p.peer_id = doc["own"]["peer_id"] or p.peer_id
        p.peers = {row["peer_id"]: row for row in doc["peers"]}


def pair_table(procs: list[Proc]) -> list[dict[str, Any]]:
    """One row per (receiver, author): groups the receiver ingested (accepted after its own re-scoring),
    trained on, and rejected by reason."""
    rows = []
    for receiver in procs:
        for author in procs:
            if author is receiver:
                continue
            row = receiver.peers.get(author.peer_id, {})
            rows.append({"receiver": receiver.name, "author": author.name,
                         "batches_accepted": row.get("batches_accepted", 0),
                         "groups_ingested": row.get("groups_ingested", 0),
                         "groups_trained": row.get("groups_trained", 0),
                         "ingest_rejected": row.get("ingest_rejected", {})})
    return rows


def _node_summary(p: Proc) -> dict[str, Any]:
    rows = [json.loads(line) for line in (p.run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()] \
        if (p.run_dir / "metrics.jsonl").exists() else []
    last = rows[-1] if rows else {}
    return {"node": p.name, "steps": last.get("step", 0), "exit_code": p.process.returncode,
            "retokenized": last.get("ingest_retokenized", 0), "peak_rss_mb": max((r.get("peak_rss_mb", 0) for r in rows),
                                                                                 default=0),
            "median_step_seconds": sorted(r["step_seconds"] for r in rows)[len(rows) // 2] if rows else None,
            "peer_groups_trained": sum(r.get("n_peer_groups", 0) for r in rows)}


def stop(procs: list[Proc], timeout: float = 180.0) -> None:
    for p in procs:
        if p.process.poll() is None:
            p.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.process.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.process.pid, signal.SIGKILL)
            p.process.wait()


def run(out: Path, seconds: float, until_trained: bool, extra: list[str], echo: Any = print) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    procs: list[Proc] = []
    started = time.monotonic()
    try:
        name, config = NODES[0]
        procs.append(_launch(name, config, out / name, 0, extra, None))
        address = _wait_for(procs[0], r"--initial-peers (\S+)", 300)
        echo(f"{name} is up at {address}")
        for seed, (name, config) in enumerate(NODES[1:], start=1):
            procs.append(_launch(name, config, out / name, seed, extra, address))
        while time.monotonic() - started < seconds:
            time.sleep(10)
            if any(p.process.poll() is not None for p in procs):
                raise RuntimeError("a node exited early: " + ", ".join(f"{p.name} ({p.process.returncode}, {p.log})"
                                                                       for p in procs if p.process.poll() is not None))
            _poll(procs)
            table = pair_table(procs)
            echo(f"[{time.monotonic() - started:5.0f} s, load {os.getloadavg()[0]:.1f}] trained (receiver<-author): "
                 + ", ".join(f"{r['receiver']}<-{r['author']} {r['groups_trained']}/{r['groups_ingested']}"
                             for r in table))
            if until_trained and all(r["groups_trained"] > 0 for r in table):
                break
        _poll(procs)
    finally:
        stop(procs)
    summary = {"seconds": round(time.monotonic() - started), "load_average": os.getloadavg(), "extra": extra,
               "pairs": pair_table(procs), "nodes": [_node_summary(p) for p in procs]}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def print_summary(summary: dict[str, Any]) -> None:
    print(f"\n{summary['seconds']} s; load average at the end {summary['load_average'][0]:.1f}")
    print(f"{'receiver':<12}{'author':<12}{'batches':>9}{'ingested':>10}{'trained':>9}  rejected")
    for r in summary["pairs"]:
        print(f"{r['receiver']:<12}{r['author']:<12}{r['batches_accepted']:>9}{r['groups_ingested']:>10}"
              f"{r['groups_trained']:>9}  {r['ingest_rejected'] or '-'}")
    for n in summary["nodes"]:
        print(f"{n['node']}: {n['steps']} steps (median {n['median_step_seconds']} s), {n['retokenized']} completions "
              f"re-tokenized, peak RSS {n['peak_rss_mb']} MB, exit code {n['exit_code']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=900)
    parser.add_argument("--until-trained", action="store_true", help="stop once every node trained on both others")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "mixed-swarm")
    parser.add_argument("--backend", choices=["hf", "vllm"], default="hf")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_args()
    summary = run(args.out, args.seconds, args.until_trained, [f"generation.backend={args.backend}", *args.overrides])
    print_summary(summary)
    ok = all(n["exit_code"] == 0 for n in summary["nodes"]) and all(r["groups_trained"] > 0 for r in summary["pairs"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
