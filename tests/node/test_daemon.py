"""``swarm-node start`` as real processes with real hivemind peers on 127.0.0.1."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from node.api.metrics import read_metrics
from tests.node.conftest import FAST
from tests.node.test_exchange import _permuted_tiny_model

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _start(run_dir: Path, *args: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "node.cli", "start", "-c", "configs/tiny-swarm.yaml", "--run-dir", str(run_dir),
           "--no-progress", *FAST, "sapo.local_groups=4", "sapo.external_groups=4", "sapo.generated_groups=4",
           "swarm.epoch_seconds=5", *args]
    return subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


class _Output:
    """A node's merged output, read by a thread from the moment a test first looks at it. A test that stopped
    reading the pipe would otherwise block the node: a tiny-model node logs kilobytes a second, a pipe holds
    64 KiB, and a node blocked in a write never reaches the end of its step to answer SIGTERM."""

    def __init__(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        self.lines: list[str] = []
        self.ended = False
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._read, args=(proc.stdout,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self.ended = True
            self._changed.notify_all()

    def until(self, found, timeout: float) -> list[str]:
        """The lines up to and including the first for which ``found`` holds (all read so far if none did
        before the output ended or ``timeout`` passed)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for i, line in enumerate(self.lines):
                    if found(line):
                        return self.lines[:i + 1]
                left = deadline - time.monotonic()
                if left <= 0 or self.ended:
                    return list(self.lines)
                self._changed.wait(min(left, 1.0))

    def text(self, timeout: float = 30.0) -> str:
        """Everything the node printed, once its output has ended (the process exited)."""
        self._thread.join(timeout)
        with self._changed:
            return "\n".join(self.lines)


_OUTPUTS: dict[subprocess.Popen, _Output] = {}  # by process object: a pid may be reused within a session


def _output(proc: subprocess.Popen) -> _Output:
    if proc not in _OUTPUTS:
        _OUTPUTS[proc] = _Output(proc)
    return _OUTPUTS[proc]


def _finish(proc: subprocess.Popen, timeout: float) -> str:
    """Wait for a node that stops on its own; its whole output."""
    proc.wait(timeout=timeout)
    return _output(proc).text()


def _read_address(proc: subprocess.Popen, timeout: float = 120.0) -> str:
    lines = _output(proc).until(lambda line: re.search(r"--initial-peers (\S+)", line) is not None, timeout)
    m = re.search(r"--initial-peers (\S+)", lines[-1]) if lines else None
    if m:
        return m.group(1)
    proc.kill()
    raise AssertionError("node printed no address")


def _children_p2pd(pid: int) -> list[psutil.Process]:
    try:
        return [c for c in psutil.Process(pid).children(recursive=True) if "p2pd" in c.name()]
    except psutil.NoSuchProcess:
        return []


def _stop(proc: subprocess.Popen) -> int:
    p2pd = _children_p2pd(proc.pid)
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    gone, alive = psutil.wait_procs(p2pd, timeout=15)
    assert not alive, f"p2pd left behind: {alive}"
    return rc


def _lines_until(proc: subprocess.Popen, marker: str, timeout: float = 120.0) -> list[str]:
    """The node's output up to and including the first line with ``marker``."""
    lines = _output(proc).until(lambda line: marker in line, timeout)
    assert any(marker in line for line in lines), "\n".join(lines[-40:])
    return lines


