"""A bench_sapo run's progress: what it has measured so far, kept so that a stopped run resumes.

``run_one`` (``sapo_runs``) folds each node's step record into a progress dict (``step_into``), and every
``checkpoint_every`` steps writes the nodes' checkpoints and then the progress file (``save_progress``).
``resume`` reads it back, drops node checkpoints newer than it (a stop between the two writes) and opens a
new segment (the commit, the command and the machine's load average of this process's part of the run);
``with_segment`` closes it with the transports' counters, the seconds spent and the load at its end.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
COSTS = ("step_seconds", "exchange_seconds", "wire_encode_seconds", "wire_verify_seconds", "ingest_seconds")


WIRE = ("wire_encode_seconds", "wire_verify_seconds")  # the transport's own counters, cumulative
PER_STEP = ("rewards", "signal", "peer_groups", "local_groups", "decisions", "alignment")


def fresh_progress(spec: Any) -> dict[str, Any]:
    n = spec.nodes
    return {"spec": json.loads(json.dumps(asdict(spec))), "step": 0, **{key: [[] for _ in range(n)] for key in PER_STEP},
            "accuracy": [0.0] * n, "evals": [], "costs": dict.fromkeys(COSTS, 0.0),
            "rejected": {}, "surplus": {}, "seconds": 0.0, "cpu_seconds": 0.0, "segments": [],
            "screen_pauses": [], "screen_paused_now": [], "screen_figures": []}


def step_into(progress: dict[str, Any], i: int, record: dict[str, Any]) -> None:
    """One node's step record into the run's per-step lists and costs."""
    progress["rewards"][i].append(float(record["reward_mean"]))
    progress["signal"][i].append(float(record["local_signal_fraction"]))
    progress["peer_groups"][i].append(int(record["n_peer_groups"]))
    progress["local_groups"][i].append(int(record["n_local_groups"]))
    progress["decisions"][i].append(record.get("peer_decision"))
    alignment = record.get("train/peer_alignment")
    progress["alignment"][i].append(None if alignment is None else float(alignment))
    costs = progress["costs"]
    costs["step_seconds"] += float(record["step_seconds"])
    costs["exchange_seconds"] += float(record.get("exchange_seconds", 0.0))
    costs["ingest_seconds"] += float(record.get("ingest_seconds", 0.0))  # this step's


def pauses_into(progress: dict[str, Any], nodes: list[Any]) -> None:
    """The peer-text screen's pauses among the run's nodes, every one of them honest: each time node ``i``'s
    screen pauses node ``j`` (``AuthorVerdicts.paused``), ``[step, i, j, j's figures as i judged them]`` is added
    to ``screen_pauses``; ``screen_paused_now`` holds the pairs paused at the last step; every step,
    ``[step, i, j, j's figures as i judged them]`` for each pair where ``i`` has judged some of ``j``'s text is
    added to ``screen_figures`` (how an honest author's failures grow, paused or not, and by which bound)."""
    ids = [node.exchange.identity.peer_id if node.exchange is not None else None for node in nodes]
    before = progress.setdefault("screen_paused_now", [])
    pauses = progress.setdefault("screen_pauses", [])
    figures = progress.setdefault("screen_figures", [])
    now = []
    for i, node in enumerate(nodes):
        if node.exchange is None:
            continue
        ingestor = node.exchange.ingestor
        for j, peer_id in enumerate(ids):
            if j == i or peer_id is None:
                continue
            summary = ingestor.book.verdicts.summary(peer_id)
            if summary["judged"]:
                figures.append([progress["step"], i, j, summary])
            if ingestor.paused(peer_id):
                now.append([i, j])
                if [i, j] not in before:
                    pauses.append([progress["step"], i, j, summary])
    progress["screen_paused_now"] = now


def _wire_counters(nodes: list[Any]) -> tuple[dict[str, float], dict[str, int], dict[str, int]]:
    """The transports' cumulative wire seconds, rejections and peer groups left unread by a budget or the
    step's need (``ingest_surplus``), since these nodes were built."""
    wire = dict.fromkeys(WIRE, 0.0)
    rejected: dict[str, int] = {}
    surplus: dict[str, int] = {}
    for node in nodes:
        if node.exchange is not None:
            m = node.exchange.metrics()
            for key in WIRE:
                wire[key] += float(m.get(key, 0.0))
            for reason, count in {**m["batches_rejected"], **m["ingest_rejected"]}.items():
                rejected[reason] = rejected.get(reason, 0) + int(count)
            for reason, count in m.get("ingest_surplus", {}).items():
                surplus[reason] = surplus.get(reason, 0) + int(count)
    return wire, rejected, surplus


def with_segment(progress: dict[str, Any], nodes: list[Any], t0: float, cpu0: float) -> dict[str, Any]:
    """``progress`` with this process's segment (since ``t0``/``cpu0``) added: wire counters, rejections,
    seconds and the machine's load."""
    out = json.loads(json.dumps(progress))
    wire, rejected, surplus = _wire_counters(nodes)
    for key, value in wire.items():
        out["costs"][key] += value
    for reason, count in rejected.items():
        out["rejected"][reason] = out["rejected"].get(reason, 0) + count
    out.setdefault("surplus", {})  # progress saved before the counts were kept
    for reason, count in surplus.items():
        out["surplus"][reason] = out["surplus"].get(reason, 0) + count
    out["seconds"] += time.perf_counter() - t0
    out["cpu_seconds"] += time.process_time() - cpu0
    out["segments"][-1]["load_end"] = list(os.getloadavg())
    out["segments"][-1]["to_step"] = out["step"]
    return out


def resume(spec: Any, work: Path) -> dict[str, Any]:
    """The saved progress of ``spec`` in ``work`` (a fresh one when there is none or it is another spec's);
    node checkpoints newer than the progress (a stop between the nodes' saves and the progress file's) go."""
    path = work / "progress.json"
    progress = fresh_progress(spec)
    if path.is_file():
        saved = json.loads(path.read_text())
        if saved.get("spec") == progress["spec"]:
            progress = saved
        else:
            shutil.rmtree(work)
    if progress["step"] == 0 and work.is_dir():
        shutil.rmtree(work)
    from node.run.checkpoint import CheckpointManager

    for i in range(spec.nodes):
        checkpoints = CheckpointManager(work / f"node{i}", keep=1)
        for step in checkpoints.steps():
            if step > progress["step"]:
                shutil.rmtree(checkpoints.path_of(step))
    progress["segments"].append({"from_step": progress["step"], "load_start": list(os.getloadavg()),
                                 "commit": _commit(), "argv": sys.argv})
    return progress


def _commit() -> str | None:
    """The repository's commit (with ``+dirty`` when tracked files differ from it), None outside git."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def save_progress(work: Path, progress: dict[str, Any]) -> None:
    tmp = work / ".progress.json.tmp"
    tmp.write_text(json.dumps(progress))
    os.replace(tmp, work / "progress.json")


