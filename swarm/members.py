"""``MemberTable``: who takes part in a swarm, as one node's own view of the DHT shows it (pure).

A host (``swarm.host``) feeds it what its network side sees: every manifest it reads (an author announced
a batch), every batch it verified, either pulled over the network or handed to it by a member behind NAT.
Each batch is counted once per way it came, by its id: per author and epoch, the batches *announced*
(manifests read), *pulled* (fetched from the author or another holder and verified) and *handed off*
(handed to this node to hold, verified from that copy, so never counted as pulled too). So pulled plus
handed off is what this node verified, and never exceeds the batches it knows of.

It keeps, per author (swarm-node peer id): when it was first and last seen, its model and tokenizer
fingerprints (from its rollouts), the wire protocol of its records, whether it sits behind NAT, the
counts of its last ``keep_epochs`` epochs, and its totals since this table first saw it; and per epoch,
for the whole swarm, the totals and the number of members that announced (``history``, the last
``keep_history`` epochs, from the epoch the table was made in: ``since``). A member is *running* while it
announced a batch in the last ``RUNNING_EPOCHS`` epochs; one that stopped stays in the table, seen, not
running. ``to_json`` / ``load_json`` carry all of it across a restart (a host keeps it in a small file in its
run dir; ``changes`` says when there is something new to save). Bounded: at most ``max_members`` authors (the
longest unseen go first) and ``_MAX_IDS`` batch ids per author, epoch and way. Thread-safe: the network
thread writes, a status page reads.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from protocol.codec import SCHEMA_VERSION
from protocol.identity import peer_id_from_public_key
from protocol.records import Manifest, RolloutBatch

__all__ = ["RUNNING_EPOCHS", "WAYS", "Member", "MemberTable", "behind_nat"]

_CIRCUIT = "/p2p-circuit"
WAYS = ("announced", "pulled", "handed_off")
_ANNOUNCED, _PULLED, _HANDED = range(3)
_ID_CHARS = 16  # a batch id's prefix is enough to tell an author's batches apart
_MAX_IDS = 256  # per author, epoch and way: far above any quota, a bound on memory whatever peers send
RUNNING_EPOCHS = 3
"""A member is running while it announced a batch in this many epochs, the current one included (a slow member's
step may take longer than an epoch)."""


def behind_nat(addresses: tuple[str, ...] | list[str]) -> bool:
    """Whether an author whose batch lists ``addresses`` sits behind NAT: its batches are listed at a
    relayed address, or at other peers' addresses first (the holders it handed them to) and its own last."""
    if any(_CIRCUIT in a for a in addresses):
        return True
    peers = [a.rpartition("/p2p/")[2] for a in addresses if "/p2p/" in a]
    return len(set(peers)) > 1


@dataclass
class Member:
    """One author as seen here. Times are Unix seconds."""

    peer_id: str
    first_seen: float
    last_seen: float
    model: str = ""
    tokenizer: str = ""
    protocol: int | None = None
    """The wire protocol (schema version) of its records: known once a batch of it was decoded here."""
    natted: bool = False
    epochs: dict[int, tuple[set[str], set[str], set[str]]] = field(default_factory=dict)
    """epoch -> the ids of its batches (prefixes) announced, pulled, handed to this node."""
    totals: list[int] = field(default_factory=lambda: [0, 0, 0])
    """Batches announced, pulled, handed off since this table first saw it (restarts included)."""

    def note(self, epoch: int, way: int, batch_id: str) -> bool:
        """Count ``batch_id`` once for ``way``; whether it was new. A batch handed off is not pulled too."""
        sets = self.epochs.setdefault(epoch, (set(), set(), set()))
        bid = batch_id[:_ID_CHARS]
        if bid in sets[way] or len(sets[way]) >= _MAX_IDS or (way == _PULLED and bid in sets[_HANDED]):
            return False
        if way == _HANDED and bid in sets[_PULLED]:  # handed after it was pulled: counted as handed
            sets[_PULLED].discard(bid)
            self.totals[_PULLED] -= 1
        sets[way].add(bid)
        self.totals[way] += 1
        return True

    def counts(self, epoch: int) -> list[int]:
        sets = self.epochs.get(epoch)
        return [0, 0, 0] if sets is None else [len(s) for s in sets]

    def running(self, current_epoch: int) -> bool:
        """Whether it announced a batch in the last ``RUNNING_EPOCHS`` epochs."""
        return any(self.counts(current_epoch - i)[_ANNOUNCED] for i in range(RUNNING_EPOCHS))


