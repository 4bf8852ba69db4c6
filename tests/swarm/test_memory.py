"""The in-process hub carries signed bytes through ``swarm.intake``: what it delivers was verified and
screened exactly as on the hivemind path, and tampered, replayed, stale or over-quota batches are rejected
and counted. Pure (no p2pd): the intake functions are also tested directly here."""

from __future__ import annotations

from dataclasses import replace

import pytest

from protocol.codec import encode_batch, encode_manifest, make_manifest
from protocol.identity import Identity
from protocol.limits import DEFAULT_LIMITS
from swarm.intake import KNOWN, check_bytes, read_manifest, screen, settle, verify_now
from swarm.memory import InMemoryHub, InMemoryTransport
from swarm.settings import SwarmSettings
from tests.swarm.batches import make_batch

SETTINGS = SwarmSettings(swarm_id="test-swarm", max_batches_per_peer_epoch=2, read_epochs=2)


def _pair() -> tuple[InMemoryHub, InMemoryTransport, InMemoryTransport]:
    hub = InMemoryHub()
    return hub, hub.join(SETTINGS, Identity.generate()), hub.join(SETTINGS, Identity.generate())


def _signed(identity: Identity, *, epoch: int = 0, seq: int = 1, text: str = "42") -> tuple[bytes, bytes]:
    batch = replace(make_batch(identity, text=text), epoch=epoch, seq=seq)
    data = encode_batch(batch, identity)
    return encode_manifest(make_manifest(batch, data, expires_at=batch.created_at + 60), identity), data


def test_published_batches_arrive_signed_verified_and_once() -> None:
    hub, alice, bob = _pair()
    batch = make_batch(alice.identity, text="7")
    assert alice.publish(batch) is not None
    assert alice.collect() == []  # a member never receives its own batches
    replay = bob.pending[0]
    (got,) = bob.collect()
    assert got.author == alice.identity.public_key and got.groups == batch.groups
    assert (got.swarm_id, got.epoch, got.seq) == ("test-swarm", 0, 1)  # filled in by the transport
    hub.announce(alice, *replay)  # the same bytes again
    assert bob.collect() == []
    assert bob.stats()["batches_accepted"] == 1 and bob.stats()["batches_rejected"] == {}
    assert bob.stats()["wire_verify_seconds"] > 0 and alice.stats()["wire_encode_seconds"] > 0


def test_tampered_bytes_are_rejected_and_the_author_banned() -> None:
    hub, alice, bob = _pair()
    manifest_data, data = _signed(alice.identity)
    hub.announce(alice, manifest_data, data[:-1] + bytes([data[-1] ^ 1]))  # no longer the announced hash
    # A manifest re-made (and re-signed by the author) for bytes whose batch signature is broken.
    batch = replace(make_batch(alice.identity), seq=2)
    broken = encode_batch(batch, alice.identity)
    broken = broken[:-1] + bytes([broken[-1] ^ 1])
    hub.announce(alice, encode_manifest(make_manifest(batch, broken, expires_at=batch.created_at + 60),
                                        alice.identity), broken)
    assert bob.collect() == []
    rejected = bob.stats()["batches_rejected"]
    assert rejected["hash_mismatch"] == 1
    assert rejected.get("bad_signature", 0) + rejected.get("banned", 0) == 1  # banned after the first offence
    alice.publish(make_batch(alice.identity))
    assert bob.collect() == [] and bob.stats()["batches_rejected"]["banned"] >= 1


def test_a_forged_manifest_is_counted_and_nothing_pulled() -> None:
    hub, alice, bob = _pair()
    manifest_data, data = _signed(alice.identity)
    hub.announce(alice, manifest_data[:-1] + bytes([manifest_data[-1] ^ 1]), data)
    assert bob.collect() == []
    assert set(bob.stats()["batches_rejected"]) == {"manifest_bad_signature"}


def test_stale_and_over_quota_batches_are_screened_out() -> None:
    hub, alice, bob = _pair()
    hub.epoch = 5
    hub.announce(alice, *_signed(alice.identity, epoch=3, seq=1))  # read_epochs 2: epoch 3 is too old
    for seq in (2, 3, 4):  # quota: 2 batches per author and epoch (distinct contents: no dedup)
        hub.announce(alice, *_signed(alice.identity, epoch=5, seq=seq, text=str(seq)))
    assert len(bob.collect()) == 2
    assert bob.stats()["batches_rejected"] == {"stale": 1, "quota_batches": 1}


def test_intake_steps_directly() -> None:
    from swarm.state import peer_book_for

    alice = Identity.generate()
    book = peer_book_for(SETTINGS)
    manifest_data, data = _signed(alice, epoch=1)
    assert read_manifest(book, manifest_data, DEFAULT_LIMITS, own_key=alice.public_key, swarm_id="test-swarm") is None
    assert read_manifest(book, manifest_data, DEFAULT_LIMITS, own_key=b"\0" * 32, swarm_id="other") is None
    manifest = read_manifest(book, manifest_data, DEFAULT_LIMITS, own_key=b"\0" * 32, swarm_id="test-swarm")
    assert manifest is not None
    assert screen(book, manifest, DEFAULT_LIMITS, current_epoch=1, now=0.0) is None  # in flight now
    assert check_bytes(manifest, data + b"x", SETTINGS, DEFAULT_LIMITS, from_author=True)[:2] == ("size_mismatch", True)
    other = SwarmSettings(swarm_id="elsewhere")
    assert verify_now(book, manifest, data, other, DEFAULT_LIMITS, {}, from_author=True) == (None, "wrong_swarm", True)
    seen: dict[bytes, int] = {}
    batch, reason, offence = verify_now(book, manifest, data, SETTINGS, DEFAULT_LIMITS, seen, from_author=True)
    assert batch is not None and reason is None and not offence and len(seen) == len(batch.groups)
    settle(book, manifest, len(data), None, offence=False, now=0.0)
    assert book.accepted == 1 and screen(book, manifest, DEFAULT_LIMITS, current_epoch=1, now=0.0) == KNOWN
    # The same groups again, under another id: nothing new, refused as duplicate content (no offence).
    again_manifest, again = _signed(alice, epoch=1, seq=9)
    m2 = read_manifest(book, again_manifest, DEFAULT_LIMITS, own_key=b"", swarm_id="test-swarm")
    assert m2 is not None and screen(book, m2, DEFAULT_LIMITS, current_epoch=1, now=0.0) is None
    assert verify_now(book, m2, again, SETTINGS, DEFAULT_LIMITS, seen, from_author=True) == (
        None, "duplicate_content", False)


@pytest.mark.parametrize("offence", [True, False])
def test_settle_bans_only_on_an_offence(offence: bool) -> None:
    from swarm.state import peer_book_for

    alice = Identity.generate()
    book = peer_book_for(SETTINGS)
    manifest_data, data = _signed(alice)
    manifest = read_manifest(book, manifest_data, DEFAULT_LIMITS, own_key=b"", swarm_id="test-swarm")
    assert manifest is not None and screen(book, manifest, DEFAULT_LIMITS, current_epoch=0, now=0.0) is None
    settle(book, manifest, len(data), "hash_mismatch", offence=offence, now=0.0)
    assert book.rejected["hash_mismatch"] == 1 and book.is_banned(alice.peer_id, 1.0) == offence
