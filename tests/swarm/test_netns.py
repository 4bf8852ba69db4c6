"""Real processes on separate network hosts (Linux namespaces this test creates): NAT and partitions.

Each node is ``scripts/lab/swarm_probe.py``: its own Python, its own p2pd, a real ``SwarmTransport`` that
publishes a small batch every second. The lab (``scripts/lib/netns_lab.py``) puts public hosts on
203.0.113.0/24 and NATed hosts behind a masquerading router; every namespace and interface is removed
at teardown, failed or not. Skipped, with the reason, where namespaces cannot be created (not root, no
``ip`` or ``nft``; ``scripts/dev/ci_deps.sh`` installs them) -- except where ``SWARM_NODE_NETNS=require`` (CI
sets it in ``.ci/run``): there they fail with the reason instead, so they are never skipped silently.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.scripts import load_script

PORT = 31337


netns_lab = load_script("lib/netns_lab")
_REASON = netns_lab.netns_unavailable_reason()
_REQUIRED = os.environ.get("SWARM_NODE_NETNS") == "require"
pytestmark = pytest.mark.skipif(_REASON is not None and not _REQUIRED, reason=str(_REASON))


@pytest.fixture
def lab() -> Iterator[Any]:
    if _REASON is not None:
        pytest.fail(f"SWARM_NODE_NETNS=require, but network namespaces are unavailable: {_REASON}")
    lab = netns_lab.NetLab()
    try:
        yield lab
    finally:
        lab.close()
        assert not netns_lab.lab_namespaces(lab.tag), "namespaces left behind"
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        assert lab.tag not in links, "interfaces left behind"


def settings(host: Any, **extra: object) -> dict[str, object]:
    return {
        "swarm_id": "netns-test",
        "host_maddrs": [f"/ip4/{host.ip}/tcp/{PORT}"],
        "epoch_seconds": 6.0,
        "request_timeout": 3.0,
        "collect_interval": 0.2,
        "join_retry_seconds": 0.5,
        "join_retry_max_seconds": 2.0,
        "startup_timeout": 30.0,
        **extra,
    }


def probe(host: Any, seconds: float = 120, **extra: object) -> Any:
    return netns_lab.Probe(sys.executable, settings(host, **extra), seconds=seconds, host=host, publish_every=1.0,
                           stats_every=1.0)


def received(receiver: Any, author: Any, after: float = 0.0) -> list[int]:
    """Numbers of ``author``'s batches ``receiver`` collected (published after ``after``, wall clock)."""
    published = {int(e["n"]): float(e["t"]) for e in author.of("pub")}
    return [int(e["n"]) for e in receiver.of("got")
            if e["from"] == author.peer and published.get(int(e["n"]), 0.0) > after]


