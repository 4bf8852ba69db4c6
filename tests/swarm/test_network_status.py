"""``network_reason``: what a node's status says about its network, case by case (pure); and the count of
remembered peers a joining transport's own status gives (a real transport on 127.0.0.1)."""

from __future__ import annotations

from collections.abc import Callable

from swarm.state import initial_peers_note, network_reason
from swarm.transport import SwarmTransport
from tests.swarm.conftest import free_port, wait_for

P = "12D3KooWSGJwbGPGkUnb1XsUSZox7jyoFP1HhmHPF5USADDTe8zk"
Q = "12D3KooWJWoaqZhDaoEFshF7Rh1bpY9ohihFhzcW6d69Lr2NASuq"
R = "12D3KooWRa3UdLkvBxc4TFPBkMtjZV4CnNmDrNbBi6mmXuPAyUpX"


def reason(**state: object) -> str:
    base: dict[str, object] = {"alive": True, "running": True, "up": True, "neighbours": 0, "initial_peers": 0,
                               "join_failures": 0, "start_failures": 0, "error": ""}
    base.update(state)
    return network_reason(**base)  # type: ignore[arg-type]


def test_each_state_has_its_reason() -> None:
    assert reason(alive=False) == "stopped"
    assert reason(alive=False, error="p2pd exited") == "stopped: p2pd exited"
    assert reason(running=False, up=False) == "starting"
    assert reason(running=False, up=False, start_failures=2, error="P2PDaemonError") == \
        "starting failed 2 times, retrying: P2PDaemonError"
    assert reason(up=False, error="p2pd exited") == "stopped: p2pd exited"  # shutting down after a failure
    assert reason(up=False, initial_peers=2) == "joining"
    assert reason(up=False, initial_peers=2, join_failures=3) == \
        "joining: none of 2 initial peers answered (3 attempts failed)"
    assert reason(up=False, initial_peers=0, remembered=2, join_failures=1) == \
        "joining: none of 0 initial and 2 remembered peers answered (1 attempts failed)"
    assert reason(neighbours=1) == "joined: 1 DHT neighbour"
    assert reason(neighbours=3) == "joined: 3 DHT neighbours"
    assert reason().startswith("listening, no peer has answered yet")
    assert reason(up=False, initial_peers=1, join_failures=3, lost_for=42.4, retry_cap=15.0) == (
        "lost every peer 42 s ago; dialing the initial and remembered peers again every 15 s at most "
        "(3 attempts failed)")


def test_connected_means_at_least_one_peer_answered() -> None:
    from swarm.state import NetworkStatus

    def status(up: bool, neighbours: tuple[str, ...]) -> NetworkStatus:
        return NetworkStatus(up=up, reason="", neighbours=neighbours, restarts=0, last_error="")

    assert status(True, ("12D3KooWA",)).connected
    assert not status(True, ()).connected  # listening, or joining: nobody answered yet
    assert not status(False, ()).connected


def test_what_a_status_says_about_the_initial_peers() -> None:
    assert initial_peers_note(100.0, None, None) == ""
    assert initial_peers_note(100.0, 58.0, None) == "every initial peer (host) gone 42 s ago"
    assert initial_peers_note(100.0, None, (95.0, 162.4)) == "initial peers (hosts) back 5 s ago, after 162 s away"


def test_a_joining_transport_counts_the_peers_it_remembers_by_peer_not_by_address(
        make_transport: Callable[..., SwarmTransport]) -> None:
    """Nobody answers: the status names the initial peers and the remembered ones, each peer once (two
    addresses of one peer are one peer; a remembered address of an initial peer is no other peer). Mutations
    caught: counting addresses (4 or 5 remembered), counting the initial peer among the remembered (3), or
    leaving the remembered peers out of the line ("none of 1 initial peers")."""
    dead = [free_port() for _ in range(4)]
    initial = f"/ip4/127.0.0.1/tcp/{dead[0]}/p2p/{P}"
    node = make_transport(initial_peers=[initial], client_mode=True, wait=False)
    node.add_bootstrap_peers([f"/ip4/127.0.0.1/tcp/{dead[1]}/p2p/{P}", f"/ip4/127.0.0.1/tcp/{dead[2]}/p2p/{Q}",
                              f"/ip4/127.0.0.2/tcp/{dead[2]}/p2p/{Q}", f"/ip4/127.0.0.1/tcp/{dead[3]}/p2p/{R}"])
    assert wait_for(lambda: node.stats()["join_failures"] >= 1, timeout=30), node.network_status()
    reason = node.network_status().reason
    assert reason.startswith("joining: none of 1 initial and 2 remembered peers answered ("), reason
