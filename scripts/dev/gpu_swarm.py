"""A heterogeneous swarm on one device: two smollm2-135m nodes in bfloat16 and one small-base node (two
tokenizers: a 49,152-token and a 2,048-token BPE), each its own ``swarm-node start`` process on 127.0.0.1,
all on one GPU, each held to ``--memory-mb`` of it (``model.memory_mb``), until every node has taken
``--steps`` steps and accepted groups of both others (or ``--seconds`` pass); then each node's steps, the
peer groups it accepted from each author, the device memory it took, and the swarm's aggregate tokens/s.

    python scripts/dev/gpu_swarm.py [--device cuda|cpu] [--steps 30] [--memory-mb 8000] [--seconds 300]
                                    [--out DIR] [--json FILE] [key=value ...]     # overrides for every node

The nodes share the 2-digit addition tasks and the swarm of ``configs/tiny-swarm.yaml``: smollm2 reads them
through its chat template (``configs/smollm2-arith-swarm.yaml``), small-base raw (``configs/small-swarm.yaml``).
``--device cpu`` runs the same swarm at CPU sizes, two tiny-base nodes and one small-base node (a character
and a BPE tokenizer), so the script can be tried anywhere (``tests/test_gpu_check.py``).

Figures: a node's steps and tokens (generated and trained, from its ``metrics.jsonl``); the groups it
accepted from each other node (its status API's ``/api/peers``: groups ingested after its own checks and
re-scoring, and rejections by reason); its device memory, the CUDA allocator's high-water mark
(``device_peak_mb``) and, where ``nvidia-smi`` answers, the most the process held of the card (its CUDA
context included); the aggregate tokens/s, the tokens all nodes processed while all three ran, over that
window's length. Exit 0 when every node took its steps and accepted groups of both others, and exited 0.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SMOLLM2 = "configs/smollm2-arith-swarm.yaml"
SWARMS = {
    "cuda": [("smollm2-a", SMOLLM2, ["model.dtype=bfloat16"]), ("smollm2-b", SMOLLM2, ["model.dtype=bfloat16"]),
             ("small", "configs/small-swarm.yaml", [])],
    "cpu": [("tiny-a", "configs/tiny-swarm.yaml", []), ("tiny-b", "configs/tiny-swarm.yaml", []),
            ("small", "configs/small-swarm.yaml", [])],
}
COMMON = ["sapo.local_groups=8", "sapo.generated_groups=8", "sapo.external_groups=8", "sapo.max_per_peer=4",
          "swarm.epoch_seconds=5", "train.eval_every=0", "train.checkpoint_every=100000", "tasks.eval_size=8",
          "api.port=0"]


@dataclass
class Proc:
    name: str
    run_dir: Path
    process: subprocess.Popen[bytes]
    log: Path
    url: str = ""
    peer_id: str = ""
    peers: dict[str, Any] = field(default_factory=dict)
    device_mb: int = 0  # the most nvidia-smi saw the process hold


def _launch(name: str, config: str, run_dir: Path, seed: int, overrides: list[str], peers: str | None) -> Proc:
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    log = run_dir.parent / f"{name}.log"
    command = [sys.executable, "-m", "node.cli", "start", "-c", config, "--run-dir", str(run_dir), "--no-progress",
               f"seed={seed}", *overrides]
    if peers:
        command += ["--initial-peers", peers]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "TOKENIZERS_PARALLELISM": "false"}
    with open(log, "wb") as out:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    return Proc(name, run_dir, process, log)


def _wait_for_address(proc: Proc, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(r"--initial-peers (\S+)", proc.log.read_text(errors="replace")) if proc.log.exists() else None
        if found:
            return found.group(1)
        if proc.process.poll() is not None:
            raise RuntimeError(f"{proc.name} exited ({proc.process.returncode}); see {proc.log}")
        time.sleep(0.5)
    raise RuntimeError(f"{proc.name} printed no address within {timeout:.0f} s; see {proc.log}")


def metrics_rows(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip().startswith("{")]


def _poll(procs: list[Proc]) -> None:
    for p in procs:
        if not p.url and (p.run_dir / "api_url").is_file():
            p.url = (p.run_dir / "api_url").read_text().strip()
        if not p.url:
            continue
        try:
            with urllib.request.urlopen(p.url + "api/peers", timeout=10) as resp:
                doc = json.loads(resp.read())
        except (OSError, ValueError):
            continue
        p.peer_id = doc["own"]["peer_id"] or p.peer_id
        p.peers = {row["peer_id"]: row for row in doc["peers"]}
    for pid, mb in _gpu_memory_by_pid().items():
        for p in procs:
            if p.process.pid == pid:
                p.device_mb = max(p.device_mb, mb)


def _gpu_memory_by_pid() -> dict[int, int]:
    if shutil.which("nvidia-smi") is None:
        return {}
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    found = {}
    for line in out.splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            found[int(parts[0])] = int(parts[1])
    return found


def accepted(procs: list[Proc]) -> list[dict[str, Any]]:
    """One row a (receiver, author): the groups the receiver accepted and trained on, its rejections."""
    rows = []
    for receiver in procs:
        for author in procs:
            if author is not receiver:
                row = receiver.peers.get(author.peer_id, {}) if author.peer_id else {}
                rows.append({"receiver": receiver.name, "author": author.name,
                             "groups_accepted": row.get("groups_ingested", 0),
                             "groups_trained": row.get("groups_trained", 0),
                             "rejected": row.get("ingest_rejected", {})})
    return rows


def throughput(rows_by_node: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Tokens/s of each node and of the swarm over the window in which every node was taking steps (from its
    first step's end to the first of the nodes' last steps); a step's tokens are its ``tokens_per_s`` times its
    ``step_seconds``, counted where the step ended inside the window."""
    if not rows_by_node or not all(rows_by_node.values()):
        return {"window_s": 0.0, "tokens_per_s": 0.0, "gen_tokens_per_s": 0.0, "nodes": {}}
    start = max(rows[0]["time"] for rows in rows_by_node.values())
    end = min(rows[-1]["time"] for rows in rows_by_node.values())
    window = max(end - start, 0.0)
    nodes = {}
    for name, rows in rows_by_node.items():
        inside = [r for r in rows if start < r["time"] <= end]
        tokens = sum(r["tokens_per_s"] * r["step_seconds"] for r in inside)
        generated = sum(r["gen_tokens_per_s"] * r["gen_seconds"] for r in inside)
        nodes[name] = {"tokens_per_s": tokens / window if window else 0.0,
                       "gen_tokens_per_s": generated / window if window else 0.0}
    return {"window_s": window, "tokens_per_s": sum(n["tokens_per_s"] for n in nodes.values()),
            "gen_tokens_per_s": sum(n["gen_tokens_per_s"] for n in nodes.values()), "nodes": nodes}


