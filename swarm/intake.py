"""The intake of announced batches: read the manifest, screen it, verify the pulled bytes, settle the outcome.

Every batch a node receives passes these four steps in this order, whatever carried it: the hivemind
path (``swarm.core``: manifests from the DHT, bytes pulled from the author over a libp2p stream) and the
in-process hub (``swarm.memory``: manifests and bytes handed over in memory) call the same functions, so
a benchmark on the hub exercises the same checks as a real swarm.

1. ``read_manifest``: decode and verify a signed manifest; drop our own and other swarms'.
2. ``screen``: the peer book's decision before a pull: dedup, too large, ban list, staleness, quotas.
3. ``verify_batch``: the pulled bytes are the batch the manifest announced (size, hash, signature,
   limits, swarm id, author/epoch/seq); CPU work, run it off any event loop.
4. ``settle``: count the outcome in the peer book (accept, or reject and ban the author on an offence).

Pure: no I/O, no clock (callers pass ``now``), no locking (the caller holds its lock around the peer
book calls).
"""

from __future__ import annotations

from protocol.codec import batch_id, decode_batch, decode_manifest
from protocol.errors import ProtocolError
from protocol.identity import peer_id_from_public_key
from protocol.limits import Limits
from protocol.records import Manifest, RolloutBatch
from swarm.peer_book import PeerBook, RejectReason

__all__ = ["KNOWN", "read_manifest", "screen", "settle", "verify_batch"]

KNOWN = "known"
"""``screen``'s answer for a batch already accepted, rejected or in flight: skipped and not counted."""


def read_manifest(
    book: PeerBook, raw: bytes, limits: Limits, *, own_key: bytes, swarm_id: str
) -> Manifest | None:
    """The manifest in ``raw`` if it is another author's, of this swarm; bad bytes are counted."""
    try:
        manifest = decode_manifest(raw, limits)
    except ProtocolError as exc:
        book.count(f"manifest_{exc.reason}")
        return None
    if manifest.author == own_key or manifest.swarm_id != swarm_id:
        return None
    return manifest


def screen(book: PeerBook, manifest: Manifest, limits: Limits, *, current_epoch: int, now: float) -> str | None:
    """None: pull the batch (its quota is reserved). Otherwise ``KNOWN`` or the counted rejection reason."""
    author = peer_id_from_public_key(manifest.author)
    if book.is_known(manifest.batch_id):
        return KNOWN
    if manifest.byte_size > limits.max_compressed_bytes:
        return book.refuse(author, manifest.batch_id, manifest.epoch, "too_large")
    return book.screen(author, manifest.batch_id, manifest.epoch, manifest.byte_size, current_epoch, now)


def verify_batch(
    manifest: Manifest, data: bytes, limits: Limits, *, swarm_id: str
) -> tuple[RolloutBatch | None, str | None]:
    """``(batch, None)`` if ``data`` is the batch ``manifest`` announced, else ``(None, reason)``."""
    if len(data) != manifest.byte_size:
        return None, RejectReason.SIZE_MISMATCH
    if batch_id(data) != manifest.batch_id:
        return None, RejectReason.HASH_MISMATCH
    try:
        batch = decode_batch(data, limits)
    except ProtocolError as exc:
        return None, exc.reason
    if batch.swarm_id != swarm_id:
        return None, RejectReason.WRONG_SWARM
    if (batch.author, batch.epoch, batch.seq) != (manifest.author, manifest.epoch, manifest.seq):
        return None, RejectReason.MANIFEST_MISMATCH
    return batch, None


def settle(
    book: PeerBook, manifest: Manifest, nbytes: int, reason: str | None, *, offence: bool, now: float
) -> None:
    """Record a verified pull: accepted (``reason`` None) or rejected, banning the author on ``offence``."""
    if reason is None:
        book.accept(manifest.batch_id, nbytes)
        return
    author = peer_id_from_public_key(manifest.author)
    book.reject(author, manifest.batch_id, manifest.epoch, manifest.byte_size, reason, offence=offence, now=now)
