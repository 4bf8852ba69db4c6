"""``MemberTable``: who takes part in a swarm, as one node's own view of the DHT shows it (pure).

A host (``swarm.host``) feeds it what its network side sees: every manifest it reads (an author
announced a batch), every batch it verified (pulled from an author, or handed to it by one behind NAT).
From those it keeps, per author (swarm-node peer id): when it was first and last seen, its model and
tokenizer fingerprints (from its rollouts), the wire protocol of its records, whether it sits behind NAT
(its batches are listed at other peers' addresses first, or at a relayed one), and per epoch how many
batches it announced, how many this node pulled and how many it handed to this node. Bounded: at most
``max_members`` authors (the longest unseen go first), epochs older than ``keep_epochs`` forgotten.
Thread-safe: the network thread writes, a status page reads ``rows()``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from protocol.codec import SCHEMA_VERSION
from protocol.identity import peer_id_from_public_key
from protocol.records import Manifest, RolloutBatch

__all__ = ["Member", "MemberTable", "behind_nat"]

_CIRCUIT = "/p2p-circuit"


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
    epochs: dict[int, list[int]] = field(default_factory=dict)
    """epoch -> [batches announced, pulled here, handed to this node]."""

    def count(self, epoch: int, which: int) -> None:
        self.epochs.setdefault(epoch, [0, 0, 0])[which] += 1


_ANNOUNCED, _PULLED, _HANDED = 0, 1, 2


class MemberTable:
    """Members by swarm-node peer id; see the module docstring."""

    def __init__(self, *, max_members: int = 1024, keep_epochs: int = 8) -> None:
        self.max_members = max_members
        self.keep_epochs = keep_epochs
        self._members: dict[str, Member] = {}
        self._lock = threading.Lock()

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

    def manifest_seen(self, manifest: Manifest, now: float) -> None:
        """An author announced a batch (a manifest this node read from the DHT for the first time)."""
        with self._lock:
            member = self._member(manifest.author, now)
            member.natted = behind_nat(manifest.address)
            member.count(manifest.epoch, _ANNOUNCED)

    def batch_seen(self, batch: RolloutBatch, now: float, *, handed_off: bool = False) -> None:
        """A batch of an author verified here: pulled, or (``handed_off``) handed to this node to hold."""
        with self._lock:
            member = self._member(batch.author, now)
            member.protocol = SCHEMA_VERSION  # a record of another version never decodes
            member.count(batch.epoch, _HANDED if handed_off else _PULLED)
            if handed_off:
                member.natted = True
            for group in batch.groups[:1]:
                for rollout in group.rollouts[:1]:
                    member.model, member.tokenizer = rollout.model_fingerprint, rollout.tokenizer_fingerprint

    def prune(self, current_epoch: int) -> None:
        """Forget per-epoch counts older than ``keep_epochs``."""
        oldest = current_epoch - self.keep_epochs + 1
        with self._lock:
            for member in self._members.values():
                member.epochs = {e: c for e, c in member.epochs.items() if e >= oldest}

    def __len__(self) -> int:
        with self._lock:
            return len(self._members)

    def rows(self, current_epoch: int, epochs: int = 4) -> list[dict[str, Any]]:
        """One dict a member, the most recently seen first, with its counts over the last ``epochs`` epochs
        (``epochs``: ``[{epoch, announced, pulled, handed_off}, ...]``, newest first)."""
        window = [current_epoch - i for i in range(epochs)]
        with self._lock:
            members = sorted(self._members.values(), key=lambda m: m.last_seen, reverse=True)
            return [{
                "peer_id": m.peer_id, "model": m.model, "tokenizer": m.tokenizer, "protocol": m.protocol,
                "natted": m.natted, "first_seen": m.first_seen, "last_seen": m.last_seen,
                "epochs": [dict(zip(("epoch", "announced", "pulled", "handed_off"), [e, *m.epochs.get(e, [0, 0, 0])]))
                           for e in window],
                "announced": sum(c[_ANNOUNCED] for e, c in m.epochs.items() if e in window),
                "pulled": sum(c[_PULLED] for e, c in m.epochs.items() if e in window),
                "handed_off": sum(c[_HANDED] for e, c in m.epochs.items() if e in window),
            } for m in members]