def stop(procs: list[Proc], timeout: float = 120.0) -> None:
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


def run(device: str, steps: int, memory_mb: int | None, seconds: float, out: Path, overrides: list[str],
        echo: Any = print) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    common = [*COMMON, f"model.device={device}", *([f"model.memory_mb={memory_mb}"] if memory_mb else [])]
    procs: list[Proc] = []
    started = time.monotonic()
    try:
        for i, (name, config, own) in enumerate(SWARMS[device]):
            address = _wait_for_address(procs[0], 300) if procs else None
            if i == 1:
                echo(f"{procs[0].name} is up at {address}")
            procs.append(_launch(name, config, out / name, i + 1, [*common, *own, *overrides], address))
        while time.monotonic() - started < seconds:
            time.sleep(2)
            if any(p.process.poll() is not None for p in procs):
                raise RuntimeError("a node exited early: " + ", ".join(
                    f"{p.name} ({p.process.returncode}, {p.log})" for p in procs if p.process.poll() is not None))
            _poll(procs)
            done = {p.name: len(metrics_rows(p.run_dir)) for p in procs}
            pairs = accepted(procs)
            echo(f"[{time.monotonic() - started:5.0f} s] steps {done}; accepted (receiver<-author) "
                 + ", ".join(f"{r['receiver']}<-{r['author']} {r['groups_accepted']}" for r in pairs))
            if all(n >= steps for n in done.values()) and all(r["groups_accepted"] > 0 for r in pairs):
                break
        _poll(procs)
    finally:
        stop(procs)
    rows = {p.name: metrics_rows(p.run_dir) for p in procs}
    summary = {
        "device": device, "steps_asked": steps, "memory_mb": memory_mb, "seconds": round(time.monotonic() - started),
        "load_average": os.getloadavg()[0], "overrides": overrides, "pairs": accepted(procs),
        "throughput": throughput(rows),
        "nodes": [{"node": p.name, "steps": len(rows[p.name]), "exit_code": p.process.returncode,
                   "median_step_seconds": sorted(r["step_seconds"] for r in rows[p.name])[len(rows[p.name]) // 2]
                   if rows[p.name] else None,
                   "groups_accepted": sum(r["groups_accepted"] for r in accepted(procs) if r["receiver"] == p.name),
                   "peer_groups_trained": sum(r.get("n_peer_groups", 0) for r in rows[p.name]),
                   "device_peak_mb": max((r.get("device_peak_mb", 0) for r in rows[p.name]), default=0),
                   "device_mb_nvidia_smi": p.device_mb,
                   "peak_rss_mb": max((r.get("peak_rss_mb", 0) for r in rows[p.name]), default=0)}
                  for p in procs],
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def passed(summary: dict[str, Any]) -> bool:
    return (all(n["exit_code"] == 0 and n["steps"] >= summary["steps_asked"] for n in summary["nodes"])
            and all(r["groups_accepted"] > 0 for r in summary["pairs"]))


def print_summary(summary: dict[str, Any]) -> None:
    t = summary["throughput"]
    print(f"\ngpu_swarm on {summary['device']}: {summary['seconds']} s, load {summary['load_average']:.1f}; "
          f"all three ran together for {t['window_s']:.1f} s: {t['tokens_per_s']:.0f} tokens/s in all "
          f"({t['gen_tokens_per_s']:.0f} generated)")
    print(f"{'node':<10}{'steps':>6}{'median s':>9}{'accepted':>9}{'trained':>8}{'device MB':>10}{'smi MB':>8}"
          f"{'tok/s':>8}  exit")
    for n in summary["nodes"]:
        rate = t["nodes"].get(n["node"], {}).get("tokens_per_s", 0.0)
        median = f"{n['median_step_seconds']:.2f}" if n["median_step_seconds"] is not None else "-"
        print(f"{n['node']:<10}{n['steps']:>6}{median:>9}{n['groups_accepted']:>9}{n['peer_groups_trained']:>8}"
              f"{n['device_peak_mb']:>10}{n['device_mb_nvidia_smi']:>8}{rate:>8.0f}  {n['exit_code']}")
    for r in summary["pairs"]:
        print(f"  {r['receiver']} accepted {r['groups_accepted']} groups of {r['author']} (trained on "
              f"{r['groups_trained']}); rejected {r['rejected'] or 'none'}")
    print("gpu_swarm: " + ("pass" if passed(summary) else "FAIL"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=sorted(SWARMS), default="cuda")
    parser.add_argument("--steps", type=int, default=30, help="steps every node takes at least")
    parser.add_argument("--memory-mb", type=int, default=None, help="model.memory_mb of each node (cuda)")
    parser.add_argument("--seconds", type=float, default=300, help="stop by then whatever the steps")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "gpu_swarm")
    parser.add_argument("--json", type=Path, default=None, help="write the summary here too")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_args()
    summary = run(args.device, args.steps, args.memory_mb if args.device == "cuda" else None, args.seconds,
                  args.out, args.overrides)
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=1) + "\n")
    print_summary(summary)
    return 0 if passed(summary) else 1


if __name__ == "__main__":
    sys.exit(main())