def test_a_node_whose_bootstrap_peer_is_dead_says_not_connected_everywhere(tmp_path):
    """One meaning of "connected" (at least one peer answered): a client-mode node, as
    configs/public-swarm.yaml runs, whose one bootstrap peer does not answer trains on, and its output, its
    log, metrics.jsonl, the status API, Prometheus, the dashboard and `swarm-node status` all say it is not
    connected, and why; none claims the network is up or that others can join through it."""
    from node.api.client import EXIT_OK
    from tests.swarm.conftest import free_port

    dead = f"/ip4/127.0.0.1/tcp/{free_port()}/p2p/12D3KooWSGJwbGPGkUnb1XsUSZox7jyoFP1HhmHPF5USADDTe8zk"
    run = tmp_path / "lonely"
    watcher = _StatusWatcher(run)
    launched = time.time()
    proc = _start(run, "swarm.client_mode=true", "api.port=0", "--initial-peers", dead)
    try:
        out = _lines_until(proc, "status API at")
        ready_at = time.time()
        watcher.join()
        metrics = run / "metrics.jsonl"
        deadline = time.monotonic() + 120
        while len(read_metrics(metrics) if metrics.exists() else []) < 3:
            assert proc.poll() is None and time.monotonic() < deadline, "the node did not train"
            time.sleep(0.5)
        url = (run / "api_url").read_text().strip()
        api_written = (run / "api_url").stat().st_mtime - launched  # before the node is ready (a stopped one removes it)
        # what each says is the subject, not how fast a node training on a loaded machine answers
        status = json.loads(urllib.request.urlopen(url + "api/status", timeout=60).read())
        prometheus = urllib.request.urlopen(url + "metrics", timeout=60).read().decode()
        shown = subprocess.run([sys.executable, "-m", "node.cli", "status", "--run-dir", str(run), "--timeout", "60"],
                               capture_output=True, text=True, timeout=240, env=ENV)
        dashboard = _dashboard_network(url)
    finally:
        rc = _stop(proc)
        rest = _output(proc).text()
    assert rc == 0, rest[-3000:]
    said = "\n".join(out)
    # `status --run-dir` answered from the moment the run dir existed: "starting", then the node's status; never
    # "not a run dir". "ready after N s" counts from the command's start, imports included.
    assert watcher.answers and not any("is not a run dir" in a for a in watcher.answers), watcher.answers
    assert any(a.startswith(f"the node in {run} is starting (pid {proc.pid},") for a in watcher.answers), \
        watcher.answers
    assert watcher.answers[-1] == "url", watcher.answers
    ready = int(re.search(r"ready after (\d+) s, counted from the command's start", said).group(1))
    # at or after the node wrote its API's URL (setup), at or before this test read the line: the lower bound is
    # the file's time, not this test's reading, which lags the node's output by tens of seconds on a loaded machine
    assert api_written - 2 <= ready <= ready_at - launched + 1, (ready, api_written, ready_at - launched)
    assert "swarm-node: not connected yet (joining" in said and "none of 1 initial peers answered" in said
    assert "client mode: dials out only, nobody can join through this node" in said
    assert "others can join" not in said and "network up" not in said
    rows = read_metrics(run / "metrics.jsonl")
    assert len(rows) >= 3 and all(r["connected"] is False and r["dht_neighbours"] == 0 for r in rows)
    assert all(r["n_peer_groups"] == 0 for r in rows) and sum(r["n_local_groups"] for r in rows) > 0  # alone
    assert "network_up" not in rows[-1]
    network = status["network"]
    assert network["connected"] is False and network["neighbours"] == []
    assert network["reason"].startswith("joining: none of 1 initial peers answered")
    assert "swarm_node_connected 0.0" in prometheus
    assert shown.returncode == EXIT_OK, shown.stderr
    assert "network  NOT CONNECTED · joining: none of 1 initial peers answered" in shown.stdout
    if dashboard is not None:
        assert dashboard == "not connected"
    log = (run / "node.log").read_text()
    assert "none of 1 initial peers answered" in log and "not connected yet: joining" in log
    assert "others can join" not in log and "node.exchange.exchange: connected:" not in log
    assert "network side started in client mode (dials out only; not connected until a peer answers)" in log


