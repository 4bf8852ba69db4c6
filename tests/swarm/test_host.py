"""``SwarmHost`` and ``MemberTable``: the member table by hand, then a host between real peers on 127.0.0.1
(a public member, a member in client mode handing its batches to the host), its p2pd limits, the other
hosts' health, and a member that joins again through a peer it met when its host is gone."""

from __future__ import annotations

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
from tests.swarm.batches import make_batch
from tests.swarm.conftest import fast_settings, free_port, p2pd_pid, wait_for

A = "/ip4/203.0.113.2/tcp/31337/p2p/12D3KooWSGJwbGPGkUnb1XsUSZox7jyoFP1HhmHPF5USADDTe8zk"
H = "/ip4/203.0.113.6/tcp/31337/p2p/12D3KooWJWoaqZhDaoEFshF7Rh1bpY9ohihFhzcW6d69Lr2NASuq"


def test_nat_is_read_from_where_a_batch_is_listed() -> None:
    assert not behind_nat([A, A.replace("/tcp/", "/udp/")])  # its own addresses only
    assert behind_nat([H, A])  # a holder's address first: handed off from behind NAT
    assert behind_nat([f"{H}/p2p-circuit/p2p/12D3KooWSGJwbGPGkUnb1XsUSZox7jyoFP1HhmHPF5USADDTe8zk"])
    assert not behind_nat([])


def _manifest(author: Identity, epoch: int, address: tuple[str, ...] = (A,)) -> Manifest:
    return Manifest(swarm_id="s", author=author.public_key, batch_id=bytes(32).hex(), address=address, epoch=epoch,
                    seq=1, byte_size=10, n_groups=1, n_rollouts=1, created_at=1.0, expires_at=2.0)


def test_member_table_counts_per_epoch_and_forgets_the_oldest() -> None:
    alice, bob, carol = Identity.generate(), Identity.generate(), Identity.generate()
    table = MemberTable(max_members=2, keep_epochs=3)
    table.manifest_seen(_manifest(alice, 10), now=100.0)
    table.manifest_seen(_manifest(alice, 10), now=101.0)
    table.batch_seen(replace(make_batch(alice), epoch=10), now=102.0)
    table.manifest_seen(_manifest(bob, 11, (H, A)), now=103.0)
    table.batch_seen(replace(make_batch(bob), epoch=11), now=104.0, handed_off=True)
    rows = {r["peer_id"]: r for r in table.rows(current_epoch=11, epochs=2)}
    a, b = rows[alice.peer_id], rows[bob.peer_id]
    assert (a["announced"], a["pulled"], a["handed_off"], a["natted"]) == (2, 1, 0, False)
    assert a["epochs"] == [{"epoch": 11, "announced": 0, "pulled": 0, "handed_off": 0},
                           {"epoch": 10, "announced": 2, "pulled": 1, "handed_off": 0}]
    assert (a["model"], a["tokenizer"], a["protocol"]) == ("model-test", "tok-test", 1)
    assert (b["announced"], b["handed_off"], b["natted"], b["last_seen"]) == (1, 1, True, 104.0)
    assert table.rows(11)[0]["peer_id"] == bob.peer_id  # the most recently seen first
    table.manifest_seen(_manifest(carol, 11), now=105.0)  # a third member: alice, unseen longest, goes
    assert {r["peer_id"] for r in table.rows(11)} == {bob.peer_id, carol.peer_id}
    table.prune(current_epoch=14)
    assert all(r["announced"] == 0 for r in table.rows(14, epochs=8))


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
    for k, node in enumerate((public, natted)):
        for i in range(3):  # distinct content: a copy of another author's groups would be a duplicate
            assert node.publish(make_batch(node.identity, index=10 * k + i)) is not None
            time.sleep(0.3)

    def seen() -> dict[str, dict[str, object]]:
        return {row["peer_id"]: row for row in host.snapshot()["members"]}

    assert wait_for(lambda: public.identity.peer_id in seen() and natted.identity.peer_id in seen()
                    and seen()[natted.identity.peer_id]["handed_off"] == 3 == seen()[natted.identity.peer_id]["pulled"]
                    and seen()[public.identity.peer_id]["pulled"] == 3, timeout=30), seen()
    rows = seen()
    p, n = rows[public.identity.peer_id], rows[natted.identity.peer_id]
    assert (p["natted"], n["natted"]) == (False, True)
    assert (p["announced"], p["handed_off"], n["announced"], n["pulled"]) == (3, 0, 3, 3)
    assert (p["model"], p["tokenizer"], p["protocol"]) == ("model-test", "tok-test", 1)
    snap = host.snapshot()
    assert snap["counters"]["handoffs_held"] == 3 and not snap["counters"]["offences"]
    assert wait_for(lambda: all(h["ok"] is not None for h in host.snapshot()["hosts"]), timeout=20)
    health = {h["address"]: h for h in host.snapshot()["hosts"]}
    assert health[other.transport.visible_multiaddrs()[0]]["ok"] is True and health[dead]["ok"] is False
    # The members' neighbours as p2pd lists them: what a member remembers in its run dir.
    assert any(addr.endswith(host.transport.visible_multiaddrs()[0].rsplit("/p2p/", 1)[1])
               for addr in public.neighbour_maddrs())


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


def test_a_restarted_host_keeps_its_peer_id_and_address(tmp_path, make_transport) -> None:
    settings = fast_settings(host_maddrs=[f"/ip4/127.0.0.1/tcp/{free_port()}"], p2p_identity_path=str(tmp_path / "p2p.key"))
    first = SwarmHost(settings, Identity.generate(), other_hosts=[])
    first.start()
    try:
        address = first.wait_until_listening(20)
        member = make_transport(initial_peers=address)
        assert wait_for(lambda: member.network_status().connected, timeout=20)
    finally:
        first.close()
    again = SwarmHost(settings, Identity.generate(), other_hosts=[])
    again.start()
    try:
        assert again.wait_until_listening(20) == address
        host_id = address[0].rsplit("/", 1)[1]
        assert wait_for(lambda: host_id in member.network_status().neighbours, timeout=30)  # the member is back
    finally:
        again.close()
