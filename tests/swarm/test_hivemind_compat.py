"""Every hivemind internal swarm-node relies on, exercised against real peers on 127.0.0.1.

If a hivemind upgrade renames or changes one of them, a test here fails (rather than the node silently
losing its p2pd watchdog or its dialing).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import psutil
import pytest
from hivemind.p2p import PeerID
from hivemind.utils.multiaddr import Multiaddr

from swarm import hivemind_compat
from swarm.hivemind_compat import HivemindCompatError
from swarm.transport import SwarmTransport
from tests.swarm.conftest import wait_for


def test_p2pd_process_is_the_running_daemon(make_transport: Callable[..., SwarmTransport]) -> None:
    node = make_transport()
    child = node._call_on_loop(lambda core: hivemind_compat.p2pd_process(core.p2p))
    assert child is not None and child.returncode is None
    assert "p2pd" in psutil.Process(child.pid).name()
    assert node.p2pd_pid() == child.pid
    assert node._call_on_loop(lambda core: hivemind_compat.p2pd_exited(core.p2p)) is False


def test_p2pd_runs_in_a_session_of_its_own(make_transport: Callable[..., SwarmTransport]) -> None:
    """A Ctrl-C at the node's terminal (SIGINT to the node's process group) must not reach p2pd."""
    pid = make_transport().p2pd_pid()
    assert pid is not None
    assert os.getsid(pid) == pid != os.getsid(0)
    assert os.getpgid(pid) != os.getpgid(0)


def test_dial_connects_and_neighbours_lists_the_peer(make_transport: Callable[..., SwarmTransport]) -> None:
    a, b = make_transport(), make_transport()
    full = Multiaddr(b.visible_multiaddrs()[0])
    peer_id = PeerID.from_base58(full["p2p"])
    addr = full.decapsulate(Multiaddr(f"/p2p/{full['p2p']}"))
    a._await_on_loop(lambda core: hivemind_compat.dial(core.p2p, peer_id, [addr]))
    a._await_on_loop(lambda core: core.dht.protocol.call_ping(peer_id))
    assert wait_for(lambda: peer_id in a._call_on_loop(lambda core: hivemind_compat.dht_neighbours(core.dht)))


def test_disconnect_closes_the_connection(make_transport: Callable[..., SwarmTransport]) -> None:
    a, b = make_transport(), make_transport()
    full = Multiaddr(b.visible_multiaddrs()[0])
    peer_id = PeerID.from_base58(full["p2p"])
    addr = full.decapsulate(Multiaddr(f"/p2p/{full['p2p']}"))

    def connected() -> bool:
        peers = a._await_on_loop(lambda core: core.p2p.list_peers())
        return any(info.peer_id == peer_id for info in peers)

    a._await_on_loop(lambda core: hivemind_compat.dial(core.p2p, peer_id, [addr]))
    assert connected()

    def disconnected() -> bool:
        # Another test's traffic or b's DHT may dial a again at any moment after a disconnect returns, so
        # the test asks again until it sees the connection gone; a disconnect that closed nothing never does.
        a._await_on_loop(lambda core: hivemind_compat.disconnect(core.p2p, peer_id))
        return not connected()

    assert wait_for(disconnected, period=0.2)


def test_dht_requests_are_counted(make_transport: Callable[..., SwarmTransport]) -> None:
    """Every find a poll sends is counted (the wrapper sits where hivemind's node calls its protocol)."""
    a = make_transport()
    b = make_transport(initial_peers=a.visible_multiaddrs())
    assert wait_for(lambda: b.stats()["polls"] >= 3 and b.stats()["dht_find_requests"] >= 3)
    stats = b.stats()
    assert stats["dht_find_keys"] >= stats["dht_find_requests"]
    assert a.stats()["dht_find_requests"] >= 1


def test_a_missing_internal_is_named_in_the_error() -> None:
    class NotAP2P:
        is_alive = True

    with pytest.raises(HivemindCompatError, match=r"NotAP2P\._child"):
        hivemind_compat.p2pd_process(NotAP2P())  # type: ignore[arg-type]


def test_the_config_check_parses_multiaddrs_as_hivemind_does() -> None:
    """``swarm.maddr`` loads hivemind's vendored parser without importing hivemind: same bytes, same refusals."""
    from swarm.maddr import multiaddr_class, multiaddr_problem

    standalone = multiaddr_class()
    assert standalone is not Multiaddr and standalone.__name__ == Multiaddr.__name__
    peer = "12D3KooWDePaggDhKViWWG9BiNRGvevgFHi49xfYoAErMVvSS9oA"
    for text in (f"/ip4/127.0.0.1/tcp/31337/p2p/{peer}", "/ip6/::1/udp/5/quic", "/dns4/a.example/tcp/1"):
        assert standalone(text).to_bytes() == Multiaddr(text).to_bytes()
        assert multiaddr_problem(text) is None
    for bad in ("/ip4/127.0.0.1/tcp/1/p2p/notapeerid", "/ip4/1.2.3.300/tcp/1", "/ip4/1.2.3.4/tcp/65536"):
        with pytest.raises(ValueError):
            Multiaddr(bad)
        assert multiaddr_problem(bad) is not None


def test_the_config_check_imports_neither_hivemind_nor_torch() -> None:
    import subprocess
    import sys

    code = ("import sys; from swarm.settings import SwarmSettings; "
            "SwarmSettings(initial_peers=['/ip4/127.0.0.1/tcp/1/p2p/12D3KooWDePaggDhKViWWG9BiNRGvevgFHi49xfYoAErMVvSS9oA']); "
            "print(sorted(m for m in ('hivemind', 'torch') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr[-2000:]