class _StatusWatcher:
    """What ``swarm-node status --run-dir RUN`` would say (``resolve_url``: the URL, or why there is none), asked
    every 50 ms in a thread from the moment ``RUN`` exists until the node's API is up; each new answer kept once."""

    def __init__(self, run: Path) -> None:
        import threading

        self.run, self.answers = run, []
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        from node.api.client import Unreachable, resolve_url
        from node.errors import ConfigError

        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.run.exists():
                try:
                    resolve_url(None, str(self.run))
                    answer = "url"
                except (ConfigError, Unreachable) as exc:
                    answer = str(exc)
                if not self.answers or self.answers[-1] != answer:
                    self.answers.append(answer)
                if answer == "url":
                    return
            time.sleep(0.05)

    def join(self) -> None:
        self._thread.join(timeout=30)


def _dashboard_network(url: str) -> str | None:
    """The dashboard's network tile, read by headless Chromium (None where Chromium is missing, outside CI)."""
    import asyncio

    from tests.chromium import Chromium, find_chromium

    exe = find_chromium()
    if exe is None:
        if os.environ.get("SWARM_NODE_REQUIRE_CHROMIUM"):
            raise AssertionError("Chromium is required here (SWARM_NODE_REQUIRE_CHROMIUM) but not installed")
        return None

    async def look() -> str:
        async with Chromium(exe) as browser:
            page = await browser.open(url, 1000, 800)
            await page.wait_for("document.getElementById('network').dataset.value !== undefined && "
                                "document.getElementById('network').textContent !== '-'")
            return str(await page.evaluate("document.getElementById('network').textContent"))

    return asyncio.run(look())


@pytest.fixture(scope="module")
def permuted_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("perm") / "tiny-permuted"
    _permuted_tiny_model(folder)
    return folder


def test_two_daemons_with_different_tokenizers_share_and_train(tmp_path, permuted_model):
    a = _start(tmp_path / "a", "train.steps=100000", "train.checkpoint_every=100000")
    try:
        addr = _read_address(a)
        b = _start(tmp_path / "b", "train.steps=25", f"model.name_or_path={permuted_model}", "seed=1",
                   "--initial-peers", addr)
        out_b, _ = b.communicate(timeout=400)
        assert b.returncode == 0, out_b[-3000:]
    finally:
        rc_a = _stop(a)
    assert rc_a == 0
    for name in ("a", "b"):
        rows = read_metrics(tmp_path / name / "metrics.jsonl")
        assert sum(r["n_peer_groups"] for r in rows) > 0, f"node {name} trained on no peer group"
        assert rows[-1]["batches_accepted"] > 0 and rows[-1]["ingest_retokenized"] > 0
        assert (tmp_path / name / "checkpoints").is_dir()


def test_a_swarm_node_without_a_seed_takes_one_from_its_identity(tmp_path):
    from node.config import load_config
    from node.run.daemon import identity_seed, with_identity_seed
    from protocol.identity import Identity

    def seed_of(run: str, *overrides: str) -> int:
        cfg = load_config("configs/tiny-swarm.yaml", [f"run_dir={tmp_path / run}", *overrides])
        return with_identity_seed(cfg).seed

    a, b = seed_of("a"), seed_of("b")
    assert a != b  # two nodes started from one config sample different tasks
    ident = Identity.load(tmp_path / "a" / "identity.pem")
    assert a == identity_seed(ident) == int(ident.peer_id[:8], 16)
    assert seed_of("a") == a  # a restarted node keeps its seed
    assert seed_of("a", "seed=7") == 7  # an explicit seed wins, even 0
    assert seed_of("c", "seed=0") == 0 and not (tmp_path / "c" / "identity.pem").exists()


