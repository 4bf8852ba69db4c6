"""The status API of two real swarm nodes (hivemind, p2pd, 127.0.0.1) in this process, stepped by the test:
per-peer numbers agree with the peer book and with what the other node counted; a killed network shows
as down with its reason, and as restarted after the next step."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import signal
import statistics
import time
import urllib.error
import urllib.request

import pytest

from node.api.client import EXIT_OK, status_command
from node.api.metrics import read_metrics
from node.config import with_initial_peers
from node.run.daemon import start_swarm_transport
from node.run.node import Node
from swarm.transport import SwarmTransport
from tests.chromium import Chromium, chromium_or_skip
from tests.node.conftest import make_config
from tests.node.test_api import wait_until

SWARM = ["sapo.external_groups=4", "swarm.swarm_id=api-test", "swarm.collect_interval=0.2", "swarm.request_timeout=3",
         "swarm.join_retry_seconds=0.5", "swarm.join_retry_max_seconds=2", "swarm.startup_timeout=30", "api.port=0"]
GROUPS_PER_BATCH = 4  # sapo.local_groups in FAST: every step shares 4 groups (steps between two allowed
# publications go out together, so a batch holds a multiple of 4)


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def transport(node: Node) -> SwarmTransport:
    assert node.exchange is not None and isinstance(node.exchange.transport, SwarmTransport)
    return node.exchange.transport


def libp2p_id(node: Node) -> str:
    return transport(node).visible_multiaddrs()[0].rsplit("/p2p/", 1)[1]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("api-swarm")
    nodes: list[Node] = []
    try:
        a = Node(make_config(str(root / "a"), *SWARM), show_progress=False, transport=start_swarm_transport)
        nodes.append(a)
        a.setup()
        assert transport(a).wait_until_up(30)
        cfg_b = with_initial_peers(make_config(str(root / "b"), *SWARM, "seed=1"), transport(a).visible_multiaddrs())
        b = Node(cfg_b, show_progress=False, transport=start_swarm_transport)
        nodes.append(b)
        b.setup()
        assert transport(b).wait_until_up(30)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # until each trained on groups of the other
            rows = [a.train_step(), b.train_step()]
            used = [sum(r["n_peer_groups"] for r in read_metrics(n.run_dir / "metrics.jsonl")) for n in (a, b)]
            if all(u > 0 for u in used) and all(r["batches_accepted"] >= 2 for r in rows):
                break
        else:
            raise AssertionError("the two nodes did not exchange groups in 120 s")
        # Let the last batches arrive: the books stop changing once nobody publishes.
        wait_until(lambda: _settled(a) and _settled(b), 30, "the peer books to settle")
        yield a, b
    finally:
        for node in reversed(nodes):
            node.close()
        gc.collect()  # hivemind's finalizers now, not inside pytest's assertion rewriter (see tests/swarm/conftest.py)


def _settled(node: Node) -> bool:
    before = transport(node).peer_stats()
    time.sleep(1.0)
    return [(r.peer_id, r.batches_accepted, r.bytes_in, r.bytes_out) for r in before] == \
        [(r.peer_id, r.batches_accepted, r.bytes_in, r.bytes_out) for r in transport(node).peer_stats()]


def test_peers_agree_with_the_peer_book_and_with_the_other_node(pair):
    a, b = pair
    time.sleep(1.1)  # past the API's one-second answer cache
    docs = {n: get_json(n.api.url + "api/peers") for n in (a, b)}
    for me, other in ((a, b), (b, a)):
        doc, book = docs[me], transport(me).peer_stats()
        assert [row["peer_id"] for row in doc["peers"]] == [r.peer_id for r in book]
        [row] = [r for r in doc["peers"] if r["peer_id"] == other.exchange.identity.peer_id]
        [mine] = [r for r in book if r.peer_id == other.exchange.identity.peer_id]
        assert (row["batches_accepted"], row["groups_accepted"], row["rejected"], row["bytes_in"], row["bytes_out"]) == \
            (mine.batches_accepted, mine.groups_accepted, mine.rejected, mine.bytes_in, mine.bytes_out)
        assert row["last_seen"] == pytest.approx(mine.last_seen, abs=0.01) and row["banned_until"] is None
        assert row["batches_accepted"] >= 2 and row["groups_accepted"] % GROUPS_PER_BATCH == 0
        assert GROUPS_PER_BATCH * row["batches_accepted"] <= row["groups_accepted"] <= other.exchange.groups_shared
        assert row["connected"] is True and row["published"] is True
        assert row["groups_ingested"] == me.exchange.ingestor.by_peer[other.exchange.identity.peer_id][0] > 0
        trained = sum(r["n_peer_groups"] for r in read_metrics(me.run_dir / "metrics.jsonl"))
        assert 0 < row["groups_trained"] == trained <= row["groups_ingested"]  # the only peer: all of them
        # the screen's running figures of this peer's completions, as its book holds them, and an honest peer unbanned
        verdicts = me.exchange.ingestor.verdicts
        assert row["screen"] == verdicts.summary(other.exchange.identity.peer_id) and row["screen"]["judged"] > 0
        assert row["screen"]["failed"] <= row["screen"]["judged"] and row["screen_paused"] is False
        stats = transport(me).stats()
        assert sum(r["batches_accepted"] for r in doc["peers"]) == stats["batches_accepted"]
        assert sum(r["bytes_in"] for r in doc["peers"]) == stats["bytes_in"]
        assert doc["own"] == {"peer_id": me.exchange.identity.peer_id, "batches_published": me.exchange.seq,
                              "groups_published": me.exchange.groups_shared}
    # What one node pulled from the other is what the other served to it (two nodes: every pull is direct).
    row_ab = next(r for r in docs[a]["peers"] if r["peer_id"] == b.exchange.identity.peer_id)
    row_ba = next(r for r in docs[b]["peers"] if r["peer_id"] == a.exchange.identity.peer_id)
    assert row_ab["bytes_out"] == row_ba["bytes_in"] > 0 and row_ba["bytes_out"] == row_ab["bytes_in"] > 0


def test_status_and_metrics_agree_with_metrics_jsonl(pair):
    a, b = pair
    status = get_json(a.api.url + "api/status")
    rows = read_metrics(a.run_dir / "metrics.jsonl")
    assert (status["mode"], status["peer_id"], status["swarm_id"]) == ("swarm", a.exchange.identity.peer_id, "api-test")
    assert status["step"] == a.step == rows[-1]["step"] and status["last_reward"] == rows[-1]["reward_mean"]
    assert status["groups_trained"] == {"own": rows[-1]["n_local_groups"], "peers": rows[-1]["n_peer_groups"]}
    assert status["network"]["connected"] is True and status["network"]["reason"] == "joined: 1 DHT neighbour"
    assert status["network"]["neighbours"] == [libp2p_id(b)]
    assert status["published"]["batches"] == a.exchange.seq
    assert get_json(a.api.url + "api/metrics?since=0")["rows"] == rows
    body = urllib.request.urlopen(a.api.url + "metrics", timeout=10).read().decode()
    assert f"swarm_node_batches_accepted_total {float(rows[-1]['batches_accepted'])}" in body
    assert "swarm_node_connected 1.0" in body and "swarm_node_dht_neighbours 1.0" in body


def test_status_in_swarm_mode_gives_the_median_of_the_recent_steps(pair):
    a, _ = pair
    status = get_json(a.api.url + "api/status")
    rows = read_metrics(a.run_dir / "metrics.jsonl")[-20:]  # the node keeps the last 20 steps
    assert len(rows) >= 2
    recent = status["recent"]
    assert recent["steps"] == len(rows)
    assert recent["step_seconds_median"] == statistics.median(r["step_seconds"] for r in rows)
    assert recent["tokens_per_s_median"] == statistics.median(r["tokens_per_s"] for r in rows)
    code, text = status_command(a.api.url, None)
    assert code == EXIT_OK and f"(median of the last {len(rows)} steps; last step" in text


def test_dashboard_peers_table_shows_what_the_api_says(pair):
    exe = chromium_or_skip()
    a, b = pair
    shot = a.run_dir / "dashboard.png"

    async def look() -> list[dict]:
        async with Chromium(exe) as browser:
            page = await browser.open(a.api.url, 1280, 1000)
            await page.wait_for("document.querySelectorAll('#peers tbody tr[data-peer]').length > 0")
            cells = await page.evaluate("""[...document.querySelectorAll('#peers tbody tr[data-peer]')].map(tr =>
                Object.fromEntries([...tr.cells].map(td => [td.dataset.field, td.dataset.value])))""")
            await page.screenshot(shot)
            assert not browser.exceptions, browser.exceptions
            return cells

    cells = asyncio.run(look())
    api = get_json(a.api.url + "api/peers")["peers"]
    assert [c["peer"] for c in cells] == [r["peer_id"] for r in api] == [b.exchange.identity.peer_id]
    for field in ("batches_accepted", "groups_accepted", "groups_ingested", "bytes_in", "bytes_out"):
        assert int(cells[0][field]) == api[0][field], field
    assert cells[0]["connected"] == "true" and json.loads(cells[0]["rejected"]) == api[0]["rejected"]
    assert shot.stat().st_size > 10_000


def test_a_killed_network_shows_as_down_with_its_reason_then_restarted(pair):
    a, b = pair
    pid = transport(a).p2pd_pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    status = wait_until(lambda: (s := get_json(a.api.url + "api/status"))["network"]["connected"] is False and s, 20,
                        "the network to show as down")
    assert status["network"]["reason"] == "stopped: p2pd exited" and status["healthy"] is True
    code, text = status_command(a.api.url, None)
    assert code == EXIT_OK and "network  NOT CONNECTED · stopped: p2pd exited" in text  # training goes on: healthy
    wait_until(lambda: not transport(a).is_alive(), 20, "the network thread to end")
    a.train_step()  # the exchange finds its network side dead and restarts it
    # Node a is the swarm's first node: its new p2pd listens on a new port, which b does not know, but a
    # dials the peers it remembers, b among them, so it says "joining" until b answers, then "joined".
    status = wait_until(lambda: (s := get_json(a.api.url + "api/status"))["network"]["reason"].startswith("joined")
                        and s, 30, "the network side to come back and reach b")
    network = status["network"]
    assert network["restarts"] == 1 and network["last_error"] == "p2pd exited"
    assert network["connected"] and libp2p_id(b) in network["neighbours"]


def test_closing_a_node_stops_its_api(pair):
    a, b = pair
    url = b.api.url
    b.close()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url + "healthz", timeout=5)
    assert b.api is None and not (b.run_dir / "api_url").exists()
