"""Every hivemind internal swarm-node relies on, exercised against real peers on 127.0.0.1.

If a hivemind upgrade renames or changes one of them, a test here fails (rather than the node silently
losing its p2pd watchdog or its dialing).
"""

from __future__ import annotations

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


def test_dial_connects_and_neighbours_lists_the_peer(make_transport: Callable[..., SwarmTransport]) -> None:
    a, b = make_transport(), make_transport()
    full = Multiaddr(b.visible_multiaddrs()[0])
    peer_id = PeerID.from_base58(full["p2p"])
    addr = full.decapsulate(Multiaddr(f"/p2p/{full['p2p']}"))
    a._await_on_loop(lambda core: hivemind_compat.dial(core.p2p, peer_id, [addr]))
    a._await_on_loop(lambda core: core.dht.protocol.call_ping(peer_id))
    assert wait_for(lambda: peer_id in a._call_on_loop(lambda core: hivemind_compat.dht_neighbours(core.dht)))


def test_a_missing_internal_is_named_in_the_error() -> None:
    class NotAP2P:
        is_alive = True

    with pytest.raises(HivemindCompatError, match=r"NotAP2P\._child"):
        hivemind_compat.p2pd_process(NotAP2P())  # type: ignore[arg-type]
