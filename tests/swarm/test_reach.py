"""A swarm that needs no host to talk, on 127.0.0.1 with real peers: ``client_mode: auto`` members become full
members once a peer dials them back, a member in client mode hands its batches to them as well as to the
host, and the exchange goes on when the host is gone; a member that lost every peer says so, and is back
within a quarter epoch of a host's return. (The same with NAT, in network namespaces: test_netns_host.py.)"""

from __future__ import annotations

import time
from collections.abc import Callable

from protocol.identity import Identity
from swarm.addresses import AddressBook, met_addresses, useful_addresses
from swarm.core.reach import listen_ports, remote_ip
from swarm.host import SwarmHost
from swarm.settings import SwarmSettings
from swarm.transport import SwarmTransport
from tests.swarm.batches import make_batch
from tests.swarm.conftest import fast_settings, free_port, wait_for

P = "12D3KooWSGJwbGPGkUnb1XsUSZox7jyoFP1HhmHPF5USADDTe8zk"
Q = "12D3KooWJWoaqZhDaoEFshF7Rh1bpY9ohihFhzcW6d69Lr2NASuq"


def test_the_address_book_keeps_peers_that_answered_and_rotates_holders() -> None:
    book = AddressBook(max_peers=2)
    book.confirmed([f"/ip4/127.0.0.1/tcp/1/p2p/{P}", f"/ip4/203.0.113.2/tcp/1/p2p/{P}"], now=10.0)
    # What it was met at, in the order given (the caller knows which address answered): loopback kept.
    assert book.maddrs(P) == [f"/ip4/127.0.0.1/tcp/1/p2p/{P}", f"/ip4/203.0.113.2/tcp/1/p2p/{P}"]
    book.confirmed([f"/ip4/127.0.0.1/tcp/1/p2p/{P}/p2p-circuit/p2p/{Q}"], now=10.0)
    assert Q not in book.live()  # never a relayed address
    book.confirmed([f"/ip4/203.0.113.3/tcp/1/p2p/{Q}"], now=11.0)
    assert book.live() == [Q, P]
    assert [book.holders({P, Q}, 1, seq) for seq in (0, 1)] == [book.maddrs(Q), book.maddrs(P)]
    assert book.holders({P}, 2, 0) == book.maddrs(P)  # DHT servers only
    book.failed(Q, now=12.0)
    assert book.live() == [P] and book.holders({P, Q}, 2, 0) == book.maddrs(P)
    assert book.remembered() == [*book.maddrs(P), *book.maddrs(Q)]  # the failed one last, not forgotten
    book.confirmed(["/ip4/203.0.113.4/tcp/1/p2p/12D3KooWRemote"], now=13.0)  # a third: the oldest goes
    assert P not in book.live() and len(book) == 2
    assert useful_addresses([f"/ip4/1.2.3.4/tcp/1/p2p/{P}/p2p-circuit/p2p/{Q}"]) == []


def test_of_the_addresses_dialed_the_one_the_connection_goes_to_is_kept() -> None:
    lo, lan, name = "/ip4/127.0.0.1/tcp/4001", "/ip4/192.0.2.7/tcp/4001", "/dns4/member.example.org/tcp/4002"
    assert met_addresses([lan, lo], [lo]) == [lo]  # met on loopback: remembered there, not at the other interface
    assert met_addresses([lan, lo], [lan]) == [lan]
    assert met_addresses([name, lo], ["/ip4/198.51.100.3/tcp/4002"]) == [name]  # a DNS name resolved: same port
    assert met_addresses([lan, lo], []) == [lan]  # nothing known: what is worth dialing from elsewhere


def test_what_a_reachability_check_dials() -> None:
    assert remote_ip("/ip4/203.0.113.9/tcp/40123") == ("ip4", "203.0.113.9")
    assert remote_ip("/ip6/::1/tcp/40123") == ("ip6", "::1")
    assert remote_ip(f"/ip4/203.0.113.9/tcp/1/p2p/{P}/p2p-circuit") is None  # relayed: not dialable
    assert listen_ports(["/ip4/0.0.0.0/tcp/31337", "/ip4/10.0.0.2/tcp/31337/p2p/x", "/ip4/1.2.3.4/udp/9",
                         "/ip4/1.2.3.4/tcp/0", "/ip6/::/tcp/4001"]) == [31337, 4001]
    auto = {"client_mode": "auto"}
    assert not SwarmSettings.model_validate(auto).starts_as_client  # the first node: others must reach it
    assert SwarmSettings.model_validate({**auto, "initial_peers": [f"/ip4/127.0.0.1/tcp/1/p2p/{P}"]}).starts_as_client
    assert SwarmSettings(epoch_seconds=60, join_retry_max_seconds=120).retry_cap == 15


