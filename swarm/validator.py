"""``ManifestValidator``: a hivemind record validator that binds every manifest subkey to its author.

hivemind calls ``validate`` when a peer asks this node to store a record and when a peer returns records
to this node's queries; an invalid record is dropped (a reply holding one is dropped whole). A record in
this swarm's namespace is valid only if its value is a signed manifest (checked by ``protocol.codec``)
whose author owns the subkey, whose epoch and author shard match the key, and whose lifetime is within
the ceiling. Records outside the namespace (e.g. of another swarm sharing the DHT) are left to others.
"""

from __future__ import annotations

import logging
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
from swarm.keys import KEY_SHARDS, epochs_to_read, manifest_key, manifest_subkey, shard_of

__all__ = ["ManifestValidator"]

logger = logging.getLogger(__name__)

_CLOCK_SLACK = 5.0  # seconds of clock disagreement tolerated between peers


class ManifestValidator(RecordValidatorBase):  # type: ignore[misc]  # hivemind ships no types
    """Accepts only owner-bound, signed, unexpired-but-not-too-long-lived manifests under swarm keys.

    Rejections are counted by reason in ``rejected`` (read them with ``snapshot()``; thread-safe).
    """

    def __init__(
        self,
        swarm_id: str,
        *,
        epoch_seconds: float,
        max_ttl: float,
        limits: Limits = DEFAULT_LIMITS,
        clock: Callable[[], float] = get_dht_time,
        watched_epochs: int = 64,
    ) -> None:
        self.swarm_id = swarm_id
        self.epoch_seconds = epoch_seconds
        self.max_ttl = max_ttl
        self.limits = limits
        self.clock = clock
        self.watched_epochs = watched_epochs
        self._lock = threading.Lock()
        self._rejected: Counter[str] = Counter()
        self._key_cache: dict[bytes, tuple[int, int]] = {}
        self._key_cache_epoch = -1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._rejected)

    def validate(self, record: DHTRecord) -> bool:
        if record.expiration_time > self.clock() + self.max_ttl + _CLOCK_SLACK:
            reason: str | None = "record_ttl_too_long"  # any key: nothing may squat the DHT for long
        else:
            key_info = self._key_info(record.key)
            if key_info is None:
                return True  # not one of this swarm's recent manifest keys
            reason = self._reject_reason(record, *key_info)
        if reason is None:
            return True
        with self._lock:
            self._rejected[reason] += 1
        logger.debug("rejected DHT record (key id %s): %s", record.key.hex()[:16], reason)
        return False

    def _reject_reason(self, record: DHTRecord, epoch: int, shard: int) -> str | None:
        if record.subkey is None:
            return "record_no_subkey"
        try:
            subkey = MSGPackSerializer.loads(record.subkey)
            value = MSGPackSerializer.loads(record.value)
        except Exception:  # any msgpack failure on peer bytes means a malformed record
            return "record_malformed"
        if not isinstance(subkey, str) or not isinstance(value, bytes):
            return "record_malformed"
        try:
            manifest = decode_manifest(value, self.limits)
        except ProtocolError as exc:
            return f"record_{exc.reason}"
        author = peer_id_from_public_key(manifest.author)
        if subkey != manifest_subkey(author, manifest.seq):
            return "record_subkey_not_owner"
        if manifest.swarm_id != self.swarm_id or manifest.epoch != epoch or shard_of(author) != shard:
            return "record_wrong_key"
        if record.expiration_time > manifest.expires_at + _CLOCK_SLACK:
            return "record_outlives_manifest"
        if manifest.expires_at - manifest.created_at > self.max_ttl + _CLOCK_SLACK:
            return "record_ttl_too_long"
        return None

    def _key_info(self, key: bytes) -> tuple[int, int] | None:
        """``(epoch, shard)`` if ``key`` is the DHT id of one of this swarm's recent manifest keys.

        DHT keys arrive hashed, so the ids of the keys of the last ``watched_epochs`` epochs (and the
        next one) are precomputed; a key of an older epoch is not recognised and passes unchecked,
        which is harmless: no node of this swarm reads it.
        """
        current = int(self.clock() // self.epoch_seconds)
        if current != self._key_cache_epoch:
            cache: dict[bytes, tuple[int, int]] = {}
            for epoch in epochs_to_read(current + 1, self.watched_epochs + 1):
                for shard in range(KEY_SHARDS):
                    key_id = DHTID.generate(source=manifest_key(self.swarm_id, epoch, shard)).to_bytes()
                    cache[key_id] = (epoch, shard)
            self._key_cache, self._key_cache_epoch = cache, current
        return self._key_cache.get(key)
