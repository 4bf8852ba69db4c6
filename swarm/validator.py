"""``ManifestValidator``: the hivemind record validator of a swarm's DHT namespace.

What hivemind hands a validator. ``validate(record)`` is called when a peer asks this node to store a
record (``rpc_store``) and on every record a peer returns to this node's lookups (``call_find``); a reply
holding one invalid record is dropped whole. ``record.key`` is the DHT id of the key, i.e.
``sha1(msgpack(key))``, never the key text, so a key cannot be parsed here. ``strip_value`` is called on
every value a lookup returns, from local storage too, before hivemind deserializes it.

The design that follows from it:

* **A bounded window of key ids, past and future.** The ids of this swarm's manifest keys of epochs
  ``[current - past_epochs, current + future_epochs]`` are precomputed (and extended as epochs pass).
  ``future_epochs`` covers every epoch whose first second comes before the latest expiration a record
  may have (``now + max_ttl``): a record under a key of a later epoch expires before anyone reads it.
  Under a key of the window, a record must be a signed manifest whose author owns the subkey, whose
  epoch and shard match the key, and whose epoch is at most one ahead ("record_future_epoch" otherwise:
  nothing may squat the slots of an epoch that has not started). Older epochs than the window are
  never read (``read_epochs`` is at most 16) and are treated as foreign keys.
* **Checks that need no key.** Every record, whatever its key: a finite expiration ("NaN" compares false
  with everything and would slip past the ceiling), at most ``max_ttl`` ahead, and at most
  ``max_record_bytes`` (a manifest is at most 8 KiB; foreign records get the same ceiling).
* **Bounded storage.** Accepted records are accounted by ``(key, subkey)`` until they expire; records
  outside the namespace may hold at most ``max_foreign_bytes`` of it and all records
  ``max_store_bytes`` ("record_store_full" beyond). Reads are accounted too (hivemind caches what it
  finds), and re-reading a record replaces its entry rather than adding one.
* **A record read again is not checked again.** Every lookup returns the whole dictionary of manifests
  of a key, from every peer holding a copy, so a node reads each manifest many times (tens of times a
  poll in a swarm of 20). A record identical to one accepted before (same key, subkey, expiration and
  value digest, remembered with its storage entry until it expires) passes without being decoded and its
  signature verified again: what it was checked against (the key's epoch and shard, the author's slot)
  does not change, and the checks that depend on the clock only get easier as time passes.
* **Validation on read.** The collector re-checks every entry it reads (``read_entry``), because local
  storage is read without a call to ``validate``; and ``strip_value`` replaces a value that is not
  msgpack by msgpack ``nil``, so one malformed value cannot make hivemind's lookup raise (which would
  leave the lookup's future unresolved and every poll timing out).

Rejections are counted by reason (read them with ``snapshot()``; thread-safe).
"""

from __future__ import annotations

import hashlib
import heapq
import logging
import math
import threading
from collections import Counter
from collections.abc import Callable

from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.utils import MSGPackSerializer, get_dht_time

from protocol.codec import decode_manifest
from protocol.errors import ProtocolError
from protocol.identity import peer_id_from_public_key
from protocol.limits import DEFAULT_LIMITS, Limits
from protocol.records import Manifest
from swarm.keys import KEY_SHARDS, manifest_key, manifest_subkey, shard_of

__all__ = ["ManifestValidator"]

logger = logging.getLogger(__name__)

_CLOCK_SLACK = 5.0  # seconds of clock disagreement tolerated between peers
_NIL = b"\xc0"  # msgpack nil: what a lookup sees instead of a value that is not msgpack
_ENTRY_OVERHEAD = 256  # bytes of bookkeeping per stored record, counted with its value
_MIB = 1024 * 1024


