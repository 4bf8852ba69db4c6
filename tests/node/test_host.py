"""``swarm-node host`` as a process where importing torch raises: its lines, its status page and API (the
page checked in Chromium against the API), ``/healthz``, ``/metrics``, the descriptor it serves, members
seen from real peers on 127.0.0.1, its mistakes (one line, exit 2) and a clean stop."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from protocol.descriptor import SwarmDescriptor, TaskSet, owner_text, parse_descriptor
from protocol.identity import Identity
from tests.chromium import Chromium, chromium_or_skip
from tests.swarm.batches import Publishing, make_batch, published_per_epoch, saved_pulled
from tests.swarm.conftest import free_port, make_transport, wait_for  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parents[2]
EPOCH = 600.0
OWNER = Identity.generate()

NO_TORCH = """
import sys
class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is not allowed in a host")
sys.meta_path.insert(0, NoTorch())
from node.cli import main
code = main(sys.argv[1:])
assert "torch" not in sys.modules
sys.exit(code)
"""


def host_command(*args: str) -> list[str]:
    return [sys.executable, "-c", NO_TORCH, "host", *args]


def make_descriptor(tmp_path: Path, hosts: list[str], **settings: object) -> Path:
    from node.config import load_config
    from node.config.join import shared_values, task_config_hash

    cfg = load_config(ROOT / "configs" / "swarm-shared.yaml", ["swarm.swarm_id=test-swarm",
                                                                 *(f"{k}={v}" for k, v in settings.items())])
    owner = OWNER
    d = SwarmDescriptor(swarm_id="test-swarm", name="Test swarm", protocol_version=1, hosts=hosts,
                        expires=datetime.now(timezone.utc) + timedelta(days=1), settings=shared_values(cfg),
                        tasks=TaskSet(source="arith", datasets=["add"], config_hash=task_config_hash(cfg)),
                        owner=owner_text(owner.public_key)).sign(owner)
    path = tmp_path / "swarm.yaml"
    path.write_text(d.to_yaml())
    return path


def host_key(tmp_path: Path) -> tuple[Path, str]:
    from swarm.p2p_keys import ensure_p2p_key

    key = tmp_path / "host" / "p2p.key"
    return key, ensure_p2p_key(key)


class HostProcess:
    """``swarm-node host`` in a child process: its stdout read line by line in a thread (``lines``), its
    stderr to a file (a pipe nobody reads would fill and stop it), started within ``STARTUP_TIMEOUT``."""

    STARTUP_TIMEOUT = 120.0  # seconds to the line that says how members join: imports and a p2p daemon

    def __init__(self, tmp_path: Path, descriptor: Path, *extra: str) -> None:
        self.run_dir = tmp_path / "host"
        env = {**os.environ, "SWARM_NODE_KNOWN_SWARMS": str(tmp_path / "known"), "PYTHONPATH": str(ROOT)}
        self.stderr_path = tmp_path / "host.stderr"
        with self.stderr_path.open("w") as stderr:
            self.proc = subprocess.Popen(
                host_command("--swarm", str(descriptor), "-c", str(ROOT / "configs" / "host.yaml"), "--run-dir",
                             str(self.run_dir), "api.port=0", "api.host=127.0.0.1", "swarm.collect_interval=0.2",
                             "health_every=1", *extra),
                stdout=subprocess.PIPE, stderr=stderr, text=True, env=env, cwd=ROOT)
        self.lines: list[str] = []
        started = threading.Event()
        threading.Thread(target=self._read, args=(started,), daemon=True).start()
        if not started.wait(self.STARTUP_TIMEOUT):
            self.proc.kill()
            self.proc.wait(timeout=10)
            pytest.fail(f"the host printed no 'members join with' line within {self.STARTUP_TIMEOUT:.0f} s: "
                        f"{self.lines} {self.stderr()[-2000:]}")
        assert any("status page at" in ln for ln in self.lines), (self.lines, self.stderr()[-2000:])
        self.url = (self.run_dir / "api_url").read_text().strip()

    def _read(self, started: threading.Event) -> None:
        """Every stdout line into ``lines`` until the child closes it; ``started`` set at the line that ends
        the start-up, or at the end of the output (a child that exited)."""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())
            if "members join with" in line:
                started.set()
        started.set()

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=10) as answer:
                return answer.status, answer.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def doc(self) -> dict[str, Any]:
        return json.loads(self.get("api/swarm?epochs=4")[1])

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)

    def kill(self) -> None:
        """``kill -9``: nothing saved at the end, p2pd left to its orphan watchdog."""
        self.proc.kill()
        self.proc.wait(timeout=30)


def loopback_listen(address: str) -> str:
    """The override that makes a host listen on 127.0.0.1 only, at the port of its descriptor ``address``."""
    port = address.split("/tcp/")[1].split("/")[0]
    return f"swarm.host_maddrs=[/ip4/127.0.0.1/tcp/{port}]"


@pytest.fixture
def host(tmp_path: Path) -> Iterator[tuple[HostProcess, str]]:
    key, peer = host_key(tmp_path)
    address = f"/ip4/127.0.0.1/tcp/{free_port()}/p2p/{peer}"
    dead = f"/ip4/127.0.0.1/tcp/{free_port()}/p2p/12D3KooWSGJwbGPGkUnb1XsUSZox7jyoFP1HhmHPF5USADDTe8zk"
    descriptor = make_descriptor(tmp_path, [address, dead], **{"swarm.epoch_seconds": EPOCH})
    proc = HostProcess(tmp_path, descriptor, loopback_listen(address))
    try:
        yield proc, address
    finally:
        code = proc.stop()
        assert code == 0, proc.stderr()[-2000:]
        assert not (proc.run_dir / "api_url").exists()


def test_a_host_without_torch_serves_its_swarm(host: tuple[HostProcess, str], make_transport: Any) -> None:  # noqa: F811
    proc, address = host
    said = "\n".join(proc.lines)
    assert f"announced as {address}" in said and "other hosts: 1" in said
    status, body = proc.get("healthz")
    assert status == 200 and json.loads(body)["listening"] == [address]
    status, body = proc.get("swarm.yaml")
    served = parse_descriptor(body)
    served.verify()
    assert served.hosts[0] == address
    public = make_transport(initial_peers=[address], epoch_seconds=EPOCH)
    natted = make_transport(initial_peers=[address], epoch_seconds=EPOCH, client_mode=True, handoff_copies=1)
    for k, node in enumerate((public, natted)):
        for i in range(2):  # distinct content: a copy of another author's groups would be a duplicate
            assert node.publish(make_batch(node.identity, index=10 * k + i)) is not None
    # The host reads every manifest, holds what the NATed member hands it and verifies every batch once (a
    # handed-over one from its own copy).
    # Each batch once: pulled, or handed to the host (the NATed member hands its batches to the host and to the
    # public member, a DHT server, in turn) and verified from that copy.
    assert wait_for(lambda: {m["peer_id"]: (m["announced"], m["pulled"] + m["handed_off"]) for m in proc.doc()["members"]}
                    == {public.identity.peer_id: (2, 2), natted.identity.peer_id: (2, 2)}, timeout=40), \
        proc.doc()["members"]
    doc = proc.doc()
    natted_row = next(m for m in doc["members"] if m["peer_id"] == natted.identity.peer_id)
    held = doc["host"]["counters"]["handoffs_held"]
    assert natted_row["natted"] and natted_row["handed_off"] == held and natted_row["model"] == "model-test"
    # Each batch once: those not handed to the host it pulled (from the public member that held them).
    assert natted_row["totals"] == {"announced": 2, "pulled": 2 - held, "handed_off": held}
    assert [h["start"] for h in doc["history"]][-1] == doc["host"]["epoch"] * EPOCH  # epochs as times
    assert doc["history"][-1]["announced"] == 4 and doc["history"][-1]["members"] == 2
    assert wait_for(lambda: proc.doc()["host"]["network"]["connected"], timeout=20), proc.doc()["host"]["network"]
    assert wait_for(lambda: proc.doc()["hosts"][0]["ok"] is False, timeout=20)  # the other host is down
    assert doc["host"]["rss_bytes"] < 200 * 2**20
    metrics = proc.get("metrics")[1].decode()
    assert "swarm_host_members 2.0" in metrics and f"swarm_host_handoffs_held_total {float(held)}" in metrics
    assert "swarm_host_other_hosts_up 0.0" in metrics

    exe = chromium_or_skip()

    async def look() -> dict[str, Any]:
        async with Chromium(exe) as browser:
            page = await browser.open(proc.url, 1280, 1000)
            await page.wait_for("document.body.dataset.loaded && document.querySelectorAll('canvas').length >= 2")
            seen = await page.evaluate("""(() => {
                const v = (id) => document.getElementById(id).dataset.value;
                const rows = [...document.querySelectorAll('#members-table tbody tr[data-member]')].map((tr) => {
                    const cell = (f) => tr.querySelector(`[data-field="${f}"]`).dataset.value;
                    return {peer: cell('peer'), natted: cell('natted'), announced: +cell('announced'),
                            handed: +cell('handed_off'), model: cell('model')};
                });
                return {members: +v('members'), running: +v('members-running'), thisHost: v('this-host'),
                        hostLabels: [...document.querySelectorAll('#hosts-table [data-field="label"]')].map((td) => td.dataset.value),
                        swarm: v('swarm'), hostsUp: +v('hosts-up'), handoffs: +v('handoffs'),
                        announced: +v('announced'), verified: +v('pulled'), totalAnnounced: +v('total-announced'),
                        network: v('network'), firstEpoch: +document.getElementById('chart-epochs').dataset.first,
                        rows, hostRows: document.querySelectorAll('#hosts-table tbody tr[data-host]').length,
                        epochsChart: +document.getElementById('chart-epochs').dataset.points,
                        error: document.getElementById('error').hidden ? '' : document.getElementById('error').textContent};
            })()""")
            await page.screenshot(proc.run_dir / "host.png")
            assert not browser.exceptions, browser.exceptions
            return seen

    seen = asyncio.run(look())
    api = proc.doc()
    # The page shows what the API says, whichever way the NATed member's batches went (to the host, or to the
    # public member, a DHT server too: tests/swarm/test_host.py holds that split).
    assert seen["error"] == "" and seen["swarm"] == "test-swarm"
    assert seen["members"] == len(api["members"]) == 2 and seen["hostsUp"] == 0 and seen["hostRows"] == 1
    assert seen["running"] == api["host"]["members_running"] == 2
    assert seen["thisHost"] == api["host"]["label"] == "host 1 of 2" and seen["hostLabels"] == ["host 2 of 2"]
    assert seen["handoffs"] == api["host"]["counters"]["handoffs_held"]
    assert {r["peer"]: (r["natted"], r["announced"], r["handed"], r["model"]) for r in seen["rows"]} == {
        m["peer_id"]: (str(m["natted"]).lower(), m["announced"], m["handed_off"], m["model"]) for m in api["members"]}
    assert (seen["announced"], seen["verified"], seen["totalAnnounced"]) == (4, 4, 4)  # each batch once
    assert seen["network"] == "true"  # members answer it, though none in client mode is a DHT neighbour
    # The history starts at the host's first start (an epoch of 10 minutes: one point), not 60 epochs before.
    first = api["history"][0]["start"]
    assert seen["epochsChart"] == len(api["history"]) and seen["firstEpoch"] == first  # epochs as times
    assert first <= api["host"]["since"] < first + EPOCH
    assert (proc.run_dir / "host.png").stat().st_size > 10_000


@pytest.mark.slow  # 26 s at a load average of 5, 37 s at 7 (two starts of a host process, 6-second epochs)
def test_a_host_killed_and_restarted_counts_what_its_members_published(tmp_path: Path, make_transport: Any) -> None:  # noqa: F811
    """``kill -9`` the host while two members publish, leave it down more than an epoch, start it again: its
    totals and its history per epoch equal what the members published (their own traces), the epoch in progress
    at the kill and those it was down included, and the members said that their host went and came back.
    Mutations caught: saving the member table only at an epoch's end (the epoch in progress at the kill falls
    back), and no census of the epochs missed (the epochs while down show 0). The same in process, in the
    default suite: tests/swarm/test_host.py."""
    epoch = 6.0
    key, peer = host_key(tmp_path)
    address = f"/ip4/127.0.0.1/tcp/{free_port()}/p2p/{peer}"
    descriptor = make_descriptor(tmp_path, [address], **{"swarm.epoch_seconds": epoch, "swarm.request_timeout": 5})
    proc = HostProcess(tmp_path, descriptor, loopback_listen(address))
    members = [make_transport(initial_peers=[address], epoch_seconds=epoch, request_timeout=5.0,
                              trace_path=str(tmp_path / f"m{i}.trace")) for i in range(2)]
    publishing = Publishing(members, every=2.0)
    saved = proc.run_dir / "members.json"
    try:
        assert wait_for(lambda: len([m for m in proc.doc()["members"] if m["announced"] >= 2]) == 2, timeout=30), \
            proc.doc()["members"]
        # Killed mid-epoch, once the file holds batches of that epoch: saved within seconds, not at its end.
        assert wait_for(lambda: saved_pulled(saved, int(time.time() // epoch)) > 0 and (time.time() / epoch) % 1 < 0.8,
                        timeout=4 * epoch)
        killed = int(time.time() // epoch)
        proc.kill()
        kept = saved_pulled(saved, killed)
        time.sleep(1.5 * epoch)  # the members go on publishing to each other: at least one whole epoch unseen
        proc = HostProcess(tmp_path, descriptor, loopback_listen(address))
        assert wait_for(lambda: all(m.network_status().initial_back is not None for m in members), timeout=20), \
            [m.network_status() for m in members]
        time.sleep(epoch)
        publishing.stop()

        def published() -> dict[str, int]:
            return {m.identity.peer_id: m.stats()["batches_published"] for m in members}

        def announced() -> dict[str, int]:
            return {m["peer_id"]: m["totals"]["announced"] for m in proc.doc()["members"]}

        assert wait_for(lambda: announced() == published(), timeout=4 * epoch), (announced(), published())
        per_epoch = published_per_epoch([tmp_path / f"m{i}.trace" for i in range(2)], epoch)
        history = {h["epoch"]: h for h in proc.doc()["history"]}
        shown = {e: h["announced"] for e, h in history.items() if h["announced"]}
        assert shown == per_epoch, (shown, per_epoch)
        assert per_epoch.get(killed) and per_epoch.get(killed + 1), (killed, per_epoch)  # the kill's epoch, and down
        assert history[killed]["pulled"] + history[killed]["handed_off"] >= kept > 0, (history[killed], kept)
        assert proc.doc()["host"]["counters"]["census_new"] > 0
        assert "back" in members[0].network_status().reason
    finally:
        publishing.stop()
        assert proc.stop() == 0, proc.stderr()[-2000:]


def test_a_newcomer_joins_through_a_member_the_served_descriptor_lists_while_the_host_is_down(
        tmp_path: Path, make_transport: Any, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """The descriptor a host serves lists, in comment lines outside what is signed, the members it reached that
    accept connections. A newcomer started from a copy of it while every host is down joins through such a
    member: what ``swarm-node start --swarm COPY`` does (``join_config``, the run dir's copy, the daemon's
    transport factory dialing what the run dir remembers). Mutations caught: a host serving the bare descriptor,
    and a member that dials only ``known_peers.txt``, not the members its saved descriptor lists."""
    from node.config.join import join_config, listed_members, remembered_peers, save_descriptor
    from node.run.daemon import start_swarm_transport
    from tests.swarm.conftest import fast_settings

    monkeypatch.setenv("SWARM_NODE_KNOWN_SWARMS", str(tmp_path / "known"))
    key, peer = host_key(tmp_path)
    address = f"/ip4/127.0.0.1/tcp/{free_port()}/p2p/{peer}"
    descriptor = make_descriptor(tmp_path, [address], **{"swarm.epoch_seconds": EPOCH})
    proc = HostProcess(tmp_path, descriptor, loopback_listen(address))
    try:
        member = make_transport(initial_peers=[address], epoch_seconds=EPOCH)
        assert member.publish(make_batch(member.identity)) is not None  # the host pulls it: the member answers
        mine = member.visible_multiaddrs()
        assert wait_for(lambda: set(listed_members(proc.get("swarm.yaml")[1].decode())) & set(mine), timeout=30), \
            proc.get("swarm.yaml")[1].decode()[-600:]
        served = proc.get("swarm.yaml")[1]
        parse_descriptor(served).verify()  # the list is no part of what is signed
    finally:
        assert proc.stop() == 0, proc.stderr()[-2000:]
    copy = tmp_path / "copy.yaml"
    copy.write_bytes(served)
    run = tmp_path / "newcomer"
    run.mkdir()
    cfg, notes, d, members = join_config(str(ROOT / "configs" / "public-swarm.yaml"), [f"run_dir={run}"], str(copy),
                                         owner=None, extra_peers=[])
    assert cfg.swarm.initial_peers == [address] and set(members) & set(mine)
    assert any("member(s) the descriptor lists" in n for n in notes), notes
    save_descriptor(run, d, members)
    settings = fast_settings(initial_peers=cfg.swarm.initial_peers, client_mode="auto", epoch_seconds=EPOCH)
    newcomer = start_swarm_transport(settings, Identity.generate(), remembered_peers(run))
    try:
        member_id = mine[0].rsplit("/p2p/", 1)[1]
        assert wait_for(lambda: member_id in newcomer.network_status().neighbours, timeout=30), \
            newcomer.network_status()
    finally:
        newcomer.close()


def _one_line_error(tmp_path: Path, descriptor: Path | str, *extra: str) -> str:
    env = {**os.environ, "SWARM_NODE_KNOWN_SWARMS": str(tmp_path / "known"), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(host_command("--swarm", str(descriptor), "--run-dir", str(tmp_path / "host"), *extra),
                          capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_host_mistakes_are_one_line_and_exit_2(tmp_path: Path) -> None:
    key, peer = host_key(tmp_path)
    other = f"/ip4/127.0.0.1/tcp/{free_port()}/p2p/12D3KooWSGJwbGPGkUnb1XsUSZox7jyoFP1HhmHPF5USADDTe8zk"
    line = _one_line_error(tmp_path, make_descriptor(tmp_path, [other]))
    assert f"its peer id {peer} is none of the swarm's hosts" in line
    mine = make_descriptor(tmp_path, [f"/ip4/127.0.0.1/tcp/{free_port()}/p2p/{peer}"])
    line = _one_line_error(tmp_path, mine, "swarm.epoch_seconds=30")
    assert line.startswith("swarm-node: error: swarm.epoch_seconds=30 is set locally")
    assert "swarm.client_mode" in _one_line_error(tmp_path, mine, "swarm.client_mode=true")
    tampered = tmp_path / "tampered.yaml"
    tampered.write_text(mine.read_text().replace("swarm.key_shards: 4", "swarm.key_shards: 8"))
    assert "does not match the content" in _one_line_error(tmp_path, tampered)
    started = time.monotonic()
    assert "cannot fetch it" in _one_line_error(tmp_path, f"http://127.0.0.1:{free_port()}/swarm.yaml")
    assert time.monotonic() - started < 60


def _listen(port: int) -> Any:
    """A socket listening on 127.0.0.1:``port`` (0: any) with SO_REUSEPORT, as p2pd listens."""
    import socket

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen()
    return sock


def test_a_taken_port_is_one_line_naming_it_and_exit_2(tmp_path: Path) -> None:
    """A port another process listens on (with SO_REUSEPORT, as p2pd does: a second p2pd would share it
    without a word) is refused before anything starts, in one line: the swarm port of a member and of a host,
    and a status page's port (a member's and a host's), whose hint names a port that is free now even when the
    next one is taken too. Mutations caught: a hint of ``port + 1`` whatever listens there, the host's own
    ``api.port`` left unchecked (it started; no exit 2), and a second line (a traceback) after the error."""
    import socket

    with contextlib.ExitStack() as stack:
        taken = stack.enter_context(_listen(0))
        port = taken.getsockname()[1]
        with contextlib.suppress(OSError):  # the next port taken too, where it was free
            stack.enter_context(_listen(port + 1))
        env = {**os.environ, "SWARM_NODE_KNOWN_SWARMS": str(tmp_path / "known"), "PYTHONPATH": str(ROOT)}
        member = subprocess.run([sys.executable, "-m", "node.cli", "start", "-c", "configs/tiny-swarm.yaml", "--run-dir",
                                 str(tmp_path / "m"), f"swarm.host_maddrs=[/ip4/127.0.0.1/tcp/{port}]"],
                                capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
        lines = member.stderr.strip().splitlines()
        assert member.returncode == 2 and len(lines) == 1, member.stderr
        assert lines[0].startswith(f"swarm-node: error: swarm.host_maddrs: port {port} (/ip4/127.0.0.1/tcp/{port}) "
                                   "is taken"), lines
        assert not (tmp_path / "m").exists()  # nothing left behind
        api = subprocess.run([sys.executable, "-m", "node.cli", "start", "-c", "configs/tiny-swarm.yaml", "--run-dir",
                              str(tmp_path / "m"), f"api.port={port}"],
                             capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
        lines = api.stderr.strip().splitlines()
        assert api.returncode == 2 and len(lines) == 1, api.stderr
        assert lines[0].startswith(f"swarm-node: error: api.port: port {port} on 127.0.0.1 is taken"), lines
        hinted = int(lines[0].split("e.g. api.port=")[1].split(" ")[0])
        assert hinted > port, lines
        with socket.socket() as probe:  # the port it names is free (the next one was not): a listener binds it
            probe.bind(("127.0.0.1", hinted))
        _, peer = host_key(tmp_path)
        mine = make_descriptor(tmp_path, [f"/ip4/127.0.0.1/tcp/{port}/p2p/{peer}"])
        line = _one_line_error(tmp_path, mine, "api.port=0")
        assert line.startswith(f"swarm-node: error: swarm.host_maddrs: port {port} (/ip4/0.0.0.0/tcp/{port}) is taken")
        free = make_descriptor(tmp_path, [f"/ip4/127.0.0.1/tcp/{free_port()}/p2p/{peer}"])
        line = _one_line_error(tmp_path, free, f"api.port={port}", "api.host=127.0.0.1")
        assert line.startswith(f"swarm-node: error: api.port: port {port} on 127.0.0.1 is taken"), line
