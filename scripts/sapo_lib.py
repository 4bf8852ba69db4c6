"""The core of ``bench_sapo.py``: one run = K tiny nodes in one process, sharing over an in-memory hub.

A run is described by a ``RunSpec`` (setting, loss family, I/J, seed index, steps, ...). ``run_one`` builds
K ``Node``s from ``configs/tiny-silo.yaml`` plus overrides, joins them to one ``InMemoryHub`` through the
same ``SwarmExchange`` a daemon uses (signed ``RolloutBatch`` records, re-scored by the receiver), steps
them round-robin (every node one ``train_step()``, then ``hub.epoch += 1``) and returns every node's reward
curve and final greedy accuracy. Silo runs (J = 0) get no exchange at all.

Equal generation compute: every node generates ``I + J`` groups a step whatever the split, and trains on
I of its own (those with signal) plus up to J of its peers'.
"""

from __future__ import annotations

import random
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from node.config import NodeConfig, load_config
from node.exchange import SwarmExchange
from node.runner import Node
from node.train.groups import TrainGroup
from swarm.memory import InMemoryHub

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "tiny-silo.yaml"

# Peer-data treatment: what Gensyn's code does (ratio fixed at 1) against TOPR with the corrections.
LOSS_FAMILIES: dict[str, list[str]] = {
    "grpo_onpolicy": ["train.loss=grpo", "train.advantage=grpo", "train.off_policy_correction=false"],
    "topr_corrected": ["train.loss=topr", "train.advantage=rloo", "train.off_policy_correction=true"],
    # Not in the default grid: separates the loss from the correction (TOPR with the ratio fixed at 1).
    "topr_uncorrected": ["train.loss=topr", "train.advantage=rloo", "train.off_policy_correction=false"],
}
DEFAULT_FAMILIES = ["grpo_onpolicy", "topr_corrected"]

# Task mixtures per node (node i takes entry i % len). The tiny base model is strong-ish on addition
# (greedy ~0.5) and weak on subtraction (~0.1); multiplication (~0.02) gives almost no signal, so it is
# left out. Every node lists both datasets so it can regenerate and score any peer's task.
SETTINGS: dict[str, list[list[float]]] = {
    "homogeneous": [[1.0, 0.0]],  # addition only, like the probe
    "heterogeneous": [[0.8, 0.2], [0.2, 0.8]],  # add-heavy and sub-heavy nodes, alternating
}
DATASETS = ["add", "sub"]


@dataclass(frozen=True)
class RunSpec:
    setting: str
    family: str
    local_groups: int  # I
    external_groups: int  # J
    seed_index: int
    nodes: int = 4
    steps: int = 50
    group_size: int = 8
    eval_size: int = 128
    extra: tuple[str, ...] = field(default=())  # further config overrides (tuning)
    relevance_filter: bool = False  # keep a peer group of dataset d with probability w_d / max(w) (see below)

    @property
    def split(self) -> str:
        return f"{self.local_groups}/{self.external_groups}"

    @property
    def name(self) -> str:
        tag = "-relevance" if self.relevance_filter else ""
        return f"{self.setting}-{self.family}-{self.local_groups}x{self.external_groups}{tag}-s{self.seed_index}"


def node_config(spec: RunSpec, index: int, run_dir: str) -> NodeConfig:
    """Node ``index``'s config: seed = seed_index * 100 + index, its setting's mixture, the family's loss."""
    weights = SETTINGS[spec.setting][index % len(SETTINGS[spec.setting])]
    total = spec.local_groups + spec.external_groups
    overrides = [
        f"seed={spec.seed_index * 100 + index}",
        f"run_dir={run_dir}",
        f"tasks.datasets=[{','.join(DATASETS)}]",
        f"tasks.weights=[{','.join(str(w) for w in weights)}]",
        f"tasks.eval_datasets=[{','.join(DATASETS)}]",
        f"tasks.eval_size={spec.eval_size}",
        f"generation.group_size={spec.group_size}",
        f"sapo.local_groups={spec.local_groups}",
        f"sapo.external_groups={spec.external_groups}",
        f"sapo.generated_groups={total}",
        f"train.steps={spec.steps}",
        f"train.eval_every={spec.steps}",
        f"train.checkpoint_every={10 * spec.steps + 1}",
        *LOSS_FAMILIES[spec.family],
        *spec.extra,
    ]
    return load_config(CONFIG, overrides)


class RelevanceFilter:
    """Wraps an exchange: keeps a received group of dataset ``d`` with probability ``w_d / max(w)``.

    An experiment-only stand-in for a selection policy that prefers peer groups of the node's own task
    mixture (the node's selection policies know nothing of datasets). Everything else is delegated.
    """

    def __init__(self, inner: SwarmExchange, datasets: list[str], weights: list[float], seed: int) -> None:
        self.inner = inner
        top = max(weights)
        self.keep = {d: w / top for d, w in zip(datasets, weights)}
        self.rng = random.Random(seed)

    def receive(self, step: int) -> list[TrainGroup]:
        groups = self.inner.receive(step)
        return [g for g in groups if self.rng.random() < self.keep.get(g.key.split("/")[1], 0.0)]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _build_nodes(spec: RunSpec, root: Path) -> tuple[list[Node], InMemoryHub]:
    hub = InMemoryHub()
    nodes = []
    for i in range(spec.nodes):
        cfg = node_config(spec, i, str(root / f"node{i}"))
        sharing = spec.external_groups > 0
        node = Node(cfg, show_progress=False, transport=(lambda _settings, _identity: hub.join()) if sharing else None)
        node.setup()
        if sharing and spec.relevance_filter and node.exchange is not None:
            datasets = list(cfg.tasks.datasets)
            weights = list(cfg.tasks.weights or [1.0] * len(datasets))
            node.exchange = RelevanceFilter(node.exchange, datasets, weights, seed=cfg.seed)  # type: ignore[assignment]
        nodes.append(node)
    return nodes, hub


def run_one(spec: RunSpec, threads: int = 1) -> dict[str, Any]:
    """Run ``spec``; return its curves: ``rewards[node][step]``, ``peer_groups[node][step]``, ``accuracy[node]``."""
    import torch

    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    rewards: list[list[float]] = [[] for _ in range(spec.nodes)]
    peer_groups: list[list[int]] = [[] for _ in range(spec.nodes)]
    accuracy: list[float] = [0.0] * spec.nodes
    initial: list[float] = [0.0] * spec.nodes
    with tempfile.TemporaryDirectory(prefix="bench_sapo_") as tmp:
        nodes, hub = _build_nodes(spec, Path(tmp))
        try:
            initial = [n.evaluate() for n in nodes] if spec.seed_index == 0 and spec.external_groups == 0 else []
            for _ in range(spec.steps):
                for i, node in enumerate(nodes):
                    record = node.train_step()
                    rewards[i].append(float(record["reward_mean"]))
                    peer_groups[i].append(int(record["n_peer_groups"]))
                    if "eval_accuracy" in record:
                        accuracy[i] = float(record["eval_accuracy"])
                hub.epoch += 1
        finally:
            for node in nodes:
                node.close()
    return {"spec": asdict(spec), "name": spec.name, "rewards": rewards, "peer_groups": peer_groups,
            "accuracy": accuracy, "initial_accuracy": initial, "seconds": time.perf_counter() - t0}