@pytest.mark.slow
def test_a_fixed_port_and_p2p_identity_keep_the_printed_address_across_restarts(tmp_path):
    """The recipe for a stable bootstrap address (docs/swarm.md), through the CLI (the transport-level check,
    in the default run, is tests/swarm/test_integration.py)."""
    run = tmp_path / "boot"
    from tests.swarm.conftest import free_port

    port = free_port()
    printed = []
    for _ in range(2):
        proc = _start(run, "train.steps=0", "swarm.p2p_identity_path=p2p.key",
                      f"swarm.host_maddrs=[/ip4/127.0.0.1/tcp/{port}]")
        printed.append(_read_address(proc))
        out = _finish(proc, timeout=120)
        assert proc.returncode == 0, out[-3000:]
    assert printed[0] == printed[1]
    assert printed[0].startswith(f"/ip4/127.0.0.1/tcp/{port}/p2p/")
    assert (run / "p2p.key").is_file()  # relative to the run dir, like swarm.identity_path


@pytest.mark.slow
def test_ctrl_c_at_the_terminal_stops_the_node_cleanly(tmp_path):
    """SIGINT to the whole process group, as a terminal's Ctrl-C sends it: p2pd (in its own session) does
    not get it, so the node finishes its step, checkpoints and shuts its network down without errors."""
    cmd = [sys.executable, "-m", "node.cli", "start", "-c", "configs/tiny-swarm.yaml", "--run-dir",
           str(tmp_path / "n"), "--no-progress", *FAST, "train.steps=100000", "train.checkpoint_every=100000"]
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        _read_address(proc)
        metrics = tmp_path / "n" / "metrics.jsonl"
        deadline = time.monotonic() + 300
        while not (metrics.exists() and read_metrics(metrics)):
            assert proc.poll() is None and time.monotonic() < deadline, "the node did not train"
            time.sleep(0.5)
        p2pd = _children_p2pd(proc.pid)
        assert len(p2pd) == 1
        os.killpg(proc.pid, signal.SIGINT)
        out = _finish(proc, timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, out[-3000:]
    gone, alive = psutil.wait_procs(p2pd, timeout=15)
    assert not alive, f"p2pd left behind: {alive}"
    assert "signal 2: stopping after this step" in out and "stopped at step" in out, out[-3000:]
    for sign in ("ERROR", "Traceback", "Task exception was never retrieved", "did not stop in time"):
        assert sign not in out, out[-3000:]
    steps = [r["step"] for r in read_metrics(tmp_path / "n" / "metrics.jsonl")]
    assert (tmp_path / "n" / "checkpoints" / f"step_{steps[-1]:06d}").is_dir()


def test_what_the_daemon_prints_about_its_network_follows_one_definition():
    from node.config import load_config
    from node.run.daemon import connection_lines
    from swarm.state import NetworkStatus

    first = load_config("configs/tiny-swarm.yaml")
    joiner = load_config("configs/tiny-swarm.yaml", ["swarm.initial_peers=[/ip4/127.0.0.1/tcp/1/p2p/"
                                                      "12D3KooWSGJwbGPGkUnb1XsUSZox7jyoFP1HhmHPF5USADDTe8zk]"])
    addr = "/ip4/127.0.0.1/tcp/5/p2p/12D3KooWA"
    alone = NetworkStatus(True, "listening, no peer has answered yet", (), 0, "")
    joined = NetworkStatus(True, "joined: 1 DHT neighbour", ("12D3KooWB",), 0, "")
    dead = NetworkStatus(False, "joining: none of 1 initial peers answered (1 attempts failed)", (), 0, "")
    assert connection_lines(first, alone, [addr]) == [
        "swarm-node: not connected yet: no initial peers (the first node of a swarm); training locally until "
        "others join through its address", f"swarm-node: others can join with --initial-peers {addr}"]
    assert connection_lines(joiner, joined, [addr])[0] == \
        "swarm-node: connected: 1 peer(s) answered (joined: 1 DHT neighbour)"
    lines = connection_lines(joiner, dead, [addr])
    assert lines[0].startswith("swarm-node: not connected yet (joining: none of 1 initial peers answered")
    assert connection_lines(joiner, joined, [])[1].startswith("swarm-node: no address to share yet")
    auto = load_config("configs/tiny-swarm.yaml", ["swarm.client_mode=auto", "swarm.initial_peers=[/ip4/127.0.0.1/"
                                                   "tcp/1/p2p/12D3KooWSGJwbGPGkUnb1XsUSZox7jyoFP1HhmHPF5USADDTe8zk]"])
    checking = NetworkStatus(True, "joined: 1 DHT neighbour", ("12D3KooWB",), 0, "", client=True, reach="checking")
    assert connection_lines(auto, checking, [addr])[1].startswith(
        "swarm-node: client mode until a peer can dial this node back (client_mode: auto); meanwhile its batches "
        "are handed to 2 reachable peers")
    full = NetworkStatus(True, "joined: 1 DHT neighbour", ("12D3KooWB",), 0, "", client=False, reach="reachable at x")
    assert connection_lines(auto, full, [addr])[1] == f"swarm-node: others can join with --initial-peers {addr}"


def test_status_of_a_run_dir_follows_the_command_running_in_it(tmp_path):
    """``swarm-node status --run-dir``: a command running there (its marker, its process alive) is starting, or
    runs without a status API; a marker left by a killed process is nobody's. Mutations caught: a marker trusted
    without its process (a node killed with kill -9 would look "starting" forever), and ``api`` ignored."""
    from node.api.client import RUN_MARKER, Unreachable, resolve_url
    from node.errors import ConfigError

    def says(marker: dict | None) -> str:
        if marker is not None:
            (tmp_path / RUN_MARKER).write_text(json.dumps(marker))
        try:
            return resolve_url(None, str(tmp_path))
        except (ConfigError, Unreachable) as exc:
            return str(exc)

    now = time.time()
    assert says({"pid": os.getpid(), "started_at": now - 7, "api": True}).startswith(
        f"the node in {tmp_path} is starting (pid {os.getpid()}, 7 s since its command started")
    assert "without a status API (api.port is not set)" in says({"pid": os.getpid(), "started_at": now, "api": False})
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    assert "is not a run dir" in says({"pid": int(gone.stdout), "started_at": now, "api": True})
    (tmp_path / "config.yaml").write_text("{}")
    assert says(None).startswith(f"no node is running in {tmp_path}")
    (tmp_path / "api_url").write_text("http://127.0.0.1:1/\n")
    assert says(None) == "http://127.0.0.1:1/"


def test_a_new_run_dir_appears_with_its_marker_already_in_it(tmp_path, monkeypatch):
    """``write_run_marker`` on a folder that does not exist yet: the folder comes into being with the marker in it,
    so ``swarm-node status --run-dir`` never finds a node's fresh run dir without one ("is not a run dir"); on a
    folder that exists, the marker is replaced in place. Mutation caught: the folder made first and the marker
    written into it (a poll between the two said "not a run dir" in CI)."""
    from node.api.client import RUN_MARKER, Unreachable, resolve_url
    from node.run import rundir

    run_dir = tmp_path / "runs" / "a"
    run_dir.parent.mkdir()
    seen: list[bool] = []
    real_write = Path.write_text

    def write_text(self, *args, **kwargs):  # at the marker's write, is the run dir there under its name yet?
        seen.append(run_dir.exists())
        return real_write(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", write_text)
    rundir.write_run_marker(run_dir, api=True)
    monkeypatch.undo()
    assert seen == [False]
    assert sorted(p.name for p in run_dir.parent.iterdir()) == ["a"]  # nothing left of the staging folder
    assert json.loads((run_dir / RUN_MARKER).read_text())["pid"] == os.getpid()
    with pytest.raises(Unreachable, match="is starting"):
        resolve_url(None, str(run_dir))
    rundir.write_run_marker(run_dir, api=False)  # an existing folder: replaced in place
    assert json.loads((run_dir / RUN_MARKER).read_text())["api"] is False
    assert sorted(p.name for p in run_dir.iterdir()) == [RUN_MARKER]
