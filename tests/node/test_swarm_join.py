"""``swarm-node start --swarm`` and ``swarm-node swarm init|sign|verify``: a member's config from a signed
descriptor, every shared setting refused when changed locally, the owner pinned as ssh pins host keys,
descriptors fetched from a URL within a time and size bound."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from node.cli import main
from node.config import load_config
from node.config.join import (
    REMEMBERED_PEERS,
    SHARED_SETTINGS,
    join_config,
    remember_peers,
    remembered_peers,
    shared_values,
    task_config_hash,
)
from node.errors import ConfigError
from protocol.descriptor import SwarmDescriptor, TaskSet, owner_text, parse_descriptor
from protocol.identity import Identity

ROOT = Path(__file__).resolve().parents[2]
PEER = "12D3KooWSGJwbGPGkUnb1XsUSZox7jyoFP1HhmHPF5USADDTe8zk"
HOST = f"/ip4/203.0.113.2/tcp/31337/p2p/{PEER}"
SHARED_CONFIG = str(ROOT / "configs" / "swarm-shared.yaml")
MEMBER_CONFIG = str(ROOT / "configs" / "public-swarm.yaml")


@pytest.fixture(autouse=True)
def known_swarms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "known_swarms"
    monkeypatch.setenv("SWARM_NODE_KNOWN_SWARMS", str(path))
    return path


@pytest.fixture(scope="module")
def owner() -> Identity:
    return Identity.generate()


def descriptor(owner: Identity, **changes: Any) -> SwarmDescriptor:
    cfg = load_config(SHARED_CONFIG)
    fields: dict[str, Any] = dict(
        swarm_id="tiny-public", name="Tiny public", protocol_version=1, hosts=[HOST],
        expires=datetime.now(timezone.utc) + timedelta(days=30), settings=shared_values(cfg),
        tasks=TaskSet(source="arith", datasets=["add"], config_hash=task_config_hash(cfg)),
        recommended_models={"cpu": {"model.name_or_path": "small-base"}}, owner=owner_text(owner.public_key))
    fields.update(changes)
    return SwarmDescriptor.model_validate(fields).sign(owner)


def write(tmp_path: Path, d: SwarmDescriptor, name: str = "swarm.yaml") -> str:
    path = tmp_path / name
    path.write_text(d.to_yaml())
    return str(path)


def join(source: str, *overrides: str, config: str | None = MEMBER_CONFIG, owner: str | None = None,
         peers: list[str] | None = None, run_dir: Path | None = None) -> tuple[Any, list[str]]:
    extra = [f"run_dir={run_dir}"] if run_dir is not None else []
    cfg, notes, _, _ = join_config(config, [*overrides, *extra], source, owner=owner, extra_peers=peers or [])
    return cfg, notes


def test_a_member_takes_every_shared_setting_and_the_hosts_from_the_descriptor(tmp_path: Path, owner: Identity) -> None:
    d = descriptor(owner)
    cfg, notes = join(write(tmp_path, d), run_dir=tmp_path / "run")
    assert cfg.swarm.swarm_id == "tiny-public" and cfg.swarm.initial_peers == [HOST]
    assert shared_values(cfg) == d.settings
    assert (cfg.tasks.source, cfg.tasks.datasets) == ("arith", ["add"])
    assert cfg.swarm.request_timeout == 15 and cfg.swarm.collect_interval == 2  # shared, and the member's own
    assert cfg.model.name_or_path == "small-base"  # recommended for cpu: the member config sets no model
    assert any("pinned" in n for n in notes) and any("model.name_or_path=small-base" in n for n in notes)
    cfg, _ = join(write(tmp_path, d), "model.name_or_path=tiny-base", run_dir=tmp_path / "run")
    assert cfg.model.name_or_path == "tiny-base"  # a member's own choice wins over a recommendation


def _other_value(key: str, value: Any) -> str:
    if isinstance(value, bool):
        return str(not value).lower()
    if isinstance(value, (int, float)):
        return repr(value * 2 if value else 1)
    raise AssertionError(key)


CHANGES = {**{key: None for key in SHARED_SETTINGS}, "swarm.swarm_id": "other-swarm", "tasks.source": "reasoning_gym",
           "tasks.datasets": "[add, mul]", "tasks.dataset_configs": "{add: {digits: 3}}"}


@pytest.mark.parametrize("key", sorted(CHANGES))
def test_every_shared_setting_changed_locally_is_refused_naming_it(tmp_path: Path, owner: Identity, key: str) -> None:
    d = descriptor(owner)
    source = write(tmp_path, d)
    value = CHANGES[key] or _other_value(key, d.settings[key])
    with pytest.raises(ConfigError) as info:
        join(source, f"{key}={value}")
    message = str(info.value)
    assert message.startswith(f"{key}=") and "tiny-public" in message and "\n" not in message, message
    # The same value set locally is no fork.
    same = d.settings.get(key, {"swarm.swarm_id": "tiny-public", "tasks.source": "arith", "tasks.datasets": "[add]",
                                "tasks.dataset_configs": "{}"}.get(key))
    join(source, f"{key}={same}")


def test_the_shared_list_covers_what_changes_keys_validation_and_offences() -> None:
    """Every setting a receiver's keys, record checks, quotas and offence rules read is shared; none that only
    shapes a node's own work is (a member must stay free to pick its model, NAT mode and polling)."""
    for key in ("swarm.epoch_seconds", "swarm.key_shards", "swarm.manifest_ttl", "swarm.max_manifest_ttl",
                "swarm.pull_min_rate", "swarm.stall_grace", "ingest.min_logprob", "generation.max_new_tokens"):
        assert key in SHARED_SETTINGS
    for key in ("swarm.client_mode", "swarm.collect_interval", "swarm.read_shards", "swarm.host_maddrs",
                "model.name_or_path", "generation.backend", "sapo.external_groups"):
        assert key not in SHARED_SETTINGS


