"""The intake of announced batches: the checks every received batch passes, whatever carried it.

The hivemind path (``swarm.core``: manifests read from the DHT, bytes pulled from the author over a
libp2p stream) and the in-process hub (``swarm.memory``: manifests and bytes handed over in memory) call
these same functions in the same order, so a benchmark on the hub pays for, and is protected by, the
checks of a real swarm:

1. the manifest: decoded and its signature verified (``read_manifest`` here; the core's DHT validator
   adds the checks that bind a DHT entry to its key);
2. ``screen``: the peer book's decision before a pull: dedup by batch id, a size no peer may announce,
   bans, the staleness window, per-author and global quotas (reserved on success);
3. ``check_bytes``: the pulled bytes have the announced size and hash, and a payload this node decodes
   (its expanded size, read from the frame header, within the caps); then ``PeerBook.charge_payload``;
4. ``decode_with_digests`` (CPU work: run it off any event loop) and ``check_decoded``: signature and
   limits (in ``protocol.codec``), swarm id, the manifest's author, epoch and seq;
5. ``fresh_groups``: groups whose content was already accepted (from any author) are dropped;
6. ``settle``: the outcome counted in the peer book (accepted, or rejected and the author banned on an
   offence).

``verify_now`` runs steps 3 to 5 in one call for callers without an event loop. Pure: no I/O, no clock
(callers pass ``now``), no locking (callers hold their lock around the peer-book calls).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from protocol.codec import batch_id, batch_payload_size, decode_batch, decode_manifest, group_digest
from protocol.errors import ProtocolError
from protocol.identity import peer_id_from_public_key
from protocol.limits import Limits
from protocol.records import Manifest, RolloutBatch
from swarm.peer_book import PeerBook, RejectReason
from swarm.settings import SwarmSettings

__all__ = [
    "DEFER",
    "KNOWN",
    "check_bytes",
    "check_decoded",
    "decode_with_digests",
    "decoded_cost",
    "fresh_groups",
    "read_manifest",
    "screen",
    "settle",
    "verify_now",
]

KNOWN = "known"
"""``screen``'s answer for a batch already accepted: skipped, not counted."""
DEFER = "defer"
"""``screen``'s answer for a batch that must be asked about again later (being pulled, or no slot free)."""
_MIB = 1024 * 1024


def decoded_cost(payload_bytes: int) -> int:
    """Estimated peak memory of decoding a batch whose payload expands to ``payload_bytes``.

    Token ids and log-probs travel as 4 bytes and become Python ints and floats in tuples (up to 32 bytes
    each); small rollouts cost a fixed few hundred bytes of objects each. Measured peaks (tracemalloc,
    ``tests/swarm/test_hostile_pulls.py``) are 7x the payload for long completions and up to 23x for
    tiny ones, so: 32x the first MiB, 10x the rest.
    """
    return 32 * min(payload_bytes, _MIB) + 10 * max(0, payload_bytes - _MIB) + 64 * 1024


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


def screen(
    book: PeerBook,
    manifest: Manifest,
    limits: Limits,
    *,
    current_epoch: int,
    now: float,
    may_start: Callable[[str, bool], bool] | None = None,
) -> str | None:
    """None: pull the batch (it is in flight, its quotas reserved). Otherwise ``KNOWN``, ``DEFER`` or the
    counted rejection reason. ``may_start(author, newcomer)`` is the caller's pull-slot check."""
    author = peer_id_from_public_key(manifest.author)
    if book.is_known(manifest.batch_id):
        return KNOWN
    if book.in_flight(manifest.batch_id):
        return DEFER
    if manifest.byte_size > limits.max_compressed_bytes:  # a signed claim no peer may make
        return book.refuse(author, manifest.epoch, RejectReason.TOO_LARGE, offence=True, now=now)
    if may_start is not None and not may_start(author, not book.is_established(author)):
        return DEFER
    return book.screen(author, manifest.batch_id, manifest.epoch, manifest.byte_size, current_epoch, now)


