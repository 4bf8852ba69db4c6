"""``network_reason``: what a node's status says about its network, case by case (pure)."""

from __future__ import annotations

from swarm.state import network_reason


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