def _host(**overrides: object) -> SwarmHost:
    settings = fast_settings(**{"host_maddrs": [f"/ip4/127.0.0.1/tcp/{free_port()}"], **overrides})
    host = SwarmHost(settings, Identity.generate(), other_hosts=[])
    host.start()
    assert host.wait_until_listening(20)
    return host


def _p2p_id(transport: SwarmTransport) -> str:
    return transport._call_on_loop(lambda core: core.p2p.peer_id.to_base58())


def test_auto_members_become_full_members_and_the_swarm_outlives_its_host(
        make_transport: Callable[..., SwarmTransport]) -> None:
    host = _host(epoch_seconds=600)
    try:
        boot = host.transport.visible_multiaddrs()
        a = make_transport(initial_peers=boot, client_mode="auto", epoch_seconds=600)
        b = make_transport(initial_peers=boot, client_mode="auto", epoch_seconds=600)
        natted = make_transport(initial_peers=boot, client_mode=True, handoff_copies=1, epoch_seconds=600)
        for member in (a, b):
            assert wait_for(lambda m=member: m.network_status().reach.startswith("reachable at /ip4/127.0.0.1/tcp/"),
                            timeout=30), member.network_status()
            assert not member.network_status().client and member.visible_multiaddrs()[0].startswith("/ip4/127.0.0.1/")
        ids = {_p2p_id(t): t for t in (a, b)}
        # Full members now: DHT servers the others (the NATed member too) have as neighbours.
        assert wait_for(lambda: set(ids) <= set(natted.network_status().neighbours), timeout=30), \
            natted.network_status()
        assert wait_for(lambda: _p2p_id(b) in a.network_status().neighbours, timeout=30)
        assert natted.network_status().client and _p2p_id(natted) not in a.network_status().neighbours
        # The NATed member knows where the full members listen: its own connections to them, and their batches.
        assert wait_for(lambda: {m.rsplit("/p2p/", 1)[1] for m in natted.remembered_maddrs()} >= set(ids), timeout=15)
    finally:
        host.close()
    gone = time.time()
    # The host is gone: the NATed member hands its batches to the full members, and everyone gets everyone's.
    assert wait_for(lambda: not any(p not in ids for p in natted.network_status().neighbours), 30)
    sent = [natted.publish(make_batch(natted.identity, index=i)) for i in range(4)]
    sent += [a.publish(make_batch(a.identity, index=10 + i)) for i in range(2)]
    assert all(sent)
    got: dict[str, list[int]] = {"a": [], "b": [], "n": []}

    def arrived() -> bool:
        for name, t in (("a", a), ("b", b), ("n", natted)):
            got[name] += [batch.groups[0].task.index for batch in t.collect()]
        return sorted(got["b"]) == [0, 1000, 2000, 3000, 10000, 11000] and sorted(got["n"]) == [10000, 11000] \
            and len(got["a"]) == 4

    assert wait_for(arrived, timeout=60), (got, natted.stats(), a.stats(), b.stats())
    assert a.stats()["handoffs_held"] + b.stats()["handoffs_held"] >= 4 and natted.stats()["handoff_failed"] == 0
    assert time.time() - gone < 60
    # What the NATed member remembers: the full members and the host, never itself.
    remembered = natted.remembered_maddrs()
    assert {m.rsplit("/p2p/", 1)[1] for m in remembered} >= set(ids)


def test_a_peer_is_remembered_at_the_address_it_was_met_at(make_transport: Callable[..., SwarmTransport]) -> None:
    """A member that lists another interface of its machine beside 127.0.0.1 (here a documentation address
    nobody answers at) and was pulled from on 127.0.0.1 is remembered there (``known_peers.txt`` is written from
    this), not at the other address. Mutation caught: keeping the listed addresses but loopback (what
    ``useful_addresses`` gives), as before: the member was remembered at an address it was never met at."""
    host = _host(epoch_seconds=600)
    try:
        boot = host.transport.visible_multiaddrs()
        port = free_port()
        a = make_transport(initial_peers=boot, epoch_seconds=600, host_maddrs=[f"/ip4/127.0.0.1/tcp/{port}"],
                           announce_maddrs=[f"/ip4/203.0.113.7/tcp/{port}", f"/ip4/127.0.0.1/tcp/{port}"])
        b = make_transport(initial_peers=boot, epoch_seconds=600)
        a_id = _p2p_id(a)
        assert a.visible_multiaddrs()[0].startswith("/ip4/203.0.113.7/"), a.visible_multiaddrs()
        assert wait_for(lambda: a_id in b.network_status().neighbours, timeout=30)
        assert a.publish(make_batch(a.identity)) is not None
        assert wait_for(lambda: b.collect() != [], timeout=30), b.stats()
        assert wait_for(lambda: any(m.endswith(a_id) for m in b.remembered_maddrs()), timeout=10)
        assert [m for m in b.remembered_maddrs() if m.endswith(a_id)] == [f"/ip4/127.0.0.1/tcp/{port}/p2p/{a_id}"]
    finally:
        host.close()


