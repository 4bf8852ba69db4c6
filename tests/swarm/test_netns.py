"""Real processes on separate network hosts (Linux namespaces this test creates): NAT and partitions.

Each node is ``scripts/lab/swarm_probe.py``: its own Python, its own p2pd, a real ``SwarmTransport`` that
publishes a small batch every second. The lab (``scripts/lib/netlab/netns.py``) puts public hosts on
203.0.113.0/24 and NATed hosts behind a masquerading router; every namespace and interface is removed
at teardown, failed or not. Skipped, with the reason, where namespaces cannot be created (not root, no
``ip`` or ``nft``; ``scripts/dev/ci_deps.sh`` installs them) -- except where ``SWARM_NODE_NETNS=require`` (CI
sets it in ``.ci/run``): there they fail with the reason instead, so they are never skipped silently.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from scripts.lib.netlab import netns as netns_lab
from scripts.lib.netlab import swarm as lab_swarm

PORT = 31337


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


SMALL_STEPS = ["train.eval_every=0", "train.checkpoint_every=1000", "tasks.eval_size=8", "sapo.local_groups=4",
               "sapo.external_groups=4", "sapo.generated_groups=4", "generation.group_size=4"]


def _exchanged(members: list[Any], ids: dict[Any, str], after: float = 0.0, among: list[Any] | None = None) -> bool:
    """Every member accepted a batch (created after ``after``) of every other member of ``among``."""
    others = among or members
    return all(m.accepted_from(ids[o], after) > 0 for m in members for o in others if o is not m)


def _why(members: list[Any], ids: dict[Any, str], after: float = 0.0) -> str:
    return json.dumps({ids[m][:8]: {"steps": m.steps(), "exit": m.proc.poll(),
                                    "from": {ids[o][:8]: m.accepted_from(ids[o], after) for o in members if o is not m}}
                       for m in members})


# 67 s at a load average of 4 to 7 on 2 cores (80 s in a full run): five tiny-base nodes and two hosts. Slow: the
# default suite forms a swarm across namespaces from the docs' commands (test_the_docs_host_and_join_commands_form_a
# _swarm_on_one_machine) and holds members exchanging without their host on loopback (tests/swarm/test_host.py).
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_swarm_forms_from_its_descriptor_and_outlives_a_host(lab: Any, tmp_path: Any) -> None:
    """Two hosts and four nodes (two behind NAT) join from the descriptor alone (its URL on host 1) and
    exchange batches; host 1 is killed, the nodes keep training and exchanging through host 2, and a fifth
    node joins through host 2 (the descriptor from host 2's URL). A tampered descriptor, an expired one and
    one of another protocol version are each refused with one line and exit code 2."""
    h1, h2 = lab.add_host(), lab.add_host()
    hosts_of_nodes = [lab.add_host(), lab.add_host(), lab.add_host(nat=True), lab.add_host(nat=True)]
    fifth_host = lab.add_host(nat=True)
    descriptor, keys = lab_swarm.init_swarm(tmp_path, [h1.ip, h2.ip], overrides=["swarm.epoch_seconds=10"])
    hosts = [lab_swarm.start_host(h.popen, str(descriptor), tmp_path / f"host{i}", keys[i], "health_every=5")
             for i, h in enumerate((h1, h2))]
    for i, proc in enumerate(hosts):
        lab_swarm.wait_for_text(tmp_path / f"host{i}.log", "members join with", 120, proc)
    url1, url2 = (f"http://{h.ip}:{lab_swarm.API_PORT}/swarm.yaml" for h in (h1, h2))
    members = [lab_swarm.start_member(h.popen, url1, tmp_path / f"node{i}", h.ip, nat=h.nat, extra=SMALL_STEPS)
               for i, h in enumerate(hosts_of_nodes)]
    ids = {m: m.peer_id() for m in members}
    assert wait_until(lambda: _exchanged(members, ids), 240), _why(members, ids)

    hosts[0].kill()  # host 1 is gone, for good
    hosts[0].wait(timeout=30)
    killed = time.time()
    steps = {m: m.steps() for m in members}
    assert wait_until(lambda: _exchanged(members, ids, after=killed), 120), _why(members, ids, killed)
    assert all(m.steps() > steps[m] for m in members)  # they kept training

    fifth = lab_swarm.start_member(fifth_host.popen, url2, tmp_path / "node4", fifth_host.ip, nat=True,
                                   extra=SMALL_STEPS)
    ids[fifth] = fifth.peer_id()
    everyone = [*members, fifth]
    assert wait_until(lambda: _exchanged([fifth], ids, among=everyone)
                      and all(m.accepted_from(ids[fifth]) > 0 for m in members), 240), _why(everyone, ids)
    said = fifth.log.read_text()
    assert "joining swarm lab-swarm" in said and "connected:" in said

    for m in everyone:  # the members first: on their way out they save the neighbours they have
        m.proc.send_signal(signal.SIGTERM)
    assert [m.proc.wait(timeout=120) for m in everyone] == [0] * 5
    hosts[1].send_signal(signal.SIGTERM)
    assert hosts[1].wait(timeout=60) == 0
    for m in everyone:  # nobody honest was banned, and each remembered the peers it met
        offences = [e for e in m.trace() if e.get("ev") == "rej" and e.get("offence")]
        assert not offences, offences
        assert lab_swarm.remembered(m.run_dir), m.run_dir
    _refusals(fifth_host, tmp_path, descriptor)


def _refusals(host: Any, tmp_path: Any, descriptor: Any) -> None:
    import yaml

    good = descriptor.read_text()
    doc = yaml.safe_load(good)
    tampered = tmp_path / "tampered.yaml"
    tampered.write_text(good.replace("swarm.epoch_seconds: 10.0", "swarm.epoch_seconds: 20.0"))
    cases = {tampered: "does not match the content"}
    for name, change, why in (("expired.yaml", {"expires": "2020-01-01T00:00:00Z"}, "expired at 2020-01-01"),
                              ("v2.yaml", {"protocol_version": 2}, "wire protocol 2")):
        path = tmp_path / name
        path.write_text(yaml.safe_dump({**doc, **change}))
        subprocess.run(lab_swarm.cli("swarm", "sign", str(path), "--key", str(tmp_path / "owner.pem")), check=True,
                       capture_output=True, cwd=lab_swarm.ROOT, env=lab_swarm.process_env(tmp_path))
        cases[path] = why
    for path, why in cases.items():
        run_dir = tmp_path / f"refused-{path.stem}"
        done = subprocess.run(host.command(*lab_swarm.member_command(str(path), run_dir, host.ip, nat=True)),
                              capture_output=True, text=True, timeout=120, cwd=lab_swarm.ROOT,
                              env=lab_swarm.process_env(tmp_path))
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1 and why in lines[0], (path.name, done.stderr)
        assert not run_dir.exists()


def _doc_commands(page: str, heading: str) -> list[list[str]]:
    """The commands of the first bash block under ``## heading``, with this Python for ``swarm-node``."""
    import shlex

    from tests.doc_checks import _join_lines

    section = page[page.index(f"## {heading}\n"):]
    block = section[section.index("```bash\n") + 8:]
    block = block[:block.index("```")]
    commands = [shlex.split(c, comments=True) for c in _join_lines(block.splitlines())]
    assert all(c[0] == "swarm-node" for c in commands), commands
    return [lab_swarm.cli(*c[1:]) for c in commands]


# 60 to 90 s at a load average of 8 to 12: a host and two tiny-base members on one machine, the docs' commands
@pytest.mark.timeout(1200)
def test_the_docs_host_and_join_commands_form_a_swarm_on_one_machine(lab: Any, tmp_path: Any) -> None:
    """docs/swarm.md's "Host a swarm" and "Join a swarm" commands as written, all on the host's own machine (one
    namespace; ``host.example.org`` resolves to it): the owner signs, the host serves and prints the very join
    command the docs give, `swarm verify` reads the descriptor from the host's URL, a member joins with that
    command and a second one with the documented run dir and status port, they accept each other's batches,
    and `swarm-node status` answers with no flags."""
    import shlex

    page = (lab_swarm.ROOT / "docs" / "swarm.md").read_text()
    init, host_cmd, verify = _doc_commands(page, "Host a swarm")
    join, status = _doc_commands(page, "Join a swarm")
    machine = lab.add_host()
    here = tmp_path / "machine"
    here.mkdir()
    (here / "configs").symlink_to(lab_swarm.ROOT / "configs")
    env = lab_swarm.process_env(here)
    with lab_swarm.names_resolved([machine], {"host.example.org": machine.ip}):
        subprocess.run(init, cwd=here, env=env, check=True, timeout=120, capture_output=True)
        log = open(tmp_path / "host.log", "wb")  # noqa: SIM115 -- kept open by the child
        served = machine.popen(host_cmd, cwd=here, env=env, stdout=log, stderr=subprocess.STDOUT)
        said = lab_swarm.wait_for_text(tmp_path / "host.log", r"members join with: (.*)\n", 120, served).group(1)
        documented = page[page.index("## Join a swarm"):].split("```bash\n", 1)[1].splitlines()[0]
        assert said == documented, (said, documented)  # the CLI prints the docs' command
        checked = subprocess.run(machine.command(*verify), cwd=here, env=env, capture_output=True, text=True,
                                 timeout=120)
        assert checked.returncode == 0 and "is valid" in checked.stdout, checked.stderr
        second = [*join, *shlex.split("--run-dir runs/public2 api.port=8771")]  # as the docs say, for a second one
        started = time.time()
        members = {}
        for name, command in (("m1", join), ("m2", second)):
            out = open(tmp_path / f"{name}.log", "wb")  # noqa: SIM115 -- kept open by the child
            members[name] = machine.popen(command, cwd=here, env=env, stdout=out, stderr=subprocess.STDOUT)
        run_dirs = {"m1": here / "runs" / "public", "m2": here / "runs" / "public2"}

        def accepted(name: str) -> int:
            path = run_dirs[name] / "metrics.jsonl"
            rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
            return max((r.get("batches_accepted", 0) for r in rows), default=0)

        assert wait_until(lambda: accepted("m1") > 0 and accepted("m2") > 0, 600), (
            (tmp_path / "m1.log").read_text()[-2000:], (tmp_path / "m2.log").read_text()[-2000:])
        took = time.time() - started
        asked = subprocess.run(machine.command(*status), cwd=here, env=env, capture_output=True, text=True, timeout=60)
        assert asked.returncode == 0 and "connected" in asked.stdout and "NOT CONNECTED" not in asked.stdout, (
            asked.stdout, asked.stderr)
        for proc in members.values():
            proc.send_signal(signal.SIGTERM)
        assert [proc.wait(timeout=120) for proc in members.values()] == [0, 0]
        served.send_signal(signal.SIGTERM)
        assert served.wait(timeout=60) == 0
    said = (tmp_path / "m1.log").read_text()
    assert "joining swarm my-swarm" in said and "connected:" in said
    print(f"two members and a host on one machine: both accepted a peer batch {took:.0f} s after they started")