def wait_until(predicate: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return bool(predicate())


def can_connect(src: Any, dst: Any) -> bool:
    code = f"import socket; socket.create_connection(('{dst.ip}', {PORT}), timeout=2)"
    return subprocess.run(src.command(sys.executable, "-c", code), capture_output=True).returncode == 0


def stop_all(nodes: list[Any]) -> list[int]:
    """Ask every probe to stop at once (their shutdowns overlap), then collect the exit codes."""
    for node in nodes:
        node.send("stop")
    return [node.stop() for node in nodes]


_WHY = ("peers_connected", "peers_banned", "batches_accepted", "batches_rejected", "offences", "pulls_failed",
        "pulls_stalled", "stalls_retried", "pulls_unreachable", "poll_failed", "poll_key_timeouts")
"""The counters a failed exchange is explained by."""


def last_stats(node: Any) -> dict[str, Any]:
    stats = node.of("stats")
    return dict(stats[-1]["stats"]) if stats else {}


def test_the_link_emulator_delays_drops_and_limits_what_a_host_sends(lab: Any) -> None:
    """``scripts/lab/linkem.py`` (the kernel here has no netem): a host's profile applies to what it sends, so
    the round trip from a plain host to an intercontinental one is that profile's delay (150 ms +/- 40);
    a bad-home host behind the NAT loses about 3% of its packets and sends at most 5 Mbit/s."""
    plain = lab.add_host()
    far = lab.add_host(link=netns_lab.PROFILES["intercontinental"])
    home = lab.add_host(link=netns_lab.PROFILES["bad-home"])
    assert home.nat and not far.nat
    rtts = sorted(netns_lab.tcp_check(plain, far, mode="e", n=15)["rtts"])
    assert 0.105 <= rtts[len(rtts) // 2] <= 0.2, rtts  # the emulator's own cost is a few milliseconds
    sent = netns_lab.tcp_check(home, plain, mode="s", size=400_000)
    assert sent["bytes"] / sent["seconds"] <= 5e6 / 8 * 1.05  # the 5 Mbit/s uplink
    stats = lab.link_stats()["stats"][home.name]["up"]
    assert stats["packets"] > 250 and 0.005 <= stats["lost"] / (stats["packets"] + stats["lost"]) <= 0.08, stats
    assert not can_connect(plain, home)  # bad-home sits behind the NAT


def test_public_and_natted_nodes_accept_each_others_batches(lab: Any) -> None:
    public = lab.add_host()
    home, home2 = lab.add_host(nat=True), lab.add_host(nat=True)
    p = probe(public)
    p.wait_up(60)
    initial = [p.maddr(public.ip)]
    n = probe(home, client_mode=True, initial_peers=initial)
    n2 = probe(home2, client_mode=True, initial_peers=initial)
    n.wait_up(60), n2.wait_up(60)
    # The NAT is real: the public host cannot open a connection to the NATed one, the reverse works.
    assert can_connect(home, public) and not can_connect(public, home)
    assert wait_until(lambda: len(received(p, n)) >= 2 and len(received(n, p)) >= 2, 60), (
        last_stats(p), last_stats(n))
    # Between two NATed homes only the hand-off to the public node carries batches.
    assert wait_until(lambda: len(received(n2, n)) >= 2 and len(received(n, n2)) >= 2, 60), last_stats(n2)
    assert stop_all([p, n, n2]) == [0, 0, 0]
    assert last_stats(n)["handoffs_sent"] > 0 and last_stats(p)["handoffs_held"] > 0
    for node in (p, n, n2):
        assert not last_stats(node)["batches_rejected"], last_stats(node)


@pytest.mark.slow  # about 25 s idle, 43 to 61 s at a load average near 9
def test_partitioned_groups_go_on_and_exchange_again_after_healing(lab: Any) -> None:
    epoch = 6.0
    a0, a1, b0, b1 = (lab.add_host() for _ in range(4))
    boot = probe(a0)
    boot.wait_up(60)
    initial = [boot.maddr(a0.ip)]
    nodes = {a0: boot, **{h: probe(h, initial_peers=initial) for h in (a1, b0, b1)}}
    for node in nodes.values():
        node.wait_up(60)
    group_a, group_b = [nodes[a0], nodes[a1]], [nodes[b0], nodes[b1]]
    assert wait_until(lambda: all(received(x, y) for x in group_a for y in group_b), 60)

    lab.partition([a0, a1], [b0, b1])
    split_at = time.time()
    time.sleep(2 * epoch)
    # Both sides kept going: every node published through the split.
    for node in nodes.values():
        assert len([e for e in node.of("pub") if e["t"] > split_at + 1]) >= epoch
    lab.heal()
    healed_at = time.time()
    # Exchange across the former split resumes within two epochs: batches published after the heal arrive.
    assert wait_until(
        lambda: all(received(x, y, after=healed_at) for x in group_a for y in group_b)
        and all(received(y, x, after=healed_at) for x in group_a for y in group_b),
        2 * epoch,
    ), json.dumps({node.peer[:8]: {k: v for k, v in last_stats(node).items() if k in _WHY}
                   | {"got_after_heal": {y.peer[:8]: len(received(node, y, after=healed_at)) for y in nodes.values()}}
                   for node in nodes.values()})
    assert stop_all(list(nodes.values())) == [0] * len(nodes)
    # Every node is honest: a pull that stalled on a connection the split left stuck is no offence.
    for node in nodes.values():
        assert not last_stats(node)["offences"], last_stats(node)
