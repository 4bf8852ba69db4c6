"""``SwarmHost`` and ``MemberTable``: the member table by hand, then a host between real peers on 127.0.0.1
(a public member, a member in client mode handing its batches to the host), its p2pd limits, the other
hosts' health, and a member that joins again through a peer it met when its host is gone."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

import psutil
import pytest

from protocol.identity import Identity
from protocol.records import Manifest
from swarm.host import HostLimits, SwarmHost
from swarm.members import MemberTable, behind_nat
from swarm.transport import SwarmTransport
from tests.swarm.batches import Publishing, make_batch, published_per_epoch, saved_pulled
from tests.swarm.conftest import fast_settings, free_port, p2pd_pid, wait_for

A = "/ip4/203.0.113.2/tcp/31337/p2p/12D3KooWSGJwbGPGkUnb1XsUSZox7jyoFP1HhmHPF5USADDTe8zk"
H = "/ip4/203.0.113.6/tcp/31337/p2p/12D3KooWJWoaqZhDaoEFshF7Rh1bpY9ohihFhzcW6d69Lr2NASuq"


def test_nat_is_read_from_where_a_batch_is_listed() -> None:
    assert not behind_nat([A, A.replace("/tcp/", "/udp/")])  # its own addresses only
    assert behind_nat([H, A])  # a holder's address first: handed off from behind NAT
    assert behind_nat([f"{H}/p2p-circuit/p2p/12D3KooWSGJwbGPGkUnb1XsUSZox7jyoFP1HhmHPF5USADDTe8zk"])
    assert not behind_nat([])


def _manifest(author: Identity, epoch: int, address: tuple[str, ...] = (A,), n: int = 0) -> Manifest:
    return Manifest(swarm_id="s", author=author.public_key, batch_id=f"{n:02x}" * 32, address=address, epoch=epoch,
                    seq=1, byte_size=10, n_groups=1, n_rollouts=1, created_at=1.0, expires_at=2.0)


def test_member_table_counts_each_batch_once_per_epoch_and_forgets_the_oldest() -> None:
    alice, bob, carol = Identity.generate(), Identity.generate(), Identity.generate()
    table = MemberTable(max_members=2, keep_epochs=3, since=0.0)
    table.manifest_seen(_manifest(alice, 10, n=1), now=100.0)
    table.manifest_seen(_manifest(alice, 10, n=1), now=100.5)  # the same batch read again: once
    table.manifest_seen(_manifest(alice, 10, n=2), now=101.0)
    table.batch_seen(f"{1:02x}" * 32, replace(make_batch(alice), epoch=10), now=102.0)
    table.batch_seen(f"{1:02x}" * 32, replace(make_batch(alice), epoch=10), now=102.5)  # verified again: once
    table.manifest_seen(_manifest(bob, 11, (H, A), n=3), now=103.0)
    table.batch_seen(f"{3:02x}" * 32, replace(make_batch(bob), epoch=11), now=104.0, handed_off=True)
    table.batch_seen(f"{3:02x}" * 32, replace(make_batch(bob), epoch=11), now=104.5)  # verified from the held copy
    rows = {r["peer_id"]: r for r in table.rows(current_epoch=11, epochs=2, epoch_seconds=60)}
    a, b = rows[alice.peer_id], rows[bob.peer_id]
    assert (a["announced"], a["pulled"], a["handed_off"], a["natted"]) == (2, 1, 0, False)
    assert a["epochs"] == [{"epoch": 11, "start": 660.0, "announced": 0, "pulled": 0, "handed_off": 0},
                           {"epoch": 10, "start": 600.0, "announced": 2, "pulled": 1, "handed_off": 0}]
    assert (a["model"], a["tokenizer"], a["protocol"]) == ("model-test", "tok-test", 1)
    # A batch handed to this node is verified from that copy: handed off, never pulled too.
    assert (b["announced"], b["pulled"], b["handed_off"], b["natted"], b["last_seen"]) == (1, 0, 1, True, 104.5)
    assert b["totals"] == {"announced": 1, "pulled": 0, "handed_off": 1}
    assert table.rows(11)[0]["peer_id"] == bob.peer_id  # the most recently seen first
    history = table.history(current_epoch=11, epochs=3, epoch_seconds=60)
    assert [(h["epoch"], h["start"], h["announced"], h["pulled"], h["handed_off"], h["members"]) for h in history] == [
        (9, 540.0, 0, 0, 0, 0), (10, 600.0, 2, 1, 0, 1), (11, 660.0, 1, 0, 1, 1)]
    table.manifest_seen(_manifest(carol, 11, n=4), now=105.0)  # a third member: alice, unseen longest, goes
    assert {r["peer_id"] for r in table.rows(11)} == {bob.peer_id, carol.peer_id}
    table.prune(current_epoch=14)  # epochs 10 and 11 leave the members' window, not the history
    assert all(r["announced"] == 0 for r in table.rows(14, epochs=8))
    assert table.rows(14)[0]["totals"]["announced"] == 1
    assert [h["announced"] for h in table.history(14, 5, 60)] == [0, 2, 0, 0, 0]  # alice's 2 (carol: pruned in 11 too)


def test_a_member_table_starts_at_its_first_epoch_and_tells_running_members_from_seen_ones() -> None:
    """A host's page starts where the host did, not ``history`` epochs before it; a member that stopped
    announcing stays, seen, not running. Mutations caught: a history of a fixed length (60 epochs back, before
    the host existed), ``since`` lost across a restart, and every member seen counted as running."""
    alice, bob = Identity.generate(), Identity.generate()
    table = MemberTable(since=10 * 60 + 30.0)  # made in epoch 10 (60-second epochs)
    table.manifest_seen(_manifest(alice, 10, n=1), now=631.0)
    table.manifest_seen(_manifest(bob, 11, n=2), now=670.0)
    assert [h["epoch"] for h in table.history(12, 60, 60)] == [10, 11, 12]
    assert [e["epoch"] for e in table.rows(12, 8, 60)[0]["epochs"]] == [12, 11, 10]
    assert {r["peer_id"]: r["running"] for r in table.rows(12, 4, 60)} == {alice.peer_id: True, bob.peer_id: True}
    assert {r["peer_id"]: r["running"] for r in table.rows(13, 4, 60)} == {alice.peer_id: False, bob.peer_id: True}
    again = MemberTable()
    again.load_json(json.loads(json.dumps(table.to_json())))
    assert again.since == table.since and [h["epoch"] for h in again.history(12, 60, 60)] == [10, 11, 12]


def test_member_table_is_kept_across_a_restart() -> None:
    alice = Identity.generate()
    table = MemberTable(keep_epochs=2, since=0.0)
    for n in range(3):
        table.manifest_seen(_manifest(alice, 10 + n, n=n), now=100.0 + n)
    table.batch_seen(f"{2:02x}" * 32, replace(make_batch(alice), epoch=12), now=103.0, handed_off=True)
    table.prune(current_epoch=12)
    saved = json.loads(json.dumps(table.to_json()))
    again = MemberTable(keep_epochs=2)
    again.load_json(saved)
    assert again.rows(12, 3, 60) == table.rows(12, 3, 60) and again.history(12, 4, 60) == table.history(12, 4, 60)
    again.batch_seen(f"{2:02x}" * 32, replace(make_batch(alice), epoch=12), now=104.0, handed_off=True)  # known: once
    assert again.rows(12)[0]["totals"] == {"announced": 3, "pulled": 0, "handed_off": 1}
    again.load_json({"version": 1, "members": [{"peer_id": "x"}], "history": {"a": [1], "5": [1, 2, 3, 4]}})
    assert len(again) == 0 and again.history(5, 1, 60)[0]["members"] == 4  # what does not parse is skipped


@pytest.fixture
def make_host() -> Iterator[Callable[..., SwarmHost]]:
    hosts: list[SwarmHost] = []

    def make(other_hosts: list[str] | None = None, **overrides: object) -> SwarmHost:
        settings = fast_settings(**{"host_maddrs": [f"/ip4/127.0.0.1/tcp/{free_port()}"], **overrides})
        host = SwarmHost(settings, Identity.generate(), other_hosts=other_hosts or [], health_every=1.0,
                         limits=HostLimits(max_connections=64, relay_circuits_per_peer=2))
        hosts.append(host)
        host.start()
        assert host.wait_until_listening(20)
        p2pd_pid(host.transport)
        return host

    yield make
    for host in hosts:
        host.close()


def test_a_host_sees_its_members_holds_nat_batches_and_checks_other_hosts(
        make_host: Callable[..., SwarmHost], make_transport: Callable[..., SwarmTransport]) -> None:
    other = make_host()
    dead = f"/ip4/127.0.0.1/tcp/{free_port()}/p2p/12D3KooWSGJwbGPGkUnb1XsUSZox7jyoFP1HhmHPF5USADDTe8zk"
    host = make_host(other_hosts=[other.transport.visible_multiaddrs()[0], dead],
                     initial_peers=other.transport.visible_multiaddrs(), epoch_seconds=600)
    boot = host.transport.visible_multiaddrs()
    public = make_transport(Identity.generate(), initial_peers=boot, epoch_seconds=600)
    natted = make_transport(Identity.generate(), initial_peers=boot, client_mode=True, handoff_copies=1,
                            epoch_seconds=600)
    cmdline = " ".join(psutil.Process(host.transport.p2pd_pid()).cmdline())
    assert "-connHi=64" in cmdline and "-relayMaxCircuits=2" in cmdline and "-relayService=1" in cmdline
    # The NATed member hands each batch to one of the DHT servers it reached, in turn by sequence number: once it
    # knows both the host and the public member, three batches in a row go to both (2 and 1, in some order).
    servers = {boot[0].rsplit("/p2p/", 1)[1], p2p_id(public)}
    assert wait_for(lambda: servers <= set(natted.network_status().neighbours)
                    and servers <= {m.rsplit("/p2p/", 1)[1] for m in natted.remembered_maddrs()}, timeout=30), \
        (natted.network_status(), natted.remembered_maddrs())
    for k, node in enumerate((public, natted)):
        for i in range(3):  # distinct content: a copy of another author's groups would be a duplicate
            assert node.publish(make_batch(node.identity, index=10 * k + i)) is not None
            time.sleep(0.3)

    def seen() -> dict[str, dict[str, object]]:
        return {row["peer_id"]: row for row in host.snapshot()["members"]}

    assert wait_for(lambda: public.identity.peer_id in seen() and natted.identity.peer_id in seen()
                    and seen()[natted.identity.peer_id]["announced"] == 3
                    and seen()[natted.identity.peer_id]["pulled"] + seen()[natted.identity.peer_id]["handed_off"] == 3
                    and seen()[public.identity.peer_id]["pulled"] == 3, timeout=30), seen()
    rows = seen()
    p, n = rows[public.identity.peer_id], rows[natted.identity.peer_id]
    assert (p["natted"], n["natted"]) == (False, True)
    # Each batch once: the NATed member handed its batches to the host and to the public member in turn (both
    # DHT servers it reached); the host verified those it holds from its copy and pulled the others.
    assert (p["announced"], p["pulled"], p["handed_off"], n["announced"]) == (3, 3, 0, 3)
    held_here = host.snapshot()["counters"]["handoffs_held"]
    assert n["handed_off"] == held_here >= 1 and n["pulled"] == public.stats()["handoffs_held"] >= 1
    assert (p["model"], p["tokenizer"], p["protocol"]) == ("model-test", "tok-test", 1)
    snap = host.snapshot()
    assert not snap["counters"]["offences"]
    assert wait_for(lambda: all(h["ok"] is not None for h in host.snapshot()["hosts"]), timeout=20)
    health = {h["address"]: h for h in host.snapshot()["hosts"]}
    assert health[other.transport.visible_multiaddrs()[0]]["ok"] is True and health[dead]["ok"] is False
    # The peers a member reached at an address: what it remembers in its run dir (the host; never the NATed one).
    host_id = host.transport.visible_multiaddrs()[0].rsplit("/p2p/", 1)[1]
    assert any(addr.endswith(host_id) for addr in public.remembered_maddrs()), public.remembered_maddrs()
    assert not any(addr.endswith(p2p_id(natted)) for t in (public, natted) for addr in t.remembered_maddrs())
    # Connected: members answer it (two members and the other host have connections open; only servers are
    # DHT neighbours), refreshed every few seconds.
    assert wait_for(lambda: host.snapshot()["network"]["connections"] >= 3, timeout=15), host.snapshot()["network"]
    assert host.snapshot()["network"]["connected"]


def p2p_id(transport: SwarmTransport) -> str:
    return transport._call_on_loop(lambda core: core.p2p.peer_id.to_base58())


def test_a_member_joins_again_through_a_peer_it_met_when_its_host_is_gone(
        make_host: Callable[..., SwarmHost], make_transport: Callable[..., SwarmTransport]) -> None:
    host = make_host()
    boot = host.transport.visible_multiaddrs()
    b = make_transport(initial_peers=boot)
    met = b.visible_multiaddrs()  # as another member remembers it (its known_peers.txt)
    host.close()
    # A restarted member whose only initial peer (the host) is down: alone, until it dials the peer it met.
    c = make_transport(initial_peers=boot, wait=False)
    time.sleep(2)
    assert not c.network_status().connected
    c.add_bootstrap_peers(met)
    assert wait_for(lambda: c.network_status().connected, timeout=20), c.network_status()
    assert b.visible_multiaddrs()[0].rsplit("/", 1)[1] in c.network_status().neighbours


def test_a_restarted_host_keeps_its_peer_id_address_and_member_table(tmp_path, make_transport) -> None:
    settings = fast_settings(host_maddrs=[f"/ip4/127.0.0.1/tcp/{free_port()}"], p2p_identity_path=str(tmp_path / "p2p.key"),
                             epoch_seconds=600)
    state = tmp_path / "members.json"
    first = SwarmHost(settings, Identity.generate(), other_hosts=[], state_path=state)
    first.start()
    try:
        address = first.wait_until_listening(20)
        member = make_transport(initial_peers=address, epoch_seconds=600)
        assert wait_for(lambda: member.network_status().connected, timeout=20)
        assert member.publish(make_batch(member.identity)) is not None
        assert wait_for(lambda: [m["pulled"] for m in first.snapshot()["members"]] == [1], timeout=20)
        before = first.snapshot()
    finally:
        first.close()
    assert json.loads(state.read_text())["members"][0]["peer_id"] == member.identity.peer_id
    again = SwarmHost(settings, Identity.generate(), other_hosts=[], state_path=state)
    again.start()
    try:
        assert again.wait_until_listening(20) == address
        host_id = address[0].rsplit("/", 1)[1]
        assert wait_for(lambda: host_id in member.network_status().neighbours, timeout=30)  # the member is back
        # What the page showed before the restart is still there, each batch still counted once.
        time.sleep(1)
        after = again.snapshot()
        assert after["members"][0]["totals"] == before["members"][0]["totals"] == \
            {"announced": 1, "pulled": 1, "handed_off": 0}
        # summed over the epochs shown: a 600 s epoch of the wall clock may end between the publish and this read
        assert sum(row["announced"] for row in after["history"]) == 1
    finally:
        again.close()


def test_a_host_that_died_mid_epoch_counts_what_its_members_published(tmp_path, make_transport) -> None:  # noqa: ANN001
    """A host whose process stops without a word (its network side gone, nothing saved at the end: what ``kill -9``
    leaves) while two members publish, down until its poll no longer reads the epoch it died in, then started again
    on its file: its totals and its history per epoch equal what the members published, the epoch of its death and those it was away included.
    (tests/node/test_host.py does it with ``kill -9`` on a ``swarm-node host`` process, in the slow suite.)
    Mutations caught: the table saved only when an epoch ends (the file never holds the epoch in progress), and no
    census of the epochs missed (those show fewer batches than were published)."""
    epoch = 3.0
    settings = fast_settings(host_maddrs=[f"/ip4/127.0.0.1/tcp/{free_port()}"], p2p_identity_path=str(tmp_path / "p2p.key"),
                             epoch_seconds=epoch)
    state = tmp_path / "members.json"
    first = SwarmHost(settings, Identity.generate(), other_hosts=[], state_path=state, save_every=0.5)
    first.start()
    address = first.wait_until_listening(20)
    members = [make_transport(initial_peers=address, epoch_seconds=epoch, trace_path=str(tmp_path / f"m{i}.trace"))
               for i in range(2)]
    publishing = Publishing(members, every=1.0)
    again: SwarmHost | None = None
    try:
        assert wait_for(lambda: saved_pulled(state, int(time.time() // epoch)) > 0 and (time.time() / epoch) % 1 < 0.7,
                        timeout=6 * epoch)
        died = int(time.time() // epoch)
        first._stop.set()  # dies: its thread and network side stop, nothing more is saved
        assert first._thread is not None
        first._thread.join(timeout=10)
        first.transport.close()
        kept = saved_pulled(state, died)
        # the members go on publishing to each other until the host's poll (the current epoch and the one before)
        # no longer reads the epoch it died in: only the census can count what that epoch's rest announced (a fixed
        # 1.5 epochs let a host that restarted quickly poll it, and the census found nothing new)
        time.sleep(max(0.0, (died + settings.read_epochs + 0.1) * epoch - time.time()))
        again = SwarmHost(settings, Identity.generate(), other_hosts=[], state_path=state, save_every=0.5)
        again.start()
        assert again.wait_until_listening(20) == address
        assert wait_for(lambda: all(m.network_status().initial_back is not None for m in members), timeout=10)
        time.sleep(epoch)
        publishing.stop()
        host = again

        def announced() -> dict[str, int]:
            return {m["peer_id"]: m["totals"]["announced"] for m in host.snapshot()["members"]}

        published = {m.identity.peer_id: m.stats()["batches_published"] for m in members}
        assert wait_for(lambda: announced() == published, timeout=4 * epoch), (announced(), published)
        per_epoch = published_per_epoch([tmp_path / f"m{i}.trace" for i in range(2)], epoch)
        history = {h["epoch"]: h for h in host.snapshot(history=60)["history"]}
        assert {e: h["announced"] for e, h in history.items() if h["announced"]} == per_epoch
        assert per_epoch.get(died) and per_epoch.get(died + 1), (died, per_epoch)
        assert history[died]["pulled"] >= kept > 0 and host.snapshot()["counters"]["census_new"] > 0
    finally:
        publishing.stop()
        first.close()  # idempotent: its p2pd must not outlive a failure above
        if again is not None:
            again.close()
