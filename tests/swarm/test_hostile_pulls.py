"""Hostile manifests and batch servers against a running node (attacks 4, 5, 7 and 10).

A raw hivemind peer (``tests.swarm.attacker``) files validly signed manifests under identities of its own
and answers the batch protocol with a raw handler that serves, lies or stalls. Each test checks the
victim's counters, that an honest node's batches still arrive, and that nothing of the attacker's
reaches the inbox (so nothing of it can be trained on).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import gc
import tracemalloc
from collections.abc import Iterator

import psutil
import pytest
from hivemind.utils import get_dht_time

from protocol.codec import (
    batch_id,
    batch_payload_size,
    decode_batch,
    encode_batch,
    encode_manifest,
    make_manifest,
)
from protocol.identity import Identity
from protocol.samples import expanding_batch, realistic_batch
from swarm.core import PublishItem, decoded_cost
from swarm.keys import manifest_key, manifest_subkey, shard_of
from tests.swarm.attacker import wait_until
from tests.swarm.batches import make_batch
from tests.swarm.conftest import SWARM_ID
from tests.swarm.hostile_net import HostileNet, hostile_net

_MIB = 1024 * 1024
SETTINGS = {
    "epoch_seconds": 600.0,  # one epoch for the whole module: quotas do not reset under a test
    "request_timeout": 1.5,
    "pull_timeout": 2.0,
    "max_concurrent_pulls": 4,
    "max_pulls_per_author": 1,
    "ban_seconds": 120.0,
    "max_batch_payload_bytes": 4 * _MIB,
    "max_payload_bytes_per_peer_epoch": 6 * _MIB,
    "max_inbox_bytes": 80 * _MIB,
    "max_batches_per_epoch": 60,  # newcomers together: 30
}


Net = HostileNet


@pytest.fixture(scope="module")
def net() -> Iterator[Net]:
    with hostile_net(SETTINGS, established=True) as built:
        yield built


def test_decoded_size_is_estimated_before_decoding() -> None:
    """``decoded_cost`` bounds what decoding really allocates (realistic batches: random ids, floats).

    First in the module: tracemalloc counts every thread, and the network's must not be running yet.
    """
    author = Identity.generate()
    for n_tokens in (1, 8, 1400):  # 1400 tokens: a payload past 1 MiB
        data = encode_batch(dataclasses.replace(realistic_batch(author.public_key, n_tokens=n_tokens),
                                                author=author.public_key), author)
        payload = batch_payload_size(data)
        gc.collect()
        tracemalloc.start()
        batch = decode_batch(data)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert batch.n_rollouts == 64
        assert peak < decoded_cost(payload), (n_tokens, peak, payload)


def test_front_running_a_batch_id_does_not_block_the_genuine_batch(net: Net) -> None:
    """Attack 4: manifests copying a fresh batch id -- one oversized, one served with other bytes."""
    victim, honest, attacker = net.victim, net.honest, net.attacker
    epoch, now = victim.current_epoch(), get_dht_time()
    # The honest node's next sequence number, taken from it: the DHT refuses a manifest in a subkey slot
    # (seq % 8) whose earlier manifest expires later, and the honest node's sequence starts at a
    # time-based number, so a fixed slot collided with its first batch one run in eight.
    with honest._lifecycle:
        honest._seq += 1
        seq = honest._seq
    genuine = dataclasses.replace(make_batch(honest.identity, text="genuine"), epoch=epoch, seq=seq,
                                  address=tuple(honest.visible_multiaddrs()), created_at=now, swarm_id=SWARM_ID)
    data = encode_batch(genuine, honest.identity)
    bid = batch_id(data)
    first, second = Identity.generate(), Identity.generate()
    before = net.rejected()
    net.file([attacker.manifest_record(first, make_batch(first), epoch=epoch, batch_id=bid, byte_size=64 * _MIB)])
    assert wait_until(lambda: net.rejected().get("too_large", 0) == before.get("too_large", 0) + 1)
    net.file([attacker.manifest_record(second, make_batch(second), epoch=epoch, batch_id=bid)])
    assert wait_until(lambda: net.rejected().get("hash_mismatch", 0) == before.get("hash_mismatch", 0) + 1)
    # Only now does the genuine manifest appear: the id must not have become known.
    manifest = make_manifest(genuine, data, expires_at=now + 120)
    item = PublishItem(bid, data, encode_manifest(manifest, honest.identity),
                       manifest_key(SWARM_ID, epoch, shard_of(honest.identity.peer_id)),
                       manifest_subkey(honest.identity.peer_id, genuine.seq), manifest.expires_at)
    honest._call_on_loop(lambda core: core.enqueue_publish(item))
    assert net.wait_for_text("genuine"), (victim.stats(), honest.stats())
    banned = victim.stats()["peers_banned"]
    assert isinstance(banned, int) and banned >= 2
    assert net.offences().get("too_large", 0) >= 1 and net.offences().get("hash_mismatch", 0) >= 1


def test_stalling_addresses_cannot_hold_every_pull_slot(net: Net) -> None:
    """Attack 5: manifests of fresh identities whose address takes the stream and never answers."""
    victim, attacker = net.victim, net.attacker
    epoch = victim.current_epoch()
    stallers = [Identity.generate() for _ in range(6)]
    before = net.rejected().get("stalled", 0)
    attacker.mode = "stall"
    try:
        net.file([attacker.manifest_record(s, dataclasses.replace(make_batch(s), seq=k), epoch=epoch)
                  for s in stallers for k in range(2)])
        assert wait_until(lambda: attacker.requests > 0, timeout=5)
        # An established peer's batch goes through while the stallers hold what newcomers may use.
        assert net.received_from_honest("despite the stallers", timeout=6.0)
        # Each staller is banned after its first stall (pull_timeout bounds it); its second is not pulled.
        assert wait_until(lambda: net.rejected().get("stalled", 0) - before >= len(stallers), timeout=15)
    finally:
        attacker.mode = "serve"
    stats = victim.stats()
    assert net.offences()["stalled"] >= len(stallers)
    assert isinstance(stats["pulls_stalled"], int) and stats["pulls_stalled"] >= len(stallers)
    # Six stalls, not twelve: each staller's second manifest is refused, its author banned.
    assert wait_until(lambda: net.rejected().get("banned", 0) >= len(stallers))
    assert net.rejected().get("stalled", 0) - before == len(stallers)


def _release_freed_memory() -> None:
    """Collect garbage and hand freed heap pages back to the system (glibc), so RSS shows what is live."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def test_batches_that_expand_hugely_are_refused_before_decoding(net: Net) -> None:
    """Attack 7: a few KB that expand to 30 MiB each, and many that expand just under the cap."""
    victim, attacker = net.victim, net.attacker
    epoch = victim.current_epoch()
    process = psutil.Process()
    _release_freed_memory()
    rss_before = process.memory_info().rss
    before = net.rejected()
    bombs, mallory = [], Identity.generate()
    for seq in range(4):
        bombs.append((mallory, seq, expanding_batch(mallory, 30 * _MIB, epoch=epoch, seq=seq)))
    hoarder = Identity.generate()  # under the 4 MiB cap each: the per-author payload quota (6 MiB) bounds it
    for seq in range(6):
        bombs.append((hoarder, seq, expanding_batch(hoarder, 3 * _MIB, epoch=epoch, seq=seq)))
    records = []
    for author, seq, data in bombs:
        batch = dataclasses.replace(make_batch(author), seq=seq)
        records.append(attacker.manifest_record(author, batch, data=data, epoch=epoch))
    net.file(records)
    assert wait_until(lambda: net.rejected().get("payload_too_large", 0) - before.get("payload_too_large", 0) >= 4)
    assert wait_until(lambda: net.rejected().get("quota_payload", 0) - before.get("quota_payload", 0) >= 4)
    stats = victim.stats()
    assert isinstance(stats["inbox_bytes"], int) and stats["inbox_bytes"] <= SETTINGS["max_inbox_bytes"]
    hoarded = victim.collect()  # two decoded batches of the hoarder (valid, if useless) at most
    assert all(b.author == hoarder.public_key for b in hoarded) and len(hoarded) <= 2
    del hoarded, bombs, records
    _release_freed_memory()
    # Unbounded, the four bombs alone would be 4 x 30 MiB of payload, several times that as objects. The
    # margin allows for what a process already 1 GiB large after the rest of the suite keeps from malloc.
    assert process.memory_info().rss - rss_before < 160 * _MIB
    assert not any(r in net.offences() for r in ("payload_too_large", "quota_payload"))  # limits, not lies
    assert net.received_from_honest("after the bombs")


