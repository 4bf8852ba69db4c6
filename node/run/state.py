"""``NodeState``: what a ``Node`` holds, shared by the parts ``node.run.node`` composes (``setup``,
``peers``, ``status``). The constructor sets what exists before ``setup()``; the annotations
below it name what ``setup()`` builds."""

from __future__ import annotations

import random
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from tqdm import tqdm

from node.api.board import StatusBoard
from node.api.metrics import MetricsWriter
from node.config import NodeConfig
from node.exchange.exchange import BatchTransport, SwarmExchange
from node.generation.base import GenerationBackend
from node.policy.model import Policy
from node.run.checkpoint import CheckpointManager
from node.run.tracking import Trackers
from node.tasks import Task, TaskSource
from node.train.groups import TrainGroup
from node.train.peer_value import PeerDecider
from node.train.trainer import Trainer
from protocol.identity import Identity
from swarm.settings import SwarmSettings

if TYPE_CHECKING:
    from node.api.server import ApiServer

RECENT_STEPS = 20  # the status API's speed is the median of this many recent steps

TransportFactory = Callable[[SwarmSettings, Identity], BatchTransport]
"""Builds (and starts) the transport of a swarm node from its settings and identity."""


class NodeState:
    """A training node's state; ``exchange`` is None in silo mode (no ``transport`` given)."""

    # Built by ``setup()``, in this order.
    policy: Policy
    source: TaskSource
    trainer: Trainer
    generator: GenerationBackend
    task_rng: random.Random
    select_rng: random.Random
    sample_gen: torch.Generator
    checkpoints: CheckpointManager
    metrics: MetricsWriter
    eval_tasks: list[Task]

    def __init__(self, cfg: NodeConfig, run_dir: str | Path | None = None, *, show_progress: bool = True,
                 transport: TransportFactory | None = None) -> None:
        self.cfg = cfg
        self.run_dir = Path(cfg.run_dir if run_dir is None else run_dir)
        self.show_progress = show_progress
        self.stop_requested = False
        self.step = 0
        self.exchange: SwarmExchange | None = None
        self._transport_factory = transport
        self._saved_screen: dict[str, Any] | None = None  # the checkpoint's screen state, for the exchange built after
        self._external_pool: list[TrainGroup] = []
        self._trained_by_peer: OrderedDict[str, int] = OrderedDict()  # peer groups trained on, by peer (most recent last)
        # Per step, the node's own groups by dataset: [generated, with signal] (for dataset preferences).
        self._signal_history: deque[dict[str, list[float]]] = deque(maxlen=cfg.sapo.signal_window)
        # sapo.take_peers=decide: whether peers' groups pay this node, estimated as it trains.
        sapo = cfg.sapo
        self.decider = PeerDecider(window=sapo.decide_window, warmup=sapo.decide_warmup,
                                   probe_every=sapo.decide_probe_every, min_alignment=sapo.decide_min_alignment) \
            if sapo.take_peers == "decide" else None
        self.board = StatusBoard()
        self._started_at = time.time()
        self.api: ApiServer | None = None
        self._last_eval: tuple[int, float] | None = None
        self.eval_details: dict[str, Any] = {}  # the last evaluation's metrics beyond eval_accuracy (by dataset)
        self._eval_routing: torch.Tensor | None = None  # ReMix: the held-out prompts' routing at the last one
        self._warned_too_long = False
        self._recent: deque[tuple[float, float]] = deque(maxlen=RECENT_STEPS)  # (step seconds, tokens/s)
        self.tracking = Trackers([], histogram_every=1)  # the configured ones are built in setup()
        self._bar: tqdm | None = None  # the progress bar while run() runs
