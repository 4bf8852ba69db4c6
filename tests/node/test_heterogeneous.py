"""A heterogeneous swarm for real: a tiny-base node (character tokenizer, Llama) and a small-base node
(byte-level BPE, Qwen2) on the same arith tasks exchange rollouts, in memory and over two hivemind
transports on 127.0.0.1. Each re-tokenizes the other's text, re-scores it with its own verifier, computes
its own anchor log-probs, and trains its adapters (never its base weights) on the other's groups.

small-base (built once by the ``small_base`` fixture) is right on a minority of additions, so in a short run
its groups may all lack mixed rewards: the tiny node is required to re-tokenize and re-score them, and to
train on them where one has a learning signal; the small node always trains on the tiny node's groups."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

from node.config import NodeConfig, load_config
from node.policy.logprobs import left_pad, right_pad, sequence_logprobs
from node.run.daemon import start_swarm_transport
from node.run.node import Node
from node.train.groups import TrainGroup, assign_advantages
from protocol.records import RolloutBatch
from swarm.memory import InMemoryHub
from tests.node.conftest import FAST

PAIR = {"tiny": "configs/tiny-swarm.yaml", "small": "configs/small-swarm.yaml"}
SEEDS = {"tiny": 1, "small": 2}
COMMON = [*FAST, "sapo.local_groups=4", "sapo.generated_groups=4", "sapo.external_groups=4", "train.steps=100"]


def _config(name: str, run_dir: Path, *overrides: str) -> NodeConfig:
    return load_config(PAIR[name], [*COMMON, f"run_dir={run_dir}", f"seed={SEEDS[name]}", *overrides])


def _in_memory_node(cfg: NodeConfig, hub: InMemoryHub) -> Node:
    node = Node(cfg, show_progress=False, transport=hub.join)
    node.setup()
    return node


Ingested = list[tuple[list[RolloutBatch], list[TrainGroup]]]


def _record_ingestion(node: Node) -> Ingested:
    """Wrap the node's ingestor so every (peer batches, groups made of them) is kept for inspection."""
    seen: Ingested = []
    ingestor = node.exchange.ingestor  # type: ignore[union-attr]
    ingest_batches = ingestor.ingest_batches

    def recording(batches: list[RolloutBatch], max_groups: int) -> list[TrainGroup]:
        groups = ingest_batches(batches, max_groups)
        seen.append((list(batches), groups))
        return groups

    ingestor.ingest_batches = recording  # type: ignore[method-assign]
    return seen


def _frozen(node: Node) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in node.policy.model.named_parameters() if not p.requires_grad}


@torch.no_grad()
def _own_logprobs(node: Node, group: TrainGroup) -> list[list[float]]:
    policy = node.policy
    pad = policy.tokenizer.pad_token_id
    prompt_ids, prompt_mask = left_pad([group.prompt_ids] * len(group.completions), pad)
    comp_ids, comp_mask = right_pad(group.completions, pad, torch.long)
    lps = sequence_logprobs(policy.model, prompt_ids, prompt_mask, comp_ids, comp_mask,
                            temperature=node.cfg.generation.temperature)
    return [lps[i, : len(c)].tolist() for i, c in enumerate(group.completions)]


def _check_ingested(node: Node, seen: Ingested) -> list[TrainGroup]:
    """Every accepted completion spells a peer's text in our tokens and carries our own reward for it;
    returns the groups."""
    tok = node.policy.tokenizer
    groups = []
    for batches, made in seen:
        rollouts = [(rg.task, r) for b in batches for rg in b.groups for r in rg.rollouts]
        assert all(r.tokenizer_fingerprint != node.policy.tokenizer_fingerprint for _, r in rollouts)
        refs = {ref.key(): ref for ref, _ in rollouts}
        for group in made:
            task = node.source.task(refs[group.key])
            texts = [tok.decode(c, skip_special_tokens=True) for c in group.completions]
            assert set(texts) <= {r.completion for ref, r in rollouts if ref.key() == group.key}
            assert group.rewards == [node.source.score(task, t) for t in texts]
            if len(set(group.rewards)) > 1:  # our own anchor; a flat group has no signal and is not anchored
                assert all(len(a) == len(c) for a, c in zip(group.anchor_logprobs, group.completions))
            else:
                assert all(not a for a in group.anchor_logprobs)
            groups.append(group)
    return groups


def _train_on(node: Node, groups: list[TrainGroup], *, required: bool = True) -> None:
    """One trainer step on peer groups only: adapters move, base weights do not."""
    with_signal = assign_advantages(groups, node.cfg.train.advantage)
    if not required and not with_signal:
        return
    assert with_signal, "no peer group with mixed rewards to learn from"
    frozen = _frozen(node)
    before = {k: v.clone() for k, v in node.policy.trainable_state().items()}
    stats = node.trainer.step(with_signal)
    after = node.policy.trainable_state()
    assert stats["n_tokens"] > 0
    assert any(not torch.equal(before[k], after[k]) for k in after)
    assert all(torch.equal(frozen[k], v) for k, v in _frozen(node).items())


