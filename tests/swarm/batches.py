"""Small, valid rollout batches for swarm tests (built with protocol's records)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from protocol.identity import Identity
from protocol.records import Rollout, RolloutBatch, RolloutGroup, SamplingParams
from protocol.taskref import TaskRef


def make_batch(
    identity: Identity, *, n_groups: int = 2, group_size: int = 2, text: str = "42", index: int = 0
) -> RolloutBatch:
    """A batch of ``n_groups`` arithmetic tasks with ``group_size`` completions each."""
    groups = []
    for g in range(n_groups):
        task = TaskRef(source="arith", dataset="add", config_hash="c0ffee", seed=7, index=index * 1000 + g)
        rollouts = tuple(
            Rollout(
                task=task,
                prompt=f"What is {g} + {k}?",
                completion=text,
                completion_ids=(1, 2, 3),
                tokenizer_fingerprint="tok-test",
                behavior_logprobs=(-0.5, -0.25, -1.0),
                sampling=SamplingParams(temperature=1.0, top_p=1.0),
                model_fingerprint="model-test",
                policy_step=3,
                finish_reason="eos",
                reward=1.0,
            )
            for k in range(group_size)
        )
        groups.append(RolloutGroup(task=task, rollouts=rollouts))
    return RolloutBatch(
        swarm_id="test-swarm",
        author=identity.public_key,
        address=(),
        epoch=0,
        seq=0,
        created_at=time.time(),
        groups=tuple(groups),
    )



class Publishing:
    """Each of ``nodes`` (transports) publishes a fresh batch every ``every`` seconds, on a thread of its own,
    until ``stop()``: members that keep talking while a test kills and restarts their host."""

    def __init__(self, nodes: Sequence[Any], every: float) -> None:
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._publish, args=(k, node, every), daemon=True)
                         for k, node in enumerate(nodes)]
        for thread in self._threads:
            thread.start()

    def _publish(self, k: int, node: Any, every: float) -> None:
        i = 0
        while not self._stop.wait(every):
            node.publish(make_batch(node.identity, index=100 * k + i))
            i += 1

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10)


def published_per_epoch(traces: Sequence[Path], epoch_seconds: float) -> dict[int, int]:
    """Epoch -> the batches the members whose ``traces`` these are stored a manifest of (``pub`` events)."""
    out: dict[int, int] = {}
    for trace in traces:
        for line in trace.read_text().splitlines():
            event = json.loads(line)
            if event.get("ev") == "pub" and event.get("ok"):
                epoch = int(float(event["created"]) // epoch_seconds)
                out[epoch] = out.get(epoch, 0) + 1
    return out


def saved_pulled(members_json: Path, epoch_index: int) -> int:
    """The batches of ``epoch_index`` a host's saved member table (``members.json``) holds as pulled (0 while the
    file is missing or half-written)."""
    try:
        doc = json.loads(members_json.read_text())
    except (OSError, ValueError):
        return 0
    return sum(len(m["epochs"].get(str(epoch_index), [[], [], []])[1]) for m in doc["members"])