def test_a_member_that_lost_every_peer_says_so_and_redials_on_its_own(
        tmp_path, make_transport: Callable[..., SwarmTransport]) -> None:  # noqa: ANN001
    """A member whose only peer (its host) went away says so, and its own join loop dials again, every quarter
    epoch at most, so it is back within a quarter epoch and a dial of the host's return: nothing here dials or
    pings for it. Mutations caught: a join loop that stops redialling once every peer is gone (never back), one
    whose backoff is not capped at a quarter epoch (``retry_cap``: back later than ``cap + request_timeout``),
    and p2pd dialing the closed port itself (libp2p's back-off keeps the member away for tens of seconds)."""
    key, port = str(tmp_path / "p2p.key"), free_port()
    epoch = 8.0  # retries every 2 s at most: a quarter epoch
    host = _host(host_maddrs=[f"/ip4/127.0.0.1/tcp/{port}"], p2p_identity_path=key, epoch_seconds=epoch)
    boot = host.transport.visible_multiaddrs()
    member = make_transport(initial_peers=boot, client_mode=True, epoch_seconds=epoch, join_retry_max_seconds=60)
    assert member.network_status().connected
    cap = member.settings.retry_cap
    assert cap == epoch / 4
    host.close()
    assert wait_for(lambda: not member.network_status().connected, timeout=30)
    status = member.network_status()
    assert status.lost_at is not None and status.reason.startswith("lost every peer"), status
    assert "every 2 s at most" in status.reason
    # Down long enough for five dials: had p2pd dialed the closed port each time, libp2p's own back-off for the
    # address (5 s + 1 s x failures squared) would keep the member away for half a minute after the return.
    # Late in the outage it still dials every quarter epoch (an uncapped backoff would wait 8 s, then 16).
    time.sleep(6)
    failures = member.stats()["join_failures"]
    time.sleep(6)
    assert member.stats()["join_failures"] - failures >= 2, (failures, member.stats()["join_failures"])
    again = _host(host_maddrs=[f"/ip4/127.0.0.1/tcp/{port}"], p2p_identity_path=key, epoch_seconds=epoch)
    try:
        back = time.monotonic()
        assert wait_for(lambda: member.network_status().connected, timeout=epoch), member.network_status()
        took = time.monotonic() - back
        assert took <= cap + member.settings.request_timeout, took
        assert member.network_status().lost_at is None
    finally:
        again.close()


def test_a_member_says_when_its_host_went_away_and_came_back(
        tmp_path, make_transport: Callable[..., SwarmTransport]) -> None:  # noqa: ANN001
    """A member that keeps other neighbours while its host is down says that the host went (and how long ago),
    then that it came back and after how long, in its status line; it dials the host again by itself while it
    has neighbours but none of its hosts. Mutations caught: the going not noted (the reason says nothing), the
    return not noted, and no redial of the host while other neighbours remain (never back)."""
    key, port = str(tmp_path / "p2p.key"), free_port()
    epoch = 8.0
    host = _host(host_maddrs=[f"/ip4/127.0.0.1/tcp/{port}"], p2p_identity_path=key, epoch_seconds=epoch)
    boot = host.transport.visible_multiaddrs()
    host_id = boot[0].rsplit("/p2p/", 1)[1]
    a = make_transport(initial_peers=boot, epoch_seconds=epoch)
    b = make_transport(initial_peers=boot, epoch_seconds=epoch)
    assert wait_for(lambda: {host_id, _p2p_id(b)} <= set(a.network_status().neighbours), timeout=30), \
        a.network_status()
    assert "initial peers" not in a.network_status().reason
    gone = time.time()
    host.close()
    assert wait_for(lambda: a.network_status().initial_lost_at is not None, timeout=30), a.network_status()
    status = a.network_status()
    assert status.connected and status.initial_lost_at >= gone - 1, status  # b is still there
    assert "every initial peer (host) gone" in status.reason, status.reason
    time.sleep(3)
    again = _host(host_maddrs=[f"/ip4/127.0.0.1/tcp/{port}"], p2p_identity_path=key, epoch_seconds=epoch)
    try:
        returned = time.time()
        assert wait_for(lambda: a.network_status().initial_back is not None, timeout=epoch), a.network_status()
        status = a.network_status()
        assert status.initial_lost_at is None and host_id in status.neighbours
        at, away = status.initial_back
        assert at - returned <= a.settings.retry_cap + a.settings.request_timeout and away >= 3, status.initial_back
        assert "initial peers (hosts) back" in status.reason and f"after {away:.0f} s away" in status.reason
    finally:
        again.close()