def test_resigned_copies_of_another_peers_groups_are_dropped(net: Net) -> None:
    """Attack 10 (content): the honest node's groups re-signed under a fresh key, alone or mixed in."""
    victim, honest, attacker = net.victim, net.honest, net.attacker
    original = make_batch(honest.identity, text="original content", index=77)
    honest.publish(original)
    assert net.wait_for_text("original content")
    copier = Identity.generate()
    epoch = victim.current_epoch()
    copy = dataclasses.replace(original, author=copier.public_key, seq=1)
    fresh = make_batch(copier, text="fresh", index=78)
    mixed = dataclasses.replace(copy, seq=2, groups=(*original.groups, *fresh.groups))
    before = net.rejected().get("duplicate_content", 0)
    dup_groups = victim.stats()["duplicate_groups"]
    net.file([attacker.manifest_record(copier, copy, epoch=epoch)])
    assert wait_until(lambda: net.rejected().get("duplicate_content", 0) == before + 1)
    net.file([attacker.manifest_record(copier, mixed, epoch=epoch)])
    assert wait_until(lambda: victim.stats()["inbox"] == 1)
    (got,) = victim.collect()
    assert got.author == copier.public_key and got.groups == fresh.groups  # only what is new
    assert victim.stats()["duplicate_groups"] == dup_groups + len(original.groups)
    assert "duplicate_content" not in net.offences()


