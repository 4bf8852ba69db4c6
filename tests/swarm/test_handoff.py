"""Hand-off: ``HandoffStore``'s quotas and expiry (pure), then the put stream between real peers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from hivemind.p2p import PeerID

from protocol.codec import batch_id, encode_batch
from protocol.identity import Identity
from protocol.records import RolloutBatch
from swarm.core import PublishItem, SwarmCore
from swarm.handoff import HandoffStatus, HandoffStore
from swarm.transport import SwarmTransport
from tests.swarm.batches import make_batch
from tests.swarm.conftest import fast_settings, wait_for

S = HandoffStatus
MAX_BATCH = 1000


def store(**overrides: int) -> HandoffStore:
    limits = {"max_per_author_epoch": 2, "max_bytes_per_author_epoch": 250, "max_total_bytes": 400, "read_epochs": 2}
    limits.update(overrides)
    return HandoffStore(**limits)


def test_precheck_refuses_before_any_byte_is_sent() -> None:
    s = store()
    assert s.precheck("a" * 64, 100, MAX_BATCH) == S.GO
    assert s.precheck("a" * 64, MAX_BATCH + 1, MAX_BATCH) == S.TOO_LARGE
    assert s.precheck("a" * 64, 401, MAX_BATCH) == S.FULL  # more than the global cap
    assert s.add("a" * 64, b"x" * 100, "alice", epoch=10, current_epoch=10) == S.OK
    assert s.precheck("a" * 64, 100, MAX_BATCH) == S.HAVE  # already held: nothing is sent again
    assert s.precheck("b" * 64, 301, MAX_BATCH) == S.FULL  # 100 held + 301 > 400
    assert dict(s.refused) == {"too_large": 1, "full": 2}


def test_quota_per_author_and_epoch_in_batches_and_bytes() -> None:
    s = store(max_total_bytes=500)
    assert s.add("1" * 64, b"x" * 100, "alice", 10, 10) == S.OK
    assert s.add("2" * 64, b"x" * 100, "alice", 10, 10) == S.OK
    assert s.add("3" * 64, b"x" * 10, "alice", 10, 10) == S.QUOTA  # third batch of alice in epoch 10
    assert s.add("3" * 64, b"x" * 10, "alice", 9, 10) == S.OK  # another epoch has its own quota
    assert s.add("4" * 64, b"x" * 200, "bob", 10, 10) == S.OK
    assert s.add("5" * 64, b"x" * 60, "bob", 10, 10) == S.QUOTA  # 200 + 60 > 250 bytes for bob
    assert s.add("5" * 64, b"x" * 100, "carol", 10, 10) == S.FULL  # 410 + 100 > 500 over everyone
    assert (len(s), s.total_bytes, s.accepted) == (4, 100 + 100 + 10 + 200, 4)
    assert s.get("4" * 64) == b"x" * 200 and s.get("5" * 64) is None


def test_stale_and_future_epochs_are_refused_and_old_ones_expire() -> None:
    s = store()
    assert s.add("1" * 64, b"x", "alice", 8, 10) == S.STALE  # read_epochs 2: epochs 9 and 10 only
    assert s.add("2" * 64, b"x", "alice", 12, 10) == S.STALE  # more than one epoch ahead
    assert s.add("3" * 64, b"x" * 50, "alice", 9, 10) == S.OK
    assert s.add("4" * 64, b"x" * 70, "alice", 10, 10) == S.OK
    s.prune(current_epoch=11)  # epoch 9 leaves the window
    assert s.get("3" * 64) is None and s.get("4" * 64) is not None and s.total_bytes == 70
    s.prune(current_epoch=12)
    assert len(s) == 0 and s.total_bytes == 0
    assert s.add("5" * 64, b"x", "alice", 12, 12) == S.OK  # quotas of pruned epochs are gone too


# -- over real hivemind peers on 127.0.0.1 -----------------------------------------------------------

def _holder_peer(holder: SwarmTransport) -> PeerID:
    return PeerID.from_base58(holder.visible_multiaddrs()[0].rsplit("/", 1)[1])


def _put(sender: SwarmTransport, holder: SwarmTransport, bid: str, data: bytes) -> int | None:
    item = PublishItem(batch_id=bid, data=data, manifest_data=b"", key="", subkey="", expires_at=0.0)
    return sender._await_on_loop(lambda core: core._put_to(_holder_peer(holder), item))


def test_client_mode_batches_are_held_within_the_authors_quota(make_transport: Callable[..., SwarmTransport]) -> None:
    holder = make_transport(max_handoffs_per_author_epoch=1, epoch_seconds=600)
    client = make_transport(client_mode=True, initial_peers=holder.visible_multiaddrs(), handoff_copies=1,
                            epoch_seconds=600)
    reader = make_transport(initial_peers=holder.visible_multiaddrs(), epoch_seconds=600)
    assert wait_for(lambda: client.stats()["network_up"] and reader.stats()["network_up"])
    first = client.publish(make_batch(client.identity, text="one"))
    assert first is not None
    assert wait_for(lambda: holder.stats()["handoffs_held"] == 1, 30)
    # The batch names the holder first in its signed address list; the reader gets it.
    got: list[RolloutBatch] = []
    assert wait_for(lambda: bool(got.extend(reader.collect()) or got), 30), (client.stats(), reader.stats())
    assert got[0].address[0] == holder.visible_multiaddrs()[0]
    client.publish(make_batch(client.identity, text="two", index=1))
    assert wait_for(lambda: holder.stats()["handoffs_refused"] == 1, 30)  # a second one this epoch: over quota
    # The client counts the refusal once the holder's answer is back: after the holder counted it.
    assert wait_for(lambda: client.stats()["handoff_failed"] == 1, 30), client.stats()
    assert holder.stats()["handoffs_held"] == 1
    # A batch no holder took is not announced: nobody can pull it, and its author must not be taken for
    # unreachable (an offence) by readers that would try.
    assert wait_for(lambda: client.stats()["publish_failed"] == 1, 30), client.stats()
    assert client.stats()["batches_published"] == 1
    assert reader.stats()["batches_rejected"] == {} and reader.stats()["offences"] == {}


def test_copies_go_to_the_holders_at_once(make_transport: Callable[..., SwarmTransport]) -> None:
    """``handoff_copies`` holders receive a batch in parallel; the manifest goes out once one has it."""
    first = make_transport(epoch_seconds=600)
    second = make_transport(initial_peers=first.visible_multiaddrs(), epoch_seconds=600)
    peers = [*first.visible_multiaddrs(), *second.visible_multiaddrs()]
    client = make_transport(client_mode=True, initial_peers=peers, handoff_copies=2, epoch_seconds=600)
    assert wait_for(lambda: client.stats()["network_up"] and second.stats()["network_up"])
    assert client.publish(make_batch(client.identity)) is not None
    assert wait_for(lambda: first.stats()["handoffs_held"] == second.stats()["handoffs_held"] == 1, 30)
    assert wait_for(lambda: client.stats()["handoffs_sent"] == 2 and client.stats()["batches_published"] == 1, 30)
    # A holder takes the batch from its own copy; both holders lead the batch's signed address list.
    got: list[RolloutBatch] = []
    assert wait_for(lambda: bool(got.extend(second.collect()) or got), 30)
    assert set(got[0].address[:2]) == set(peers)


def test_invalid_or_oversized_handoffs_are_refused(make_transport: Callable[..., SwarmTransport]) -> None:
    holder = make_transport(max_handoff_bytes=10_000)
    sender = make_transport(initial_peers=holder.visible_multiaddrs())
    assert wait_for(lambda: sender.stats()["network_up"])
    assert _put(sender, holder, "0" * 64, b"not a batch") == HandoffStatus.INVALID  # hash does not match
    junk = b"\x00" * 100
    assert _put(sender, holder, batch_id(junk), junk) == HandoffStatus.INVALID  # not a signed batch
    big = b"\x00" * 20_000
    assert _put(sender, holder, batch_id(big), big) == HandoffStatus.FULL  # refused before it is sent
    data = encode_batch(replace(make_batch(sender.identity), swarm_id="another-swarm"), sender.identity)
    assert _put(sender, holder, batch_id(data), data) == HandoffStatus.INVALID
    assert holder.stats()["handoffs_held"] == 0 and holder.stats()["handoffs_refused"] == 4


def test_publishing_backs_off_to_how_long_a_batch_takes_to_go_out() -> None:
    """Behind a slow uplink a hand-off can take longer than the publish interval: the node is then told
    to publish no more often than that (fewer, larger batches) instead of queueing ever later ones."""
    transport = SwarmTransport(fast_settings(epoch_seconds=60.0), Identity.generate())
    assert transport.min_publish_interval() == 60.0 / 8  # never started: the quota's interval
    transport._shared.note_publish_seconds(4.0, weight=0.3)
    assert transport.min_publish_interval() == 60.0 / 8  # faster than the interval: no change
    transport._shared.note_publish_seconds(24.0, weight=0.3)
    assert transport.min_publish_interval() == 0.7 * 4.0 + 0.3 * 24.0 == 10.0


def test_a_client_counts_a_manifest_no_server_took_as_failed(make_transport: Callable[..., SwarmTransport]) -> None:
    """hivemind stores a record at the storing node too and calls that a success; a node in client mode is
    asked by nobody, so a store that reached no server must count as failed, not as published."""
    server = make_transport()
    client = make_transport(client_mode=True, nat_sharing="direct", initial_peers=server.visible_multiaddrs(),
                            publish_timeout=2.0)
    assert wait_for(lambda: client.stats()["network_up"])
    assert client.publish(make_batch(client.identity, text="seen")) is not None
    assert wait_for(lambda: client.stats()["batches_published"] == 1, 30), client.stats()
    server.close()
    assert client.publish(make_batch(client.identity, text="lost", index=1)) is not None
    assert wait_for(lambda: client.stats()["publish_failed"] == 1, 30), client.stats()
    assert client.stats()["batches_published"] == 1 and client.stats()["store_retries"] >= 1
    stored = client._await_on_loop(_stored_locally)
    assert stored == 0  # nothing kept where nobody looks


async def _stored_locally(core: SwarmCore) -> int:
    return len(list(core.dht.protocol.storage.items()))


def test_a_failed_manifest_store_is_tried_again(make_transport: Callable[..., SwarmTransport]) -> None:
    """A store whose replies were lost once is tried again within ``publish_timeout``; readers get it."""
    author = make_transport()
    reader = make_transport(initial_peers=author.visible_multiaddrs())
    assert wait_for(lambda: reader.stats()["network_up"])
    core = author._core
    assert core is not None
    real_store, calls = core.dht.store, []

    async def flaky_store(*args: object, **kwargs: object) -> bool:
        calls.append(kwargs)
        return False if len(calls) == 1 else await real_store(*args, **kwargs)

    core.dht.store = flaky_store  # type: ignore[method-assign]
    assert author.publish(make_batch(author.identity)) is not None
    assert wait_for(lambda: author.stats()["batches_published"] == 1, 30), author.stats()
    assert author.stats()["store_retries"] == 1 and author.stats()["publish_failed"] == 0 and len(calls) == 2
    assert all(call["exclude_self"] is False for call in calls)  # a server's own storage is asked by others
    got: list[RolloutBatch] = []
    assert wait_for(lambda: bool(got.extend(reader.collect()) or got), 30), reader.stats()
