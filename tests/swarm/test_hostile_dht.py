"""Hostile DHT writes against a running node (attacks 1, 2 and 6 of the threat list).

A raw hivemind peer (``tests.swarm.attacker``) stores records straight into the victim's storage; an
honest node publishes as usual. Each test checks the victim's counters, that the honest batches still
arrive, and that nothing of the attacker's reaches the inbox (so nothing of it can be trained on).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterator

import psutil
import pytest
from hivemind.dht.routing import DHTID
from hivemind.utils import MSGPackSerializer, get_dht_time

from protocol.identity import Identity
from swarm.keys import SLOTS_PER_AUTHOR, manifest_key, shard_of
from swarm.transport import SwarmTransport
from tests.swarm.attacker import peer_id_of, wait_until
from tests.swarm.batches import make_batch
from tests.swarm.conftest import SWARM_ID
from tests.swarm.hostile_net import HostileNet, hostile_net

_MIB = 1024 * 1024
EPOCH_SECONDS = 2.0
SETTINGS = {"epoch_seconds": EPOCH_SECONDS, "manifest_ttl": 20.0, "max_manifest_ttl": 30.0,
            "max_dht_store_bytes": 4 * _MIB, "max_foreign_dht_bytes": 1 * _MIB}


Net = HostileNet


@pytest.fixture(scope="module")
def net() -> Iterator[Net]:
    with hostile_net(SETTINGS) as built:
        yield built


def _storage_entries(transport: SwarmTransport) -> list[tuple[object, float, int]]:
    """``(subkey or None, expiration, value bytes)`` of everything in a node's DHT storage and cache."""

    def scan(core: object) -> list[tuple[object, float, int]]:
        out: list[tuple[object, float, int]] = []
        protocol = core.dht.protocol  # type: ignore[attr-defined]
        for storage in (protocol.storage, protocol.cache):
            for item in storage.data.values():
                if hasattr(item.value, "items"):
                    out.extend((sub, entry.expiration_time, len(entry.value)) for sub, entry in item.value.items())
                else:
                    out.append((None, item.expiration_time, len(item.value)))
        return out

    return transport._call_on_loop(scan)


def _inject(victim: SwarmTransport, key: str, subkey: object, value: bytes, expiration: float) -> None:
    """Put a record into the victim's local storage without any check (as if stored before a bug fix)."""
    key_id = DHTID.generate(source=key)
    victim._call_on_loop(lambda core: core.dht.protocol.storage.store_subkey(key_id, subkey, value, expiration))


def test_future_epoch_squats_of_another_authors_slots_are_refused(net: Net) -> None:
    """Attack 1: another author's slots of an epoch that has not begun, filled with the longest TTL."""
    victim, honest, attacker = net.victim, net.honest, net.attacker
    mallory = Identity.generate()
    for _ in range(5):  # an epoch is 2 s here: on a loaded machine it may pass while the records are signed and
        start = victim.current_epoch()  # stored, and the target is then only one ahead; try again in a new one
        target = start + 2
        records = [
            attacker.manifest_record(mallory, dataclasses.replace(make_batch(mallory, text="squat"), seq=slot),
                                     owner=honest.identity.peer_id, epoch=target, ttl=30.0)
            for slot in range(SLOTS_PER_AUTHOR)
        ]
        before, requests = net.rejected().get("record_future_epoch", 0), attacker.requests
        stored = attacker.store_many(peer_id_of(victim), records)
        if victim.current_epoch() == start:
            break
    else:
        pytest.fail("every try's epoch passed while its records were stored")
    assert stored == [False] * SLOTS_PER_AUTHOR
    assert net.rejected()["record_future_epoch"] == before + SLOTS_PER_AUTHOR
    # When that epoch comes, the author's own batches are stored and collected, none of mallory's.
    assert wait_until(lambda: victim.current_epoch() >= target, timeout=3 * EPOCH_SECONDS)
    assert net.received_from_honest("after the squat")
    assert attacker.requests == requests  # no forged manifest was ever read as a batch to pull


