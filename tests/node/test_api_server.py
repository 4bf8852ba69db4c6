"""The status API's pieces, mostly without a model: auth, health, binding errors, the metrics index,
Prometheus types, config checks, a resumed node. (The API of real running nodes: test_api.py and
test_api_swarm.py.)"""

from __future__ import annotations

import json
import os
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from node.api.board import NodeInfo, StatusBoard, StepSnapshot, freeze_record
from node.api.client import EXIT_OK, EXIT_UNHEALTHY, EXIT_UNREACHABLE, status_command
from node.api.metrics import render_prometheus
from node.api.metrics_index import MetricsIndex
from node.api.server import ApiServer
from node.cli import main
from node.config import API_TOKEN_ENV, ApiConfig, load_config, resolve_api
from node.errors import ConfigError

TOKEN = "s3cret-token-for-tests"


def _get(url: str, token: str | None = None) -> tuple[int, bytes, dict[str, str]]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read(), dict(resp.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), dict(exc.headers)


def _board(step: int = 3) -> StatusBoard:
    board = StatusBoard()
    board.set_info(NodeInfo(version="0.1.0", mode="silo", peer_id=None, swarm_id=None, model="tiny-base",
                            adapter="lora", run_dir="run", device="cpu · float32", total_steps=10,
                            started_at=time.time()))
    board.set_state("training")
    board.publish(StepSnapshot(step=step, record=freeze_record({"step": step, "reward_mean": 0.25}),
                               last_eval=None))
    return board


@pytest.fixture
def server(tmp_path):
    started: list[ApiServer] = []

    def start(board: StatusBoard, **cfg: object) -> ApiServer:
        api = ApiServer(ApiConfig.model_validate({"port": 0, **cfg}), board, tmp_path / "metrics.jsonl")
        api.start()
        started.append(api)
        return api

    yield start
    for api in started:
        api.stop()


def test_with_a_token_every_data_endpoint_wants_it_and_the_page_does_not(server):
    api = server(_board(), token=TOKEN)
    for path in ("api/status", "api/metrics?since=0", "api/peers", "healthz", "metrics"):
        code, body, headers = _get(api.url + path)
        assert code == 401 and headers["WWW-Authenticate"] == "Bearer", path
        assert _get(api.url + path, "wrong-" + TOKEN)[0] == 401
        assert _get(api.url + path, TOKEN)[0] == 200, path
    code, body, headers = _get(api.url)  # the page and its scripts hold no data
    assert code == 200 and b"dashboard.js" in body and "default-src 'self'" in headers["Content-Security-Policy"]
    assert _get(api.url + "static/vendor/uPlot.iife.min.js")[0] == 200
    assert status_command(api.url, None)[0] == EXIT_UNREACHABLE
    assert status_command(api.url, TOKEN)[0] == EXIT_OK


def test_healthz_fails_when_the_loop_makes_no_progress(server):
    board = _board()
    api = server(board, stall_seconds=1.0)  # wide enough for one answer on a loaded machine
    board.beat()
    assert json.loads(_get(api.url + "healthz")[1])["ok"] is True
    time.sleep(1.5)
    code, body, _ = _get(api.url + "healthz")
    assert code == 503 and json.loads(body)["ok"] is False
    code, text = status_command(api.url, None)
    assert code == EXIT_UNHEALTHY and "STALLED" in text
    board.publish(StepSnapshot(step=4, record=freeze_record({"step": 4}), last_eval=None))
    assert _get(api.url + "healthz")[0] == 200
    board.set_state("finished")  # a node that is done is not stalled
    time.sleep(1.5)
    assert _get(api.url + "healthz")[0] == 200


def test_a_port_in_use_is_a_config_error(server):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(ConfigError, match=f"api.port: cannot listen on 127.0.0.1:{port}"):
            server(_board(), port=port)


def test_stop_closes_the_port(server):
    api = server(_board())
    assert _get(api.url + "healthz")[0] == 200
    api.stop()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(api.url + "healthz", timeout=5)
    assert status_command(api.url, None, timeout=2)[0] == EXIT_UNREACHABLE