def test_tiny_and_small_nodes_train_on_each_others_groups_in_memory(tmp_path, small_base):
    hub = InMemoryHub()
    nodes = {name: _in_memory_node(_config(name, tmp_path / name), hub) for name in PAIR}
    try:
        tiny, small = nodes["tiny"], nodes["small"]
        assert tiny.policy.tokenizer_fingerprint != small.policy.tokenizer_fingerprint
        assert tiny.source.config_hash == small.source.config_hash
        seen = {name: _record_ingestion(node) for name, node in nodes.items()}
        frozen = {name: _frozen(node) for name, node in nodes.items()}
        rows: dict[str, list[dict[str, Any]]] = {name: [] for name in nodes}
        for _ in range(3):
            for name, node in nodes.items():
                rows[name].append(node.train_step())
            hub.epoch += 1
        for name, node in nodes.items():
            ingestor = node.exchange.ingestor  # type: ignore[union-attr]
            groups = _check_ingested(node, seen[name])
            assert groups and ingestor.retokenized > 0, name
            if name == "small":
                assert sum(r["n_peer_groups"] for r in rows[name]) > 0, f"{name} trained on no peer group"
            assert all(torch.equal(frozen[name][k], v) for k, v in _frozen(node).items())
            # Anchors are our own log-probs of the re-tokenized text at ingestion (recomputed here on a fresh
            # batch, whose groups the adapters have not trained on yet).
            batches = next(batches for batches, made in reversed(seen[name]) if made)
            for group in ingestor.ingest_batches(batches, max_groups=64):
                if len(set(group.rewards)) == 1:
                    continue  # no signal, not anchored (checked above)
                for anchor, own in zip(group.anchor_logprobs, _own_logprobs(node, group)):
                    assert anchor == pytest.approx(own, abs=1e-5)
            _train_on(node, groups, required=name == "small")
    finally:
        for node in nodes.values():
            node.close()


def _p2pd_children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True) if "p2pd" in p.name()}


def assert_no_p2pd_left(before: set[int], timeout: float = 15.0) -> None:
    """Every p2pd daemon started since ``before`` (``_p2pd_children()`` then) has exited within ``timeout``."""
    deadline = time.monotonic() + timeout
    while _p2pd_children() - before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _p2pd_children() - before, "p2pd left behind"


def test_tiny_and_small_nodes_exchange_over_real_transports(tmp_path, small_base):
    swarm = ["swarm.epoch_seconds=5", "swarm.startup_timeout=30", "swarm.swarm_id=hetero-test"]
    nodes: dict[str, Node] = {}
    before = _p2pd_children()
    try:
        nodes["tiny"] = Node(_config("tiny", tmp_path / "tiny", *swarm), show_progress=False,
                             transport=start_swarm_transport)
        nodes["tiny"].setup()
        transport = nodes["tiny"].exchange.transport  # type: ignore[union-attr]
        assert transport.wait_until_up(30)
        address = ",".join(transport.visible_multiaddrs())
        joining = _config("small", tmp_path / "small", *swarm, f"swarm.initial_peers=[{address}]")
        nodes["small"] = Node(joining, show_progress=False, transport=start_swarm_transport)
        nodes["small"].setup()
        seen = {name: _record_ingestion(node) for name, node in nodes.items()}
        peer_groups = dict.fromkeys(nodes, 0)

        def retokenized(node: Node) -> int:
            return int(node.exchange.metrics()["ingest_retokenized"])  # type: ignore[union-attr]

        # Steps until the small node has trained on the tiny node's groups and the tiny node has re-tokenized
        # some of the small node's (a wide deadline: the mechanism is asserted, not the time it takes).
        deadline = time.monotonic() + 300
        while (peer_groups["small"] == 0 or retokenized(nodes["tiny"]) == 0) and time.monotonic() < deadline:
            for name, node in nodes.items():
                peer_groups[name] += node.train_step()["n_peer_groups"]
            time.sleep(0.2)
        assert peer_groups["small"] > 0, f"peer groups trained on: {peer_groups}"
        for name, node in nodes.items():
            metrics = node.exchange.metrics()  # type: ignore[union-attr]
            assert metrics["batches_accepted"] > 0 and metrics["ingest_retokenized"] > 0, name
            _train_on(node, _check_ingested(node, seen[name]), required=name == "small")
    finally:
        for node in nodes.values():
            node.close()
    assert_no_p2pd_left(before)