def test_plain_values_and_malformed_bytes_under_a_shard_key_are_refused(net: Net) -> None:
    victim, honest, attacker = net.victim, net.honest, net.attacker
    key = manifest_key(SWARM_ID, victim.current_epoch(), shard_of(honest.identity.peer_id))
    expiration = get_dht_time() + 25
    before = net.rejected()
    assert attacker.store(peer_id_of(victim), key, MSGPackSerializer.dumps(b"squat"), expiration) is False
    assert attacker.store(peer_id_of(victim), key, b"\xc1\xc1not msgpack", expiration, subkey="x/0") is False
    after = net.rejected()
    assert after.get("record_no_subkey", 0) == before.get("record_no_subkey", 0) + 1
    assert after.get("record_malformed", 0) == before.get("record_malformed", 0) + 1
    assert net.received_from_honest("after the plain value")


def test_a_malformed_value_in_storage_cannot_break_the_lookup(net: Net) -> None:
    """Bytes that are not msgpack, already in storage (stored unchecked), made hivemind's lookup raise and
    every poll time out; now the value reads as nil, is counted, and the shard's other entries arrive."""
    victim, honest = net.victim, net.honest
    key = manifest_key(SWARM_ID, victim.current_epoch(), shard_of(honest.identity.peer_id))
    before = net.rejected().get("record_malformed_read", 0)
    _inject(victim, key, "x/0", b"\xc1\xc1not msgpack", get_dht_time() + 25)
    assert net.received_from_honest("despite the malformed value", timeout=10.0)
    assert net.rejected().get("record_malformed_read", 0) > before


def test_entries_read_from_storage_are_validated_again(net: Net) -> None:
    """A forged entry already in local storage (hivemind reads it without validation) is checked on read."""
    victim, honest, attacker = net.victim, net.honest, net.attacker
    mallory = Identity.generate()
    key, value, expiration, subkey = attacker.manifest_record(
        mallory, make_batch(mallory, text="forged"), owner=honest.identity.peer_id, epoch=victim.current_epoch())
    before, requests = net.rejected().get("record_subkey_not_owner", 0), attacker.requests
    _inject(victim, key, subkey, value, expiration)
    assert wait_until(lambda: net.rejected().get("record_subkey_not_owner", 0) == before + 1)
    assert net.received_from_honest("after the forged entry")
    assert attacker.requests == requests  # nothing was pulled from the forger


def test_non_finite_expirations_are_refused(net: Net) -> None:
    """Attack 2: NaN compares false with everything, so it slipped past the lifetime ceiling."""
    victim, attacker = net.victim, net.attacker
    mallory = Identity.generate()
    key, value, _, subkey = attacker.manifest_record(mallory, make_batch(mallory), epoch=victim.current_epoch())
    before = net.rejected().get("record_bad_expiration", 0)
    for expiration in (math.nan, math.inf):
        assert attacker.store(peer_id_of(victim), "elsewhere/nan", MSGPackSerializer.dumps(b"x"), expiration) is False
        assert attacker.store(peer_id_of(victim), key, value, expiration, subkey=subkey) is False
    assert net.rejected()["record_bad_expiration"] == before + 4
    assert all(math.isfinite(exp) for _, exp, _ in _storage_entries(victim))
    assert net.received_from_honest("after the NaN")


def test_a_storage_flood_under_foreign_keys_is_bounded(net: Net) -> None:
    """Attack 6: large records with the longest TTL under keys outside the namespace, as many as sent."""
    victim, attacker = net.victim, net.attacker
    victim_id = peer_id_of(victim)
    process = psutil.Process()
    rss_before = process.memory_info().rss
    stored_before = sum(size for _, _, size in _storage_entries(victim))
    expiration = get_dht_time() + 29
    big = [(f"flood/big/{i}", MSGPackSerializer.dumps(os.urandom(60_000)), expiration, None) for i in range(16)]
    assert attacker.store_many(victim_id, big) == [False] * len(big)
    accepted = 0
    for chunk in range(12):  # 12 x 50 records of 4 KB: 2.4 MB sent, more than twice the foreign budget
        records = [(f"flood/{chunk}/{i}", MSGPackSerializer.dumps(os.urandom(4000)), expiration, None)
                   for i in range(50)]
        result = attacker.store_many(victim_id, records)
        assert result is not None
        accepted += sum(result)
    rejected = net.rejected()
    assert rejected["record_too_large"] >= len(big)
    assert rejected["record_store_full"] >= 600 - accepted > 0
    stored = sum(size for _, _, size in _storage_entries(victim)) - stored_before
    assert stored <= 1 * _MIB, stored  # max_foreign_dht_bytes
    assert process.memory_info().rss - rss_before < 64 * _MIB  # generous: the flood alone was 3.4 MB
    assert net.received_from_honest("after the flood")