def _cli_error(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["start", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_tampered_expired_and_other_protocol_descriptors_are_refused_with_one_line(
        tmp_path: Path, owner: Identity, capsys: pytest.CaptureFixture[str]) -> None:
    good = descriptor(owner).to_yaml()
    tampered = tmp_path / "tampered.yaml"
    tampered.write_text(good.replace("swarm.epoch_seconds: 60.0", "swarm.epoch_seconds: 30.0"))
    assert "does not match the content" in _cli_error(capsys, "--swarm", str(tampered), "--run-dir", str(tmp_path / "r"))
    expired = write(tmp_path, descriptor(owner, expires=datetime.now(timezone.utc) - timedelta(seconds=1)), "old.yaml")
    assert "expired at" in _cli_error(capsys, "--swarm", expired, "--run-dir", str(tmp_path / "r"))
    other = write(tmp_path, descriptor(owner, protocol_version=2), "v2.yaml")
    assert "wire protocol 2" in _cli_error(capsys, "--swarm", other, "--run-dir", str(tmp_path / "r"))
    conflict = write(tmp_path, descriptor(owner))
    line = _cli_error(capsys, "--swarm", conflict, "--run-dir", str(tmp_path / "r"), "swarm.epoch_seconds=30")
    assert line.startswith("swarm-node: error: swarm.epoch_seconds=30 is set locally")
    assert not (tmp_path / "r").exists()  # refused before any run dir is made


def test_the_owner_is_pinned_on_first_use_and_another_owner_refused(
        tmp_path: Path, owner: Identity, known_swarms: Path) -> None:
    first = descriptor(owner)
    _, notes = join(write(tmp_path, first))
    assert f"tiny-public {first.owner_fingerprint}" in known_swarms.read_text()
    assert any("first use" in n for n in notes)
    _, notes = join(write(tmp_path, first))
    assert not any("pinned" in n for n in notes)  # known: nothing to say
    stranger = Identity.generate()
    impostor = descriptor(stranger)  # valid signature, but not the pinned owner's
    with pytest.raises(ConfigError) as info:
        join(write(tmp_path, impostor, "impostor.yaml"))
    assert f"signed by {impostor.owner_fingerprint}, but {first.owner_fingerprint} is pinned" in str(info.value)
    with pytest.raises(ConfigError, match=re.escape(f"signed by {first.owner_fingerprint}, not SHA256:nope")):
        join(write(tmp_path, first), owner="SHA256:nope")
    # The owner changed keys and says so out of band: the member passes the new fingerprint, which is pinned.
    join(write(tmp_path, impostor, "impostor.yaml"), owner=impostor.owner_fingerprint)
    assert known_swarms.read_text().count("tiny-public") == 1 and impostor.owner_fingerprint in known_swarms.read_text()


def test_a_descriptor_whose_tasks_another_generator_made_is_refused(tmp_path: Path, owner: Identity) -> None:
    d = descriptor(owner, tasks=TaskSet(source="arith", datasets=["add"], config_hash="0123456789ab"))
    with pytest.raises(ConfigError, match="^tasks: this node's arith tasks have config hash"):
        join(write(tmp_path, d))


def test_a_member_whose_swarm_url_is_dead_joins_with_its_saved_descriptor(tmp_path: Path, owner: Identity) -> None:
    """Every host down: the same command starts from the copy of the descriptor the run dir kept, through the
    peers it remembers; a descriptor URL that answers with something else is refused, never replaced."""
    from node.config.join import SAVED_DESCRIPTOR, save_descriptor

    run = tmp_path / "run"
    run.mkdir()
    dead = f"http://127.0.0.1:{_free_port()}/swarm.yaml"
    with pytest.raises(ConfigError, match="cannot fetch it"):  # nothing saved yet
        join(dead, run_dir=run)
    d = descriptor(owner)
    save_descriptor(run, d)
    assert parse_descriptor((run / SAVED_DESCRIPTOR).read_text()) == d
    met = f"/ip4/203.0.113.9/tcp/31337/p2p/{PEER[:-4]}TTTT"
    remember_peers(run, [met])
    cfg, notes = join(dead, run_dir=run)
    assert cfg.swarm.swarm_id == "tiny-public" and cfg.swarm.initial_peers == [HOST]
    assert any("and the 1 peer(s) it remembers" in n for n in notes)
    assert any(n.startswith(f"{dead} does not answer; joining with the copy of the descriptor saved in") for n in notes)
    tampered = tmp_path / "tampered.yaml"
    tampered.write_text(d.to_yaml().replace("name: Tiny public", "name: Tiny private"))
    with pytest.raises(ConfigError, match="does not match the content"):  # a file: never replaced by the copy
        join(str(tampered), run_dir=run)


def test_the_members_a_descriptor_lists_are_kept_with_its_copy_and_dialed(tmp_path: Path, owner: Identity) -> None:
    """The members a host lists in the descriptor it serves (comment lines, not signed) survive the copy a member
    keeps in its run dir and are among the peers it dials; a line that is no full multiaddr is skipped. Mutations
    caught: a copy saved without them (``descriptor.to_yaml()`` alone), lines taken unchecked."""
    from node.config.join import MEMBER_LINE, SAVED_DESCRIPTOR, listed_members, save_descriptor, with_members

    d = descriptor(owner)
    met = f"/ip4/203.0.113.9/tcp/31337/p2p/{PEER[:-4]}TTTT"
    text = with_members(d.to_yaml(), [met, HOST])
    text += f"{MEMBER_LINE}/ip4/203.0.113.10/tcp/1\n{MEMBER_LINE}not a multiaddr/p2p/x\n"
    parse_descriptor(text).verify()  # comments are no part of what is signed
    assert listed_members(text) == [met, HOST]
    assert with_members(text, []) == d.to_yaml()  # replaced, not appended to
    run = tmp_path / "run"
    run.mkdir()
    save_descriptor(run, d, listed_members(text))
    saved = (run / SAVED_DESCRIPTOR).read_text()
    assert parse_descriptor(saved) == d and listed_members(saved) == [met, HOST]
    remember_peers(run, [HOST])
    assert remembered_peers(run) == [HOST, met]  # the peers it reached first, then the listed ones, each once
    cfg, notes = join(str(run / SAVED_DESCRIPTOR), run_dir=run, peers=[])
    assert any("and 1 member(s) the descriptor lists" in n for n in notes), notes  # HOST is a host, not a member


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_remembered_peers_are_named_beside_the_hosts(tmp_path: Path, owner: Identity) -> None:
    run = tmp_path / "run"
    run.mkdir()
    met = f"/ip4/203.0.113.9/tcp/31337/p2p/{PEER[:-4]}TTTT"
    remember_peers(run, [met])
    remember_peers(run, [met, HOST])
    assert remembered_peers(run) == [met, HOST] and (run / REMEMBERED_PEERS).read_text().startswith("#")
    cfg, notes = join(write(tmp_path, descriptor(owner)), run_dir=run, peers=[])
    assert cfg.swarm.initial_peers == [HOST]  # the hosts; remembered peers are dialed beside them, never taken for one
    assert any("and the 1 peer(s) it remembers" in n for n in notes)


class _Server:
    """An aiohttp server on 127.0.0.1 in its own thread: ``/ok``, ``/big``, ``/slow``, else 404."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.port = 0
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self._thread.start()
        assert self._ready.wait(10)

    async def _main(self) -> None:
        async def ok(_: web.Request) -> web.Response:
            return web.Response(body=self.body)

        async def big(_: web.Request) -> web.Response:
            return web.Response(body=b"x" * (200 * 1024))

        async def slow(request: web.Request) -> web.StreamResponse:
            answer = web.StreamResponse()
            await answer.prepare(request)
            for _ in range(60):  # a byte a second: each read succeeds, the whole never arrives in time
                await answer.write(b"#")
                await asyncio.sleep(1)
            return answer

        app = web.Application()
        app.router.add_get("/ok", ok)
        app.router.add_get("/big", big)
        app.router.add_get("/slow", slow)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = runner.addresses[0][1]
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()

    def close(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


@pytest.fixture
def server(owner: Identity) -> Iterator[_Server]:
    srv = _Server(descriptor(owner).to_yaml().encode())
    yield srv
    srv.close()


def test_a_descriptor_url_is_fetched_within_a_time_and_size_bound(server: _Server, monkeypatch: pytest.MonkeyPatch) -> None:
    base = f"http://127.0.0.1:{server.port}"
    cfg, _ = join(f"{base}/ok")
    assert cfg.swarm.swarm_id == "tiny-public"
    with pytest.raises(ConfigError, match="larger than a descriptor may be"):
        join(f"{base}/big")
    with pytest.raises(ConfigError, match="answered 404"):
        join(f"{base}/missing")
    from node.config import join as swarm_join

    monkeypatch.setattr(swarm_join, "FETCH_TIMEOUT", 2.0)
    started = time.monotonic()
    with pytest.raises(ConfigError, match="no complete answer within 2 s"):
        join(f"{base}/slow")
    # The whole body takes 60 s (a byte a second); the fetch gives up at its 2 s deadline, checked between
    # reads of a second or less: a bound far from both, so a loaded machine does not fail it.
    assert 2 <= time.monotonic() - started < 30
    with pytest.raises(ConfigError, match="cannot fetch it"):
        join("http://127.0.0.1:9/swarm.yaml")  # nothing listens on the discard port


def test_swarm_init_sign_and_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``init`` in a child process (it loads hivemind's key code without torch, which must not leak into this
    test process), then ``sign`` after an edit and ``verify``, in process."""
    out, key, host_key = tmp_path / "swarm.yaml", tmp_path / "owner.pem", tmp_path / "host" / "p2p.key"
    proc = subprocess.run(
        [sys.executable, "-m", "node.cli", "swarm", "init", "-c", SHARED_CONFIG, "--id", "demo", "--host",
         "/dns4/host.example.org/tcp/31337", "--host", HOST, "--host-key", str(host_key), "--key", str(key),
         "--out", str(out), "--recommend", "gpu-24gb:model.name_or_path=smollm2-135m,generation.backend=vllm"],
        capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    d = parse_descriptor(out.read_text())
    d.verify()
    from swarm.p2p_keys import p2p_peer_id  # the key file the host will use names the address written

    assert d.hosts == [f"/dns4/host.example.org/tcp/31337/p2p/{p2p_peer_id(host_key)}", HOST]
    assert d.recommended_models == {"gpu-24gb": {"model.name_or_path": "smollm2-135m", "generation.backend": "vllm"}}
    assert d.settings["swarm.request_timeout"] == 15 and d.owner_fingerprint in proc.stdout
    # The join command it prints is the docs' and the host's (a mutation caught: init's own, without -c and
    # --run-dir, which writes runs/node and starts no status API).
    from node.cli.host import descriptor_url, join_command

    printed = next(ln for ln in proc.stdout.splitlines() if "members join with: " in ln).split("members join with: ")[1]
    assert printed == join_command(descriptor_url(d.hosts[0], 8780))
    assert printed == "swarm-node start --swarm http://host.example.org:8780/swarm.yaml -c configs/public-swarm.yaml " \
        "--run-dir runs/public"
    assert printed in (ROOT / "docs" / "swarm.md").read_text()
    assert main(["swarm", "verify", str(out)]) == 0
    assert "is valid" in capsys.readouterr().out
    edited = yaml.safe_load(out.read_text())
    edited["name"] = "Renamed"
    out.write_text(yaml.safe_dump(edited))
    assert main(["swarm", "verify", str(out)]) == 2
    assert "does not match" in capsys.readouterr().err
    assert main(["swarm", "sign", str(out), "--key", str(key), "--expires-days", "1"]) == 0
    assert main(["swarm", "verify", str(out), "--swarm-owner", d.owner_fingerprint]) == 0
    again = parse_descriptor(out.read_text())
    assert again.name == "Renamed" and again.expires < d.expires
    assert main(["swarm", "init", "--id", "demo", "--host", HOST, "--key", str(key), "--out", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err


def test_the_peer_keeper_saves_and_hands_over_the_peers_reached(tmp_path: Path) -> None:
    from node.run.daemon import PeerKeeper

    class Transport:
        def __init__(self) -> None:
            self.neighbours = [HOST]
            self.bootstrap: list[str] = []

        def remembered_maddrs(self) -> list[str]:
            return list(self.neighbours)

        def add_bootstrap_peers(self, maddrs: list[str]) -> None:
            self.bootstrap += maddrs

    transport = Transport()
    keeper = PeerKeeper(transport, tmp_path, every=0.05)
    try:
        deadline = time.monotonic() + 5
        while not transport.bootstrap and time.monotonic() < deadline:
            time.sleep(0.05)
        assert transport.bootstrap[:1] == [HOST] and remembered_peers(tmp_path) == [HOST]
        transport.neighbours = []  # nobody left: what was remembered stays
        assert keeper.keep() == [] and remembered_peers(tmp_path) == [HOST]
    finally:
        keeper.close()


def test_the_docs_name_every_shared_setting() -> None:
    page = (ROOT / "docs" / "swarm.md").read_text()
    section = page[page.index("## What a descriptor fixes"):page.index("## Resilience")]
    missing = [key for key in [*SHARED_SETTINGS, "swarm.swarm_id", "tasks.source", "tasks.datasets",
                               "tasks.dataset_configs"] if f"`{key}`" not in section]
    assert not missing, f"docs/swarm.md, 'What a descriptor fixes', does not name {missing}"
