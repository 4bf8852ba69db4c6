"""The JSON documents the status API answers, built from a ``StatusBoard`` and the transport's thread-safe
views (``NetworkStatus``, ``PeerRow``s). Pure: no I/O, no locks, no torch; the server only serializes.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from node.api.board import StatusBoard
from swarm.peer_book import PeerRow
from swarm.state import NetworkStatus

SILO_REASON = "silo mode: no network"


def _number(record: Mapping[str, Any], key: str) -> float | None:
    value = record.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def health_doc(board: StatusBoard, stall_seconds: float) -> tuple[bool, dict[str, Any]]:
    """Liveness: the training loop made progress (a step, the end of set-up) within ``stall_seconds``.

    A node that finished or stopped is alive but no longer progressing: healthy, with its state said.
    """
    age = board.seconds_since_progress()
    done = board.state in ("finished", "stopped")
    ok = done or age <= stall_seconds
    return ok, {"ok": ok, "state": board.state, "seconds_since_progress": round(age, 3),
                "stall_seconds": stall_seconds}


def network_doc(network: NetworkStatus | None) -> dict[str, Any]:
    """``connected`` is ``NetworkStatus.connected``: at least one peer answered. ``hosts_gone_since`` (Unix time)
    while every initial peer (a member's: its swarm's hosts) is away, else None; ``hosts_back`` ``{at, away_s}``
    once one came back after that (the reason says both in words)."""
    if network is None:
        return {"connected": False, "reason": SILO_REASON, "neighbours": [], "restarts": 0, "last_error": ""}
    back = network.initial_back
    return {"connected": network.connected, "reason": network.reason, "neighbours": list(network.neighbours),
            "restarts": network.restarts, "last_error": network.last_error,
            "hosts_gone_since": network.initial_lost_at,
            "hosts_back": None if back is None else {"at": back[0], "away_s": round(back[1], 1)}}


def status_doc(board: StatusBoard, network: NetworkStatus | None, stall_seconds: float) -> dict[str, Any]:
    """``GET /api/status``: who the node is, where its training is, whether its network is up and why."""
    info, snap = board.info, board.snapshot
    record: Mapping[str, Any] = snap.record if snap is not None else {}
    healthy, _ = health_doc(board, stall_seconds)
    now = time.time()
    doc: dict[str, Any] = {
        "version": info.version if info else None,
        "mode": info.mode if info else None,
        "peer_id": info.peer_id if info else None,
        "swarm_id": info.swarm_id if info else None,
        "model": info.model if info else None,
        "adapter": info.adapter if info else None,
        "device": info.device if info else None,
        "run_dir": info.run_dir if info else None,
        "state": board.state,
        "healthy": healthy,
        "step": snap.step if snap else 0,
        "total_steps": info.total_steps if info else None,
        "last_reward": _number(record, "reward_mean"),
        "last_eval": None if snap is None or snap.last_eval is None else
        {"step": snap.last_eval[0], "accuracy": snap.last_eval[1]},
        "tokens_per_s": _number(record, "tokens_per_s"),
        "step_seconds": _number(record, "step_seconds"),
        "recent": {"steps": snap.recent_steps if snap else 0,
                   "step_seconds_median": snap.step_seconds_median if snap else None,
                   "tokens_per_s_median": snap.tokens_per_s_median if snap else None},
        "groups_trained": {"own": record.get("n_local_groups"), "peers": record.get("n_peer_groups")},
        "peer_decision": _peer_decision(record),
        "network": network_doc(network),
        "published": {"batches": snap.published_batches if snap else 0,
                      "groups": snap.published_groups if snap else 0,
                      "batches_stored": record.get("batches_published")},
        "uptime_s": round(now - info.started_at, 1) if info else 0.0,
        "last_step_at": snap.at if snap else None,
        "time": now,
    }
    return doc


def _peer_decision(record: Mapping[str, Any]) -> dict[str, Any] | None:
    """A deciding node's (``sapo.take_peers=decide``) last decision, its estimate of whether peers' groups pay
    and its decisions so far; None for a node that does not decide."""
    if "peer_decision" not in record:
        return None
    return {"last": record.get("peer_decision"), "alignment_mean": _number(record, "peer_alignment_mean"),
            "alignment_se": _number(record, "peer_alignment_se"), "alignments": record.get("peer_alignment_n"),
            "steps_taken": record.get("peer_steps_taken"), "steps_declined": record.get("peer_steps_declined"),
            "probes": record.get("peer_probes")}


def peers_doc(board: StatusBoard, rows: list[PeerRow], network: NetworkStatus | None) -> dict[str, Any]:
    """``GET /api/peers``: per peer what the network side accepted and rejected (by reason), bytes each way,
    when it was last seen and until when it is banned, and what this node made of its groups; plus the
    node's own published counts."""
    snap = board.snapshot
    ingest = snap.peer_ingest if snap is not None else {}
    neighbours = set(network.neighbours) if network is not None else set()
    peers = []
    for row in rows:
        mine = ingest.get(row.peer_id)
        peers.append({
            "peer_id": row.peer_id,
            "published": row.published,
            "connected": bool(neighbours.intersection(row.libp2p_ids)),
            "batches_accepted": row.batches_accepted,
            "groups_accepted": row.groups_accepted,
            "rejected": dict(row.rejected),
            "groups_ingested": mine.groups_accepted if mine else 0,
            "ingest_rejected": dict(mine.groups_rejected) if mine else {},
            "groups_trained": mine.groups_trained if mine else 0,
            "screen": dict(mine.screen) if mine else {},
            "screen_paused": mine.screen_paused if mine else False,
            "bytes_in": row.bytes_in,
            "bytes_out": row.bytes_out,
            "last_seen": round(row.last_seen, 3),
            "banned_until": None if row.banned_until is None else round(row.banned_until, 3),
        })
    info = board.info
    return {
        "own": {"peer_id": info.peer_id if info else None,
                "batches_published": snap.published_batches if snap else 0,
                "groups_published": snap.published_groups if snap else 0},
        "peers": peers,
        "time": time.time(),
    }
