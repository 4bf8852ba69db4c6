"""ManifestValidator on hand-built DHT records (no network)."""

from __future__ import annotations

import dataclasses

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
) -> DHTRecord:
    batch = dataclasses.replace(make_batch(author), epoch=epoch, seq=seq, created_at=NOW)
    manifest = make_manifest(batch, encode_batch(batch, author), expires_at=NOW + ttl)
    owner = owner or author
    key = manifest_key("test-swarm", EPOCH, shard_of(owner.peer_id))
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