class ManifestValidator(RecordValidatorBase):  # type: ignore[misc]  # hivemind ships no types
    """Owner-bound, signed, bounded manifests under this swarm's keys; bounded records elsewhere."""

    def __init__(
        self,
        swarm_id: str,
        *,
        epoch_seconds: float,
        max_ttl: float,
        limits: Limits = DEFAULT_LIMITS,
        clock: Callable[[], float] = get_dht_time,
        past_epochs: int = 16,
        max_record_bytes: int | None = None,
        max_store_bytes: int = 64 * _MIB,
        max_foreign_bytes: int = 4 * _MIB,
        shards: int = KEY_SHARDS,
    ) -> None:
        self.swarm_id = swarm_id
        self.shards = shards
        self.epoch_seconds = epoch_seconds
        self.max_ttl = max_ttl
        self.limits = limits
        self.clock = clock
        self.past_epochs = past_epochs
        self.future_epochs = math.ceil((max_ttl + _CLOCK_SLACK) / epoch_seconds) + 1
        self.max_record_bytes = max_record_bytes or limits.max_manifest_bytes + 64
        self.max_store_bytes = max_store_bytes
        self.max_foreign_bytes = max_foreign_bytes
        self._lock = threading.Lock()
        self._rejected: Counter[str] = Counter()
        self._key_ids: dict[bytes, tuple[int, int]] = {}  # DHT id -> (epoch, shard), for the window
        self._window: tuple[int, int] = (0, -1)  # epochs whose ids are in _key_ids, inclusive
        # Storage accounting: (key id, subkey) -> (bytes, expiration, foreign, value digest); a heap of
        # expirations. The digest lets a record read again skip the checks it passed (see above).
        self._stored: dict[tuple[bytes, bytes], tuple[int, float, bool, bytes]] = {}
        self._expiries: list[tuple[float, bytes, bytes]] = []
        self.stored_bytes = 0
        self.foreign_bytes = 0

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._rejected)

    def count(self, reason: str) -> None:
        with self._lock:
            self._rejected[reason] += 1

    # -- hivemind's interface -------------------------------------------------------------------------

    def validate(self, record: DHTRecord) -> bool:
        now = self.clock()
        digest = hashlib.blake2b(record.value, digest_size=16).digest()
        with self._lock:
            reason = self._generic_reason(record, now)
            key_info = None if reason is not None else self._key_info(record.key, now)
            seen = self._stored.get((record.key, record.subkey or b""))
            # Accepted before under this swarm's checks (not as a foreign record): skip them this time.
            again = seen is not None and not seen[2] and seen[1] == record.expiration_time >= now and seen[3] == digest
        if reason is None and key_info is not None and not again:
            reason = self._namespace_reason(record, *key_info)
        with self._lock:
            if reason is None:
                reason = self._account(record, foreign=key_info is None, now=now, digest=digest)
            if reason is None:
                return True
            self._rejected[reason] += 1
        logger.debug("rejected DHT record (key id %s): %s", record.key.hex()[:16], reason)
        return False

    def strip_value(self, record: DHTRecord) -> bytes:
        """The value as stored, or msgpack ``nil`` if it is not msgpack (so a lookup cannot raise)."""
        value: bytes = record.value
        try:
            MSGPackSerializer.loads(value)
        except Exception:  # any msgpack failure on peer bytes
            self.count("record_malformed_read")
            return _NIL
        return value

    # -- validation on read ---------------------------------------------------------------------------

    def read_entry(
        self, epoch: int, shard: int, subkey: object, value: object, expiration: float
    ) -> Manifest | None:
        """The manifest of an entry read under the key of ``(epoch, shard)``, or None (reason counted).

        The same checks as ``validate``, on a deserialized subkey and value, for entries read from local
        storage (which hivemind does not validate again) or stored before this node's window moved.
        """
        reason, manifest = self._check_entry(epoch, shard, subkey, value, expiration, self.clock())
        if reason is not None:
            self.count(reason)
            logger.debug("ignored a DHT entry read under epoch %d shard %d: %s", epoch, shard, reason)
        return manifest

    def _check_entry(
        self, epoch: int, shard: int, subkey: object, value: object, expiration: float, now: float
    ) -> tuple[str | None, Manifest | None]:
        if not isinstance(expiration, float | int) or not math.isfinite(expiration):
            return "record_bad_expiration", None
        if expiration > now + self.max_ttl + _CLOCK_SLACK:
            return "record_ttl_too_long", None
        if epoch > self._current(now) + 1:
            return "record_future_epoch", None
        if not isinstance(subkey, str) or not isinstance(value, bytes):
            return "record_malformed", None
        try:
            manifest = decode_manifest(value, self.limits)
        except ProtocolError as exc:
            return f"record_{exc.reason}", None
        author = peer_id_from_public_key(manifest.author)
        if subkey != manifest_subkey(author, manifest.seq):
            return "record_subkey_not_owner", None
        if manifest.swarm_id != self.swarm_id or manifest.epoch != epoch or shard_of(author, self.shards) != shard:
            return "record_wrong_key", None
        if expiration > manifest.expires_at + _CLOCK_SLACK:
            return "record_outlives_manifest", None
        if manifest.expires_at - manifest.created_at > self.max_ttl + _CLOCK_SLACK:
            return "record_ttl_too_long", None
        return None, manifest

    # -- helpers ----------------------------------------------------------------------------------------

    def _current(self, now: float) -> int:
        return math.floor(now / self.epoch_seconds)

    def _generic_reason(self, record: DHTRecord, now: float) -> str | None:
        """Checks that hold for any key."""
        expiration = record.expiration_time
        if not isinstance(expiration, float | int) or not math.isfinite(expiration):
            return "record_bad_expiration"
        if expiration > now + self.max_ttl + _CLOCK_SLACK:
            return "record_ttl_too_long"  # any key: nothing may squat the DHT for long
        if len(record.value) + len(record.subkey or b"") > self.max_record_bytes:
            return "record_too_large"
        return None

    def _namespace_reason(self, record: DHTRecord, epoch: int, shard: int) -> str | None:
        try:
            subkey = MSGPackSerializer.loads(record.subkey) if record.subkey else None
            value = MSGPackSerializer.loads(record.value)
        except Exception:  # any msgpack failure on peer bytes means a malformed record
            return "record_malformed"
        if subkey is None:
            return "record_no_subkey"  # a plain value would squat the key's dictionary of manifests
        return self._check_entry(epoch, shard, subkey, value, record.expiration_time, self.clock())[0]

    def _key_info(self, key: bytes, now: float) -> tuple[int, int] | None:
        """``(epoch, shard)`` if ``key`` is the DHT id of a manifest key of the window, else None."""
        current = self._current(now)
        low, high = current - self.past_epochs, current + self.future_epochs
        old_low, old_high = self._window
        if (low, high) != (old_low, old_high):
            keep = {k: v for k, v in self._key_ids.items() if low <= v[0] <= high}
            for epoch in range(max(low, 0), high + 1):
                if old_low <= epoch <= old_high:
                    continue
                for shard in range(self.shards):
                    key_id = DHTID.generate(source=manifest_key(self.swarm_id, epoch, shard)).to_bytes()
                    keep[key_id] = (epoch, shard)
            self._key_ids, self._window = keep, (low, high)
        return self._key_ids.get(key)

    def _account(self, record: DHTRecord, *, foreign: bool, now: float, digest: bytes) -> str | None:
        """Reserve room for an accepted record, or say why there is none ("record_store_full")."""
        while self._expiries and self._expiries[0][0] < now:
            expiration, key, subkey = heapq.heappop(self._expiries)
            entry = self._stored.get((key, subkey))
            if entry is not None and entry[1] == expiration:
                self._forget(key, subkey)
        slot = (record.key, record.subkey or b"")
        nbytes = len(record.value) + len(slot[1]) + _ENTRY_OVERHEAD
        expiration = float(record.expiration_time)
        previous = self._stored.get(slot)
        if previous is not None and previous[:2] == (nbytes, expiration) and previous[3] == digest:
            return None  # the same record read again
        freed = previous[0] if previous is not None else 0
        if self.stored_bytes - freed + nbytes > self.max_store_bytes:
            return "record_store_full"
        if foreign and self.foreign_bytes - freed + nbytes > self.max_foreign_bytes:
            return "record_store_full"
        if previous is not None:
            self._forget(*slot)
        self._stored[slot] = (nbytes, expiration, foreign, digest)
        self.stored_bytes += nbytes
        if foreign:
            self.foreign_bytes += nbytes
        heapq.heappush(self._expiries, (expiration, *slot))
        return None

    def _forget(self, key: bytes, subkey: bytes) -> None:
        nbytes, _, foreign, _ = self._stored.pop((key, subkey))
        self.stored_bytes -= nbytes
        if foreign:
            self.foreign_bytes -= nbytes
