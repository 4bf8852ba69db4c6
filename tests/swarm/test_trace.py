"""The optional event trace (``swarm.trace_path``): what two real peers on 127.0.0.1 write to it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from swarm.trace import TraceLog
from swarm.transport import SwarmTransport
from tests.swarm.batches import make_batch
from tests.swarm.conftest import wait_for


def events(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_publish_and_accept_are_traced_with_matching_ids(make_transport: Callable[..., SwarmTransport],
                                                           tmp_path: Path) -> None:
    a = make_transport(trace_path=str(tmp_path / "a.jsonl"))
    b = make_transport(initial_peers=a.visible_multiaddrs(), trace_path=str(tmp_path / "b.jsonl"))
    assert wait_for(lambda: any(e["ev"] == "up" for e in events(tmp_path / "b.jsonl")))
    bid = a.publish(make_batch(a.identity))
    assert bid is not None
    assert wait_for(lambda: any(e["ev"] == "acc" for e in events(tmp_path / "b.jsonl")))
    assert b.stats()["batches_accepted"] == 1
    pub = next(e for e in events(tmp_path / "a.jsonl") if e["ev"] == "pub")
    acc = next(e for e in events(tmp_path / "b.jsonl") if e["ev"] == "acc")
    assert pub["id"] == acc["id"] == bid[:16] and pub["ok"] is True
    assert acc["author"] == a.identity.peer_id[:16] and acc["src"] == "listed"
    assert acc["bytes"] == pub["bytes"] > 0
    # Accepted after it was created, by a pull that took part of that time.
    assert isinstance(acc["t"], float) and isinstance(acc["created"], float) and isinstance(acc["pull_s"], float)
    assert acc["created"] == pub["created"] and 0 <= acc["pull_s"] <= acc["t"] - acc["created"] < 15


def test_an_unwritable_trace_path_is_logged_and_ignored(tmp_path: Path) -> None:
    trace = TraceLog(str(tmp_path / "missing-dir" / "trace.jsonl"))
    assert not trace.enabled
    trace.event("pub", id="x")  # a no-op, not an error
    trace.close()