def test_a_sybil_flood_is_bounded_by_the_global_quota(net: Net) -> None:
    """Attack 10 (identities): 40 fresh identities with one valid batch each; identities are free."""
    victim, attacker = net.victim, net.attacker
    epoch = victim.current_epoch()
    before = net.rejected().get("quota_global", 0)
    accepted_before = victim.stats()["batches_accepted"]
    sybils = [Identity.generate() for _ in range(40)]
    records = [attacker.manifest_record(s, make_batch(s, text=f"sybil {i}", index=100 + i), epoch=epoch)
               for i, s in enumerate(sybils)]
    for start in range(0, len(records), 10):
        net.file(records[start : start + 10])
    assert wait_until(lambda: net.rejected().get("quota_global", 0) - before >= 10)
    # The established author keeps its share. Sybil pulls still in flight may land meanwhile.
    honest, sybil_keys, got = net.honest.identity.public_key, {s.public_key for s in sybils}, []
    net.honest.publish(make_batch(net.honest.identity, text="after the sybils"))

    def honest_arrived() -> bool:
        for batch in victim.collect():
            assert batch.author in sybil_keys | {honest}, "a batch of another author got through"
            if batch.author == honest:
                got.extend(r.completion for g in batch.groups for r in g.rollouts)
        return "after the sybils" in got

    assert wait_until(honest_arrived, timeout=15.0)
    accepted = victim.stats()["batches_accepted"]
    assert isinstance(accepted, int) and isinstance(accepted_before, int)
    assert accepted - accepted_before <= 30 + 1  # the newcomers' half of the global quota at most, + the honest one
    assert isinstance(victim.stats()["peers_seen"], int)