class MemberTable:
    """Members by swarm-node peer id, and the swarm's history per epoch; see the module docstring."""

    def __init__(self, *, max_members: int = 1024, keep_epochs: int = 8, keep_history: int = 1440,
                 since: float | None = None) -> None:
        """``since``: when the table was made (Unix time; now when None): its history starts at that epoch."""
        self.max_members = max_members
        self.keep_epochs = keep_epochs
        self.keep_history = keep_history
        self.since = time.time() if since is None else since
        self.changes = 0
        """Incremented on every change: a caller saves the table when it differs from the count it last saved at."""
        self._members: dict[str, Member] = {}
        self._history: dict[int, list[int]] = {}  # epoch -> [announced, pulled, handed off, members announcing]
        self._lock = threading.Lock()

    def first_epoch(self, epoch_seconds: float) -> int:
        """The epoch the table was made in: its history and what it counts start there."""
        return math.floor(self.since / epoch_seconds)

    def _member(self, author: bytes, now: float) -> Member:
        peer_id = peer_id_from_public_key(author)
        member = self._members.get(peer_id)
        if member is None:
            if len(self._members) >= self.max_members:
                oldest = min(self._members.values(), key=lambda m: m.last_seen)
                del self._members[oldest.peer_id]
            member = self._members[peer_id] = Member(peer_id, now, now)
        member.last_seen = max(member.last_seen, now)
        return member

    def manifest_seen(self, manifest: Manifest, now: float) -> bool:
        """An author announced a batch (a manifest this node read from the DHT); whether it was new here."""
        with self._lock:
            member = self._member(manifest.author, now)
            member.natted = behind_nat(manifest.address)
            new = member.note(manifest.epoch, _ANNOUNCED, manifest.batch_id)
            self.changes += new
            return new

    def batch_seen(self, batch_id: str, batch: RolloutBatch, now: float, *, handed_off: bool = False) -> None:
        """A batch of an author verified here: pulled, or (``handed_off``) handed to this node to hold."""
        with self._lock:
            member = self._member(batch.author, now)
            member.protocol = SCHEMA_VERSION  # a record of another version never decodes
            self.changes += member.note(batch.epoch, _HANDED if handed_off else _PULLED, batch_id)
            if handed_off:
                member.natted = True
            for group in batch.groups[:1]:
                for rollout in group.rollouts[:1]:
                    member.model, member.tokenizer = rollout.model_fingerprint, rollout.tokenizer_fingerprint

    def prune(self, current_epoch: int) -> None:
        """Fold the per-member counts of epochs older than ``keep_epochs`` into the history; forget them."""
        oldest = current_epoch - self.keep_epochs + 1
        with self._lock:
            for member in self._members.values():
                for epoch in [e for e in member.epochs if e < oldest]:
                    self._fold(epoch, member.counts(epoch))
                    del member.epochs[epoch]
            for epoch in sorted(self._history)[: max(0, len(self._history) - self.keep_history)]:
                del self._history[epoch]
            self.changes += 1

    def _fold(self, epoch: int, counts: list[int]) -> None:
        row = self._history.setdefault(epoch, [0, 0, 0, 0])
        for i in range(3):
            row[i] += counts[i]
        row[3] += 1 if counts[_ANNOUNCED] else 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._members)

    def rows(self, current_epoch: int, epochs: int = 4, epoch_seconds: float = 60.0) -> list[dict[str, Any]]:
        """One dict a member, the most recently seen first: its counts over the last ``epochs`` epochs, since the
        table's first (``epochs``: ``[{epoch, start, announced, pulled, handed_off}, ...]``, newest first; ``start``
        in Unix seconds), their sums, its ``totals`` since first seen, and whether it is ``running``."""
        first = min(current_epoch, math.floor(self.since / epoch_seconds))
        window = [current_epoch - i for i in range(epochs) if current_epoch - i >= first]
        with self._lock:
            members = sorted(self._members.values(), key=lambda m: m.last_seen, reverse=True)
            rows = []
            for m in members:
                per_epoch = [dict(zip(("epoch", "start", *WAYS), [e, e * epoch_seconds, *m.counts(e)])) for e in window]
                rows.append({
                    "peer_id": m.peer_id, "model": m.model, "tokenizer": m.tokenizer, "protocol": m.protocol,
                    "natted": m.natted, "running": m.running(current_epoch), "first_seen": m.first_seen,
                    "last_seen": m.last_seen, "epochs": per_epoch,
                    **{way: sum(e[way] for e in per_epoch) for way in WAYS},
                    "totals": dict(zip(WAYS, m.totals)),
                })
            return rows

    def history(self, current_epoch: int, epochs: int, epoch_seconds: float = 60.0) -> list[dict[str, Any]]:
        """The swarm per epoch over the last ``epochs`` epochs, oldest first, from the table's first epoch at the
        earliest (``since``): ``{epoch, start, announced, pulled, handed_off, members}`` (``members``: how many
        announced a batch)."""
        first = max(current_epoch - epochs + 1, min(current_epoch, self.first_epoch(epoch_seconds)))
        with self._lock:
            live: dict[int, list[int]] = {}
            for m in self._members.values():
                for epoch in m.epochs:
                    counts = m.counts(epoch)
                    row = live.setdefault(epoch, [0, 0, 0, 0])
                    for i in range(3):
                        row[i] += counts[i]
                    row[3] += 1 if counts[_ANNOUNCED] else 0
            rows = []
            for epoch in range(first, current_epoch + 1):
                row = [a + b for a, b in zip(self._history.get(epoch, [0, 0, 0, 0]), live.get(epoch, [0, 0, 0, 0]))]
                rows.append(dict(zip(("epoch", "start", *WAYS, "members"), [epoch, epoch * epoch_seconds, *row])))
            return rows

    # -- across a restart ---------------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """Everything, as plain data (``from_json`` reads it back)."""
        with self._lock:
            return {
                "version": 1,
                "since": self.since,
                "members": [{"peer_id": m.peer_id, "first_seen": m.first_seen, "last_seen": m.last_seen,
                             "model": m.model, "tokenizer": m.tokenizer, "protocol": m.protocol, "natted": m.natted,
                             "totals": list(m.totals),
                             "epochs": {str(e): [sorted(s) for s in sets] for e, sets in m.epochs.items()}}
                            for m in self._members.values()],
                "history": {str(e): row for e, row in self._history.items()},
            }

    def load_json(self, doc: dict[str, Any]) -> None:
        """Take what ``to_json`` saved (entries that do not parse are skipped: the file is ours, but may be
        cut short or from another release)."""
        if not isinstance(doc, dict) or doc.get("version") != 1:
            return
        members: dict[str, Member] = {}
        for raw in doc.get("members", [])[: self.max_members]:
            try:
                m = Member(str(raw["peer_id"]), float(raw["first_seen"]), float(raw["last_seen"]), str(raw["model"]),
                           str(raw["tokenizer"]), None if raw["protocol"] is None else int(raw["protocol"]),
                           bool(raw["natted"]), totals=[int(x) for x in raw["totals"]])
                if len(m.totals) != 3:
                    continue
                for epoch, sets in raw["epochs"].items():
                    a, p, h = ({str(i)[:_ID_CHARS] for i in s[:_MAX_IDS]} for s in sets)
                    m.epochs[int(epoch)] = (a, p, h)
            except (KeyError, TypeError, ValueError):
                continue
            members[m.peer_id] = m
        history: dict[int, list[int]] = {}
        for epoch, row in dict(doc.get("history", {})).items():
            if not str(epoch).lstrip("-").isdigit():
                continue
            try:
                counts = [int(x) for x in row]
            except (TypeError, ValueError):
                continue
            if len(counts) == 4:
                history[int(epoch)] = counts
        since = doc.get("since")
        with self._lock:
            self._members, self._history = members, history
            if isinstance(since, (int, float)) and math.isfinite(since):
                self.since = min(self.since, float(since))
            elif members:  # a file of an earlier release: since its first member
                self.since = min(self.since, *(m.first_seen for m in members.values()))
            self.changes += 1
