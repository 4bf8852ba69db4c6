"""ManifestValidator on hand-built DHT records (no network)."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord
from hivemind.utils import MSGPackSerializer

from protocol.codec import encode_batch, encode_manifest, make_manifest
from protocol.identity import Identity
from swarm.keys import manifest_key, manifest_subkey, shard_of
from swarm.validator import ManifestValidator
from tests.swarm.batches import make_batch

NOW = 6_000_000.0
EPOCH_SECONDS = 60.0
EPOCH = int(NOW // EPOCH_SECONDS)


@pytest.fixture
def validator() -> ManifestValidator:
    return ManifestValidator("test-swarm", epoch_seconds=EPOCH_SECONDS, max_ttl=300.0, clock=lambda: NOW)


def record(
    author: Identity,
    *,
    owner: Identity | None = None,
    epoch: int = EPOCH,
    ttl: float = 100.0,
    expiration: float | None = None,
    seq: int = 5,
    key_epoch: int = EPOCH,
) -> DHTRecord:
    batch = dataclasses.replace(make_batch(author), epoch=epoch, seq=seq, created_at=NOW)
    manifest = make_manifest(batch, encode_batch(batch, author), expires_at=NOW + ttl)
    owner = owner or author
    key = manifest_key("test-swarm", key_epoch, shard_of(owner.peer_id))
    return DHTRecord(
        key=DHTID.generate(source=key).to_bytes(),
        subkey=MSGPackSerializer.dumps(manifest_subkey(owner.peer_id, seq)),
        value=MSGPackSerializer.dumps(encode_manifest(manifest, author)),
        expiration_time=NOW + ttl if expiration is None else expiration,
    )


def test_owner_signed_manifest_is_valid(validator: ManifestValidator) -> None:
    assert validator.validate(record(Identity.generate()))
    assert validator.snapshot() == {}


def test_subkey_of_another_owner_is_rejected(validator: ManifestValidator) -> None:
    assert not validator.validate(record(Identity.generate(), owner=Identity.generate()))
    reasons = validator.snapshot()
    assert sum(reasons.values()) == 1
    assert set(reasons) <= {"record_subkey_not_owner", "record_wrong_key"}


def test_epoch_must_match_the_key(validator: ManifestValidator) -> None:
    assert not validator.validate(record(Identity.generate(), epoch=EPOCH - 1))
    assert validator.snapshot() == {"record_wrong_key": 1}


def test_expiration_ceiling(validator: ManifestValidator) -> None:
    author = Identity.generate()
    assert not validator.validate(record(author, ttl=100.0, expiration=NOW + 10_000))
    assert not validator.validate(record(author, ttl=1000.0))
    assert not validator.validate(record(author, ttl=100.0, expiration=NOW + 200))  # outlives manifest
    assert validator.snapshot() == {"record_ttl_too_long": 2, "record_outlives_manifest": 1}


def test_malformed_values_are_rejected(validator: ManifestValidator) -> None:
    good = record(Identity.generate())
    for value in (b"\xc1", MSGPackSerializer.dumps("text"), MSGPackSerializer.dumps(b"not a manifest")):
        assert not validator.validate(dataclasses.replace(good, value=value))
    reasons = validator.snapshot()
    assert reasons == {"record_malformed": 3}


def test_keys_outside_the_namespace_are_left_alone(validator: ManifestValidator) -> None:
    other = DHTRecord(DHTID.generate(source="elsewhere").to_bytes(), b"\xc0", b"\x01", NOW + 10)
    assert validator.validate(other)


def _key_id(epoch: int, shard: int) -> bytes:
    return DHTID.generate(source=manifest_key("test-swarm", epoch, shard)).to_bytes()


def test_the_key_window_reaches_past_and_future_and_far_future_epochs_are_refused(
    validator: ManifestValidator,
) -> None:
    """The window covers every epoch a record could live to see (max_ttl 300 s = 5 epochs of 60 s)."""
    author = Identity.generate()
    shard = shard_of(author.peer_id)
    assert validator.future_epochs == 7  # ceil((300 + 5) / 60) + 1
    assert validator.validate(record(author, epoch=EPOCH + 1, key_epoch=EPOCH + 1))  # one epoch of skew
    for epoch in (EPOCH + 2, EPOCH + validator.future_epochs):
        assert not validator.validate(record(author, epoch=epoch, key_epoch=epoch))
    assert validator.snapshot() == {"record_future_epoch": 2}
    # Past the window: a key nobody reads any more, treated (and bounded) as a foreign record.
    old = dataclasses.replace(record(author), key=_key_id(EPOCH - validator.past_epochs - 1, shard))
    assert validator.validate(old) and validator.foreign_bytes > 0


def test_expirations_must_be_finite(validator: ManifestValidator) -> None:
    author = Identity.generate()
    foreign = DHTRecord(DHTID.generate(source="elsewhere").to_bytes(), b"\xc0", b"\x01", NOW + 10)
    for bad in (math.nan, math.inf, -math.inf):
        assert not validator.validate(record(author, expiration=bad))
        assert not validator.validate(dataclasses.replace(foreign, expiration_time=bad))
    assert validator.snapshot() == {"record_bad_expiration": 6}


def test_records_are_bounded_in_size_and_in_total() -> None:
    now = [NOW]
    small = ManifestValidator("test-swarm", epoch_seconds=EPOCH_SECONDS, max_ttl=300.0, clock=lambda: now[0],
                              max_store_bytes=64 * 1024, max_foreign_bytes=16 * 1024)

    def foreign(name: str, size: int, expires: float = NOW + 10) -> DHTRecord:
        return DHTRecord(DHTID.generate(source=name).to_bytes(), b"\xc0", bytes(size), expires)

    assert not small.validate(foreign("big", 20_000))
    assert sum(small.validate(foreign(f"f{i}", 4000)) for i in range(10)) == 3  # 3 x (4000 + 1 + 256) fit 16 KiB
    assert small.validate(foreign("f0", 4000))  # the same record read again takes no more room
    assert small.validate(record(Identity.generate()))  # the namespace has its own, larger room
    assert small.snapshot() == {"record_too_large": 1, "record_store_full": 7}
    now[0] = NOW + 11  # the three have expired and are forgotten
    assert small.validate(foreign("g", 4000, NOW + 20)) and small.foreign_bytes == 4000 + 1 + 256


def test_a_value_that_is_not_msgpack_reads_as_nil(validator: ManifestValidator) -> None:
    good = record(Identity.generate())
    assert validator.strip_value(good) == good.value
    assert validator.strip_value(dataclasses.replace(good, value=b"\xc1\xc1")) == b"\xc0"
    assert validator.snapshot() == {"record_malformed_read": 1}


def test_entries_are_checked_again_when_read(validator: ManifestValidator) -> None:
    author, mallory = Identity.generate(), Identity.generate()
    good = record(author)
    subkey, value = MSGPackSerializer.loads(good.subkey), MSGPackSerializer.loads(good.value)
    shard = shard_of(author.peer_id)
    manifest = validator.read_entry(EPOCH, shard, subkey, value, good.expiration_time)
    assert manifest is not None and manifest.author == author.public_key
    forged = record(mallory, owner=author)
    assert validator.read_entry(EPOCH, shard, MSGPackSerializer.loads(forged.subkey),
                                MSGPackSerializer.loads(forged.value), forged.expiration_time) is None
    assert validator.read_entry(EPOCH, shard, subkey, value, math.nan) is None
    assert validator.read_entry(EPOCH + 2, shard, subkey, value, good.expiration_time) is None
    assert validator.read_entry(EPOCH, shard, subkey, None, good.expiration_time) is None
    reasons = validator.snapshot()
    assert sum(reasons.values()) == 4 and reasons["record_bad_expiration"] == 1
    assert reasons["record_future_epoch"] == 1 and reasons["record_malformed"] == 1


def test_a_record_read_again_is_not_decoded_again(validator: ManifestValidator,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A lookup returns every copy of a key's manifests, each read many times a poll: the same record
    passes without its signature being verified again, while a changed value in the slot is checked."""
    import swarm.validator as module

    calls = []
    real = module.decode_manifest
    monkeypatch.setattr(module, "decode_manifest", lambda *a, **k: calls.append(1) or real(*a, **k))
    author = Identity.generate()
    good = record(author)
    assert validator.validate(good) and validator.validate(good) and validator.validate(good)
    assert len(calls) == 1 and validator.stored_bytes > 0
    forged = dataclasses.replace(good, value=record(Identity.generate()).value)  # same slot, other signer
    assert not validator.validate(forged)
    assert len(calls) == 2 and validator.snapshot() == {"record_subkey_not_owner": 1}
    assert validator.validate(good) and len(calls) == 2  # the genuine record is still remembered

