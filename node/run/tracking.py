"""Run tracking beside ``metrics.jsonl``: TensorBoard event files and Weights & Biases.

Each step, every tracker gets the row the step wrote to ``metrics.jsonl`` (numbers as scalars, counts by
reason as ``name/reason``), the reward of the node's own groups against its peers' groups as
``reward/own`` and ``reward/peers`` (one chart in TensorBoard's custom-scalars tab), and every
``tracking.histogram_every`` steps histograms of the step's advantages and of the per-token log-prob gap
(sampler against trainer, on the node's own samples). Neither tracker is required: each is off unless
configured, and its package (the ``tracking`` extra) is imported only then; a missing package is a
one-line config error at start. A tracker that fails later is closed and its failure logged once: the
node trains on.
"""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import torch

from node.config import NodeConfig, TrackingConfig
from node.errors import ConfigError

logger = logging.getLogger(__name__)

__all__ = ["TensorBoardTracker", "Tracker", "Trackers", "WandbTracker", "build_trackers", "scalars"]

_INSTALL = "pip install -e .[tracking]"
_SKIPPED = frozenset({"step", "time"})
REWARD_OWN, REWARD_PEERS = "reward/own", "reward/peers"


def scalars(row: Mapping[str, Any]) -> dict[str, float]:
    """The row's finite numbers by name (``a/b`` for a count ``b`` of a dict ``a``), plus the reward pair."""
    out: dict[str, float] = {}
    for key, value in row.items():
        if key in _SKIPPED:
            continue
        if isinstance(value, Mapping):
            out.update({f"{key}/{k}": float(v) for k, v in value.items() if _finite(v)})
        elif _finite(value):
            out[key] = float(value)
    if "reward_mean" in out:
        out[REWARD_OWN] = out["reward_mean"]
    if "peer_reward_mean" in out:
        out[REWARD_PEERS] = out["peer_reward_mean"]
    return out


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


class Tracker(Protocol):
    name: str

    def log(self, step: int, values: Mapping[str, float], histograms: Mapping[str, torch.Tensor]) -> None: ...

    def close(self) -> None: ...


class TensorBoardTracker:
    """Event files in ``RUN_DIR/tensorboard``; a resumed run drops the events of the steps it redoes."""

    name = "tensorboard"

    def __init__(self, run_dir: Path, resume_step: int) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise ConfigError(f"tracking.tensorboard needs the tensorboard package ({exc}); {_INSTALL}, or set "
                              "tracking.tensorboard=false") from None
        self.log_dir = run_dir / "tensorboard"
        self.writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=resume_step + 1 if resume_step else None,
                                    flush_secs=30)
        self.writer.add_custom_scalars({"reward": {"own groups against peers' groups (re-scored here)":
                                                   ["Multiline", [REWARD_OWN, REWARD_PEERS]]}})
        from tensorboard.compat.proto.summary_pb2 import Summary

        self._summary, self._value = Summary, Summary.Value

    def log(self, step: int, values: Mapping[str, float], histograms: Mapping[str, torch.Tensor]) -> None:
        # One event holding every scalar of the step (add_scalar writes one event each: several times the
        # cost on the training thread); TensorBoard reads both alike.
        summary = self._summary(value=[self._value(tag=key, simple_value=value) for key, value in values.items()])
        self.writer._get_file_writer().add_summary(summary, step)
        for key, tensor in histograms.items():
            if tensor.numel():
                self.writer.add_histogram(key, tensor.float(), step)

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    """A Weights & Biases run in ``RUN_DIR/wandb``, resumed under the same id when the node restarts
    (``RUN_DIR/wandb_run_id``). ``mode: offline`` writes locally only; ``wandb sync RUN_DIR/wandb/offline-run-*``
    uploads later."""

    name = "wandb"

    def __init__(self, cfg: NodeConfig, run_dir: Path) -> None:
        try:
            import wandb
        except ImportError as exc:
            raise ConfigError(f"tracking.wandb needs the wandb package ({exc}); {_INSTALL}, or remove "
                              "tracking.wandb") from None
        w = cfg.tracking.wandb
        if w is None:
            raise ValueError("WandbTracker without tracking.wandb")
        id_file = run_dir / "wandb_run_id"
        run_id = id_file.read_text().strip() if id_file.is_file() else uuid.uuid4().hex[:12]
        id_file.write_text(run_id + "\n")
        config = cfg.model_dump(mode="json")
        config["api"]["token"] = None  # never a secret
        try:
            self.run = wandb.init(project=w.project, entity=w.entity, name=w.name or run_dir.resolve().name,
                                  mode=w.mode, dir=str(run_dir), id=run_id, resume="allow", config=config,
                                  settings=wandb.Settings(silent=True, console="off"))
        except Exception as exc:  # wandb's own errors (no login for online mode, a bad entity) are many
            raise ConfigError(f"tracking.wandb: wandb.init failed ({str(exc).strip().splitlines()[0][:160]}); "
                              "check tracking.wandb.project/entity and `wandb login`, or set "
                              "tracking.wandb.mode=offline") from None
        self._histogram = wandb.Histogram

    def log(self, step: int, values: Mapping[str, float], histograms: Mapping[str, torch.Tensor]) -> None:
        data: dict[str, Any] = dict(values)
        for key, tensor in histograms.items():
            if tensor.numel():
                data[key] = self._histogram(tensor.float().tolist())
        self.run.log(data, step=step)

    def close(self) -> None:
        self.run.finish()


class Trackers:
    """The configured trackers, fed one step at a time; one that raises is closed and dropped."""

    def __init__(self, trackers: list[Tracker], histogram_every: int) -> None:
        self.trackers = trackers
        self.histogram_every = histogram_every

    def __bool__(self) -> bool:
        return bool(self.trackers)

    def wants_histograms(self, step: int) -> bool:
        return bool(self.trackers) and step % self.histogram_every == 0

    def log(self, step: int, row: Mapping[str, Any], histograms: Mapping[str, torch.Tensor] | None = None) -> None:
        if not self.trackers:
            return
        values = scalars(row)
        for tracker in list(self.trackers):
            try:
                tracker.log(step, values, histograms or {})
            except Exception as exc:  # tracking must never stop training
                logger.warning("tracking to %s failed, turned off for this run: %r", tracker.name, exc)
                self.trackers.remove(tracker)
                self._close(tracker)

    def close(self) -> None:
        for tracker in self.trackers:
            self._close(tracker)
        self.trackers = []

    @staticmethod
    def _close(tracker: Tracker) -> None:
        try:
            tracker.close()
        except Exception as exc:
            logger.warning("closing %s failed: %r", tracker.name, exc)


def build_trackers(cfg: NodeConfig, run_dir: Path, resume_step: int) -> Trackers:
    """The trackers ``cfg.tracking`` asks for (none by default)."""
    t: TrackingConfig = cfg.tracking
    trackers: list[Tracker] = []
    if t.tensorboard:
        trackers.append(TensorBoardTracker(run_dir, resume_step))
    if t.wandb is not None:
        try:
            trackers.append(WandbTracker(cfg, run_dir))
        except ConfigError:
            for tracker in trackers:
                tracker.close()
            raise
    for tracker in trackers:
        logger.info("tracking to %s", tracker.name)
    return Trackers(trackers, t.histogram_every)
