"""Hand-off: a node behind NAT gives its signed batches to reachable peers, which hold and serve them.

A ``client_mode`` node cannot be dialed, so peers that are not already connected to it could never pull
its batches. With ``nat_sharing: handoff`` it pushes each signed batch to a few of its initial peers
(``rpc_put_batch`` in ``swarm.core``) and lists their addresses first in the batch's signed address list;
pullers then fetch the batch by id from those holders over the ordinary pull path.

``HandoffStore`` is the holder's side, pure bookkeeping (no I/O, no clock): what it holds, and the bounds
that keep a holder safe from a flood of hand-offs. A hand-off is taken only if it is a valid signed batch
of this swarm (checked by the caller before ``add``), of a recent epoch, and within three quotas:
batches and bytes per author identity and epoch, and bytes over all authors together. Refusals are
counted by reason. Held batches are dropped once their epoch leaves the read window.

The wire exchange on the put stream (all integers big-endian)::

    client: batch id (64 ASCII hex) + byte size (8 bytes)
    holder: one status byte; ``GO`` means "send it", anything else ends the stream
    client: the signed batch bytes
    holder: one status byte (``OK`` or why not)
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass

__all__ = ["HandoffStatus", "HandoffStore"]


class HandoffStatus:
    """Status bytes of the put stream, and the reasons counted for them."""

    GO = 0
    OK = 1
    HAVE = 2
    DISABLED = 3
    TOO_LARGE = 4
    FULL = 5
    BUSY = 6
    QUOTA = 7
    STALE = 8
    INVALID = 9

    NAMES = {
        OK: "ok",
        HAVE: "have",
        DISABLED: "disabled",
        TOO_LARGE: "too_large",
        FULL: "full",
        BUSY: "busy",
        QUOTA: "quota",
        STALE: "stale",
        INVALID: "invalid",
    }


@dataclass
class _Held:
    data: bytes
    author: str
    epoch: int


class HandoffStore:
    """Batches held for ``client_mode`` peers, bounded per author identity and epoch and in total."""

    def __init__(
        self,
        *,
        max_per_author_epoch: int,
        max_bytes_per_author_epoch: int,
        max_total_bytes: int,
        read_epochs: int,
    ) -> None:
        self.max_per_author_epoch = max_per_author_epoch
        self.max_bytes_per_author_epoch = max_bytes_per_author_epoch
        self.max_total_bytes = max_total_bytes
        self.read_epochs = read_epochs
        self.total_bytes = 0
        self.refused: Counter[str] = Counter()
        self.accepted = 0
        self._held: OrderedDict[str, _Held] = OrderedDict()
        self._per_author: Counter[tuple[str, int]] = Counter()
        self._bytes_per_author: Counter[tuple[str, int]] = Counter()

    def __len__(self) -> int:
        return len(self._held)

    def get(self, batch_id: str) -> bytes | None:
        held = self._held.get(batch_id)
        return None if held is None else held.data

    def precheck(self, batch_id: str, nbytes: int, max_batch_bytes: int) -> int:
        """Before the bytes are sent: ``GO``, or the status that refuses them (counted)."""
        if batch_id in self._held:
            return HandoffStatus.HAVE
        if nbytes > max_batch_bytes:
            return self._refuse(HandoffStatus.TOO_LARGE)
        if self.total_bytes + nbytes > self.max_total_bytes:
            return self._refuse(HandoffStatus.FULL)
        return HandoffStatus.GO

    def add(self, batch_id: str, data: bytes, author: str, epoch: int, current_epoch: int) -> int:
        """A verified batch of ``author``: ``OK`` if now held, else the refusing status (counted)."""
        if batch_id in self._held:
            return HandoffStatus.HAVE
        if epoch <= current_epoch - self.read_epochs or epoch > current_epoch + 1:
            return self._refuse(HandoffStatus.STALE)
        key = (author, epoch)
        if (
            self._per_author[key] + 1 > self.max_per_author_epoch
            or self._bytes_per_author[key] + len(data) > self.max_bytes_per_author_epoch
        ):
            return self._refuse(HandoffStatus.QUOTA)
        if self.total_bytes + len(data) > self.max_total_bytes:
            return self._refuse(HandoffStatus.FULL)
        self._held[batch_id] = _Held(data, author, epoch)
        self._per_author[key] += 1
        self._bytes_per_author[key] += len(data)
        self.total_bytes += len(data)
        self.accepted += 1
        return HandoffStatus.OK

    def refuse(self, status: int) -> int:
        """Count a refusal decided by the caller (busy, invalid)."""
        return self._refuse(status)

    def prune(self, current_epoch: int) -> None:
        """Drop held batches, and quota counts, of epochs outside the read window."""
        oldest = current_epoch - self.read_epochs + 1
        for batch_id in [b for b, h in self._held.items() if h.epoch < oldest]:
            held = self._held.pop(batch_id)
            self.total_bytes -= len(held.data)
        for counter in (self._per_author, self._bytes_per_author):
            for key in [k for k in counter if k[1] < oldest]:
                del counter[key]

    def _refuse(self, status: int) -> int:
        self.refused[HandoffStatus.NAMES[status]] += 1
        return status
