"""What a lab swarm did, read from its members' own records (``swarm.trace_path``, ``metrics.jsonl``) and a
host's ``/api/swarm``: delivery of the batches published after a moment, how long a (re)start took to
join, and whether every count a host shows equals the one computed from the members' records.

Pure functions over ``lab_swarm.Member`` objects (anything with ``trace()``; peer ids given beside), so that
``tests/swarm/test_netns_host.py`` and ``scripts/lab/host_outage.py`` measure the same way.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

__all__ = ["Delivery", "delivery", "fetch_json", "host_count_mismatches", "join_seconds", "published"]


def fetch_json(lab_host: Any, url: str, timeout: float = 15.0) -> Any:
    """GET ``url`` from inside a lab namespace (the test's own namespace cannot route to the lab)."""
    code = f"import urllib.request,sys; sys.stdout.write(urllib.request.urlopen({url!r}, timeout={timeout}).read().decode())"
    done = subprocess.run(lab_host.command(sys.executable, "-c", code), capture_output=True, text=True,
                          timeout=timeout + 30)
    if done.returncode != 0:
        raise RuntimeError(f"GET {url} failed: {done.stderr.strip()[-500:]}")
    return json.loads(done.stdout)


def published(member: Any, *, after: float = 0.0, until: float = math.inf) -> dict[str, float]:
    """The batches ``member`` published (tried to: a ``pub`` event, stored or not), created in
    ``(after, until]``: id prefix -> creation time (Unix seconds)."""
    return {e["id"]: float(e["created"]) for e in member.trace()
            if e.get("ev") == "pub" and after < float(e.get("created", 0)) <= until}


@dataclass
class Delivery:
    """Of the (batch, receiver) pairs, how many the receiver accepted within the window of the batch's creation."""

    pairs: int
    within: int
    late: int
    missing: list[tuple[str, str, str]]
    """(author, receiver, batch id) of the pairs not accepted in time (at most 20)."""

    @property
    def share(self) -> float:
        return self.within / self.pairs if self.pairs else 0.0


def delivery(members: list[Any], ids: dict[Any, str], *, after: float, until: float, window: float) -> Delivery:
    """Every batch a member published (created after ``after`` and at most ``until``), against every other
    member: accepted within ``window`` seconds of its creation (the receiver's ``acc`` event), later, or not."""
    accepted = {m: {e["id"]: float(e["t"]) for e in m.trace() if e.get("ev") == "acc"} for m in members}
    pairs = within = late = 0
    missing: list[tuple[str, str, str]] = []
    for author in members:
        for bid, created in published(author, after=after, until=until).items():
            for receiver in members:
                if receiver is author:
                    continue
                pairs += 1
                got = accepted[receiver].get(bid)
                if got is not None and got - created <= window:
                    within += 1
                elif got is not None:
                    late += 1
                elif len(missing) < 20:
                    missing.append((ids[author][:8], ids[receiver][:8], bid))
    return Delivery(pairs, within, late, missing)


def join_seconds(member: Any, *, after: float = 0.0) -> float | None:
    """Seconds from the member's network side starting (its first ``start`` event after ``after``) to its
    first DHT neighbour (``up``); None if it did not join."""
    events = [e for e in member.trace() if float(e.get("t", 0)) > after]
    start = next((float(e["t"]) for e in events if e.get("ev") == "start"), None)
    if start is None:
        return None
    up = next((float(e["t"]) for e in events if e.get("ev") == "up" and float(e["t"]) >= start), None)
    return None if up is None else up - start


def host_count_mismatches(doc: dict[str, Any], members: list[Any], ids: dict[Any, str], *, host_p2p: str,
                          epochs: list[int], epoch_seconds: float) -> list[str]:
    """Every count of the host's ``/api/swarm`` document (per member, per epoch in ``epochs``) that differs from
    the one computed from the member's own trace: announced = batches it stored a manifest of; handed off =
    those it handed to this host (``handoff`` events whose ``to``, a prefix of a libp2p id, is one of the
    host's; an event without one names nobody); pulled = the rest (the host verifies every batch it knows of
    once). An epoch in which no member published a batch is reported too: a page of zeros would match it,
    proving nothing. Empty when every count agrees and every epoch had batches."""
    rows = {m["peer_id"]: m for m in doc["members"]}
    wrong = []
    published_in = dict.fromkeys(epochs, 0)
    for member in members:
        peer = ids[member]
        row = rows.get(peer)
        if row is None:
            wrong.append(f"{peer[:8]}: not on the host's page")
            continue
        trace = member.trace()
        epoch_of = {e["id"]: math.floor(float(e["created"]) / epoch_seconds) for e in trace
                    if e.get("ev") == "pub" and e.get("ok")}
        handed = {e["id"] for e in trace if e.get("ev") == "handoff" and _names(str(e.get("to") or ""), host_p2p)}
        per_epoch = {e["epoch"]: e for e in row["epochs"]}
        for epoch in epochs:
            mine = [b for b, e in epoch_of.items() if e == epoch]
            published_in[epoch] += len(mine)
            want = {"announced": len(mine), "handed_off": sum(1 for b in mine if b in handed)}
            want["pulled"] = want["announced"] - want["handed_off"]
            shown = per_epoch.get(epoch)
            got = {k: (shown or {}).get(k) for k in want}
            if got != want:
                wrong.append(f"{peer[:8]} epoch {epoch}: the host shows {got}, its own records say {want}")
    wrong += [f"epoch {epoch}: no member published a batch (nothing to compare)" for epoch, n in published_in.items()
              if n == 0]
    return wrong


def _names(prefix: str, peer: str) -> bool:
    """Whether a trace's peer id ``prefix`` (the first 16 characters) names ``peer``; an empty one names nobody."""
    return len(prefix) >= 8 and peer.startswith(prefix)