def test_public_bind_needs_a_token(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(API_TOKEN_ENV, raising=False)
    rc = main(["silo", "--run-dir", str(tmp_path), "api.host=0.0.0.0", "api.port=0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "api.host" in err[0] and API_TOKEN_ENV in err[0]
    cfg = load_config(None, ["api.host=0.0.0.0", "api.port=0"])
    monkeypatch.setenv(API_TOKEN_ENV, TOKEN)
    assert resolve_api(cfg).token == TOKEN
    assert resolve_api(load_config(None, ["api.host=::1", "api.port=0"]), {}).token is None  # loopback
    with pytest.raises(ConfigError, match="at least 16"):
        resolve_api(cfg, {API_TOKEN_ENV: "short"})


def test_the_old_prometheus_section_says_where_it_went():
    with pytest.raises(ConfigError, match="metrics: section removed.*use api.port"):
        load_config(None, ["metrics.prometheus_port=9100"])


def test_metrics_index_reads_only_whole_lines_and_follows_a_rewritten_file(tmp_path):
    path = tmp_path / "metrics.jsonl"
    index = MetricsIndex(path)
    assert index.rows_after(0, 10) == ([], False)
    rows = [json.dumps({"step": s, "reward_mean": s / 10}) for s in (1, 2, 3)]
    path.write_text(rows[0] + "\n" + rows[1] + "\n" + rows[2][:5])  # the last line is being written
    assert index.rows_after(0, 10) == ([rows[0].encode(), rows[1].encode()], False)
    with open(path, "a") as fh:
        fh.write(rows[2][5:] + "\n")
    assert index.rows_after(1, 10) == ([rows[1].encode(), rows[2].encode()], False)
    assert index.rows_after(0, 2) == ([rows[0].encode(), rows[1].encode()], True)
    assert index.rows_after(3, 10) == ([], False) and index.last_step() == 3
    tmp = tmp_path / "m.tmp"  # a resumed run rewrites the file without the steps it redoes
    tmp.write_text(rows[0] + "\n" + "{not json\n" + json.dumps({"step": 2, "x": 1}) + "\n")
    os.replace(tmp, path)
    assert index.rows_after(0, 10) == ([rows[0].encode(), json.dumps({"step": 2, "x": 1}).encode()], False)


def test_prometheus_has_counters_for_totals_and_gauges_for_levels():
    record = {"step": 7, "time": 1.5e9, "reward_mean": 0.5, "batches_accepted": 3, "connected": True,
              "batches_rejected": {"stale": 2, "bad_signature": 1}, "train/clip_frac": 0.1, "eval_accuracy": None}
    families = {f.name: f for f in text_string_to_metric_families(render_prometheus(record, {"healthy": 1.0}).decode())}
    assert families["swarm_node_steps"].type == "counter"
    assert families["swarm_node_steps"].samples[0].value == 7
    assert families["swarm_node_batches_accepted"].type == "counter"
    rejected = {s.labels["reason"]: s.value for s in families["swarm_node_batches_rejected"].samples}
    assert families["swarm_node_batches_rejected"].type == "counter" and rejected == {"stale": 2, "bad_signature": 1}
    assert families["swarm_node_reward_mean"].type == "gauge"
    assert families["swarm_node_reward_mean"].samples[0].value == 0.5
    assert families["swarm_node_train_clip_frac"].type == "gauge"
    assert families["swarm_node_connected"].samples[0].value == 1.0
    assert families["swarm_node_last_step_timestamp_seconds"].samples[0].value == 1.5e9
    assert families["swarm_node_healthy"].samples[0].value == 1.0
    assert "swarm_node_eval_accuracy" not in families  # not measured this step: absent, not zero


def test_static_files_ship_with_the_package():
    static = Path(__file__).resolve().parents[2] / "node" / "api" / "static"
    for name in ("index.html", "dashboard.js", "dashboard.css", "vendor/uPlot.iife.min.js", "vendor/uPlot.min.css",
                 "vendor/uPlot.LICENSE"):
        assert (static / name).is_file(), name
    assert "MIT License" in (static / "vendor" / "uPlot.LICENSE").read_text()
    pyproject = (static.parents[2] / "pyproject.toml").read_text()
    assert '"api/static/**/*"' in pyproject and '"aiohttp' in pyproject


def test_a_resumed_node_reports_where_it_left_off(fast_config):
    from node.api.metrics import read_metrics
    from node.run.node import Node

    first = Node(fast_config("train.steps=2"), show_progress=False)  # eval at step 2 (FAST: eval_every=2)
    first.setup()
    try:
        first.run()
    finally:
        first.close()
    node = Node(fast_config("train.steps=5", "api.port=0"), show_progress=False)
    node.setup()
    try:
        status = json.loads(_get(node.api.url + "api/status")[1])
    finally:
        node.close()
    row = read_metrics(Path(node.run_dir) / "metrics.jsonl")[-1]
    assert (status["step"], status["total_steps"], status["state"]) == (2, 5, "ready")
    assert status["last_reward"] == row["reward_mean"]
    assert status["last_eval"] == {"step": 2, "accuracy": row["eval_accuracy"]}


def test_a_deciding_node_says_in_its_status_what_it_decided():
    from node.api.client import render
    from node.api.views import health_doc, status_doc

    record = {"step": 40, "reward_mean": 0.5, "peer_decision": "does_not_pay", "peer_alignment_mean": -0.021,
              "peer_alignment_se": 0.004, "peer_alignment_n": 16, "peer_steps_taken": 12, "peer_steps_declined": 28,
              "peer_probes": 3}
    board = _board()
    board.publish(StepSnapshot(step=40, record=freeze_record(record), last_eval=None))
    doc = status_doc(board, None, 600.0)
    assert doc["peer_decision"] == {"last": "does_not_pay", "alignment_mean": -0.021, "alignment_se": 0.004,
                                    "alignments": 16, "steps_taken": 12, "steps_declined": 28, "probes": 3}
    _, health = health_doc(board, 600.0)
    text = render("http://x/", doc, {"peers": []}, health)
    assert "does_not_pay · alignment -0.021 ± 0.004 over 16 steps · peers taken 12 steps (probes 3), declined 28" \
        in text
    assert status_doc(_board(), None, 600.0)["peer_decision"] is None  # a node that does not decide