def check_bytes(
    manifest: Manifest, data: bytes, settings: SwarmSettings, limits: Limits, *, from_author: bool
) -> tuple[str | None, bool, int]:
    """``(reason or None, offence, payload bytes)`` for pulled ``data``, before anything is decoded.

    Once the bytes hash to the announced id they are what the author signed for, whoever served them, so
    what is wrong with them is the author's offence; wrong bytes are the server's (an offence only when
    the author served them). Limits of this node's own are no offence.
    """
    if len(data) != manifest.byte_size:
        return RejectReason.SIZE_MISMATCH, from_author, 0
    if batch_id(data) != manifest.batch_id:
        return RejectReason.HASH_MISMATCH, from_author, 0
    try:
        payload = batch_payload_size(data)
    except ProtocolError as exc:
        return exc.reason, True, 0
    cap = min(settings.max_batch_payload_bytes, limits.max_decompressed_bytes)
    if payload > cap or decoded_cost(payload) > settings.max_inbox_bytes:
        return RejectReason.PAYLOAD_TOO_LARGE, False, payload
    return None, False, payload


def decode_with_digests(data: bytes, limits: Limits) -> tuple[RolloutBatch, list[bytes]]:
    """Decode a batch (signature and limits checked) and hash each group's content: both CPU work."""
    batch = decode_batch(data, limits)
    return batch, [group_digest(group) for group in batch.groups]


def check_decoded(manifest: Manifest, batch: RolloutBatch, *, swarm_id: str) -> str | None:
    """Why a decoded batch is not the one ``manifest`` announced (an offence of its author), or None."""
    if batch.swarm_id != swarm_id:
        return RejectReason.WRONG_SWARM
    if (batch.author, batch.epoch, batch.seq) != (manifest.author, manifest.epoch, manifest.seq):
        return RejectReason.MANIFEST_MISMATCH
    return None


def fresh_groups(
    batch: RolloutBatch, digests: list[bytes], seen: dict[bytes, int], epoch: int
) -> tuple[RolloutBatch | None, int]:
    """``batch`` without the groups whose content is in ``seen`` (None if nothing is left), and how many
    were dropped; the digests of a batch with anything new are added to ``seen`` (with ``epoch``)."""
    fresh = [group for group, digest in zip(batch.groups, digests) if digest not in seen]
    if not fresh:
        return None, len(batch.groups)
    for digest in digests:
        seen.setdefault(digest, epoch)
    dropped = len(batch.groups) - len(fresh)
    return (replace(batch, groups=tuple(fresh)) if dropped else batch), dropped


def verify_now(
    book: PeerBook,
    manifest: Manifest,
    data: bytes,
    settings: SwarmSettings,
    limits: Limits,
    seen: dict[bytes, int],
    *,
    from_author: bool,
) -> tuple[RolloutBatch | None, str | None, bool]:
    """Steps 3 to 5 in one call: ``(batch, None, False)`` or ``(None, reason, offence)``."""
    author = peer_id_from_public_key(manifest.author)
    reason, offence, payload = check_bytes(manifest, data, settings, limits, from_author=from_author)
    if reason is None:
        reason = book.charge_payload(author, manifest.epoch, payload)
    if reason is not None:
        return None, reason, offence
    try:
        batch, digests = decode_with_digests(data, limits)
    except ProtocolError as exc:
        return None, exc.reason, True
    reason = check_decoded(manifest, batch, swarm_id=settings.swarm_id)
    if reason is not None:
        return None, reason, True
    fresh, _ = fresh_groups(batch, digests, seen, manifest.epoch)
    if fresh is None:
        return None, RejectReason.DUPLICATE_CONTENT, False
    return fresh, None, False


def settle(
    book: PeerBook,
    manifest: Manifest,
    nbytes: int,
    reason: str | None,
    *,
    offence: bool,
    now: float,
    groups: int = 0,
) -> None:
    """Count a verified pull: accepted (``reason`` None; ``groups`` of it queued) or rejected, banning the
    author on ``offence``."""
    author = peer_id_from_public_key(manifest.author)
    if reason is None:
        book.accept(author, manifest.batch_id, manifest.epoch, nbytes, groups=groups)
    else:
        book.reject(author, manifest.batch_id, manifest.epoch, manifest.byte_size, reason, offence=offence,
                    now=now)
