"""Run tracking: TensorBoard event files read back with TensorBoard's own reader, a Weights & Biases run
in offline mode written with the step's scalars (no network), and what happens when either is missing or
fails. Skipped, with the reason, where the ``tracking`` extra is not installed (``scripts/test.sh``
installs it)."""

from __future__ import annotations

import json
import sys
import time

import pytest

from node.api.metrics import read_metrics
from node.errors import ConfigError
from node.run.node import Node

try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
except ImportError as exc:  # pragma: no cover - CI installs the tracking extra
    EventAccumulator, TB_MISSING = None, str(exc)
else:
    TB_MISSING = None
try:
    import wandb  # noqa: F401
except ImportError as exc:  # pragma: no cover
    WANDB_MISSING: str | None = str(exc)
else:
    WANDB_MISSING = None


def _train(cfg, steps: int) -> list[dict]:
    node = Node(cfg, show_progress=False)
    node.setup()
    try:
        for _ in range(steps):
            node.train_step()
    finally:
        node.close()
    return read_metrics(node.run_dir / "metrics.jsonl")


@pytest.mark.skipif(TB_MISSING is not None, reason=f"tensorboard is not installed: {TB_MISSING}")
def test_tensorboard_events_hold_each_steps_scalars_and_histograms(fast_config, tmp_path):
    rows = _train(fast_config("tracking.tensorboard=true", "tracking.histogram_every=2"), 3)
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"), size_guidance={"scalars": 0, "histograms": 0})
    events.Reload()
    tags = events.Tags()
    for key in ("reward_mean", "loss", "tokens_per_s", "grad_norm", "train/logprob_gap_abs", "reward/own"):
        logged = [(e.step, e.value) for e in events.Scalars(key)]
        assert logged == [(r["step"], pytest.approx(r["reward_mean" if key == "reward/own" else key], rel=1e-6))
                          for r in rows], key
    assert [e.step for e in events.Scalars("eval_accuracy")] == [2]
    assert set(tags["histograms"]) == {"advantages", "logprob_gap"}
    assert [e.step for e in events.Histograms("advantages")] == [2]  # every histogram_every steps
    assert events.Histograms("logprob_gap")[0].histogram_value.num > 0


@pytest.mark.skipif(WANDB_MISSING is not None, reason=f"wandb is not installed: {WANDB_MISSING}")
def test_wandb_offline_writes_a_run_with_the_steps_scalars(fast_config, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    monkeypatch.setenv("WANDB_DATA_DIR", str(tmp_path / "wandb-data"))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    cfg = fast_config("tracking.wandb.project=swarm-node-test", "tracking.wandb.mode=offline")
    rows = _train(cfg, 2)
    runs = sorted((tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    (records,) = runs[0].glob("run-*.wandb")
    deadline = time.monotonic() + 60  # W&B's writer process may still be appending after finish() returned
    while sorted(history := _wandb_history(records)) != [1, 2] and time.monotonic() < deadline:
        time.sleep(0.5)
    assert sorted(history) == [1, 2]
    for row in rows:
        logged = history[row["step"]]
        for key in ("reward_mean", "loss", "tokens_per_s", "train/logprob_gap_abs"):
            assert logged[key] == pytest.approx(row[key], rel=1e-6), key
        assert logged["reward/own"] == pytest.approx(row["reward_mean"], rel=1e-6)
    run_id = (tmp_path / "run" / "wandb_run_id").read_text().strip()
    assert runs[0].name.endswith(run_id)  # a restarted node resumes the same run


def _wandb_history(path) -> dict[int, dict]:
    """The history records of a W&B run file, by step. The file is W&B's header (``:W&B``, a 2-byte magic, a
    version byte) then a LevelDB-style log: 32 KiB blocks of chunks (CRC32, 2-byte length, type: 1 whole,
    2 first, 3 middle, 4 last) holding protobuf ``Record``s."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, pieces, out = 7, 32768, b"", {}
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a chunk header is padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        if pos + 7 + length > len(data):  # a record still being written
            break
        pieces += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pieces)
            pieces = b""
            if record.WhichOneof("record_type") == "history":
                items = {item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in record.history.item}
                out[int(items["_step"])] = items
    return out


def test_a_missing_tracking_package_is_a_one_line_config_error(fast_config, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb now raises ImportError
    node = Node(fast_config("tracking.wandb.project=p"), show_progress=False)
    with pytest.raises(ConfigError, match=r"tracking.wandb needs the wandb package .*pip install -e \.\[tracking\]"):
        node.setup()
    node.close()


def test_a_tracker_that_fails_is_turned_off_and_training_goes_on(fast_config, caplog):
    node = Node(fast_config(), show_progress=False)
    node.setup()

    class Broken:
        name = "broken"
        closed = False

        def log(self, step, values, histograms):
            raise OSError("disk full")

        def close(self):
            Broken.closed = True

    node.tracking.trackers.append(Broken())
    try:
        node.train_step()
        node.train_step()
    finally:
        node.close()
    assert node.step == 2 and Broken.closed and not node.tracking.trackers
    assert "tracking to broken failed, turned off for this run" in caplog.text
