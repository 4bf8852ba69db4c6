"""A swarm of model families with three tokenizers: a Qwen3 (small-base's byte-level BPE of 2,048 ids, and
``<|endoftext|>`` as a second stop id), a Gemma 2 (Gemma's sentencepiece kind with byte fallback, a BOS,
``<end_of_turn>`` as a second stop id), a Phi-3 (a byte-level BPE of 400 ids trained here; fused q/k/v and
gate/up projections) and a Llama (the Qwen3 node's tokenizer), each an honest node of the tiny random
models of ``tests/node/families.py`` on the same arith tasks. They exchange rollouts in memory and over
hivemind on 127.0.0.1: every node reads the others' batches, re-tokenizes their text, and no node counts an
offence against another (an honest node of any family never samples what its peers punish: an id past their
tokenizer, an eos its finish reason denies, text its ids do not spell).

A random model's text is mostly not a peer's task answer, and re-tokenized it may be longer than a node takes:
rejections for reasons that are not offences (``too_long``, ``empty_group``) are expected and not asserted on.
(A character vocabulary's node beside BPE nodes: ``test_heterogeneous.py``.)"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from node.config import NodeConfig, load_config
from node.exchange.ingest import OFFENCES
from node.run.daemon import start_swarm_transport
from node.run.node import Node
from node.sources.embedded.small import train_bpe_tokenizer
from swarm.memory import InMemoryHub
from tests.node.conftest import FAST
from tests.node.families import family_tokenizer, tiny_folder
from tests.node.test_heterogeneous import _p2pd_children, assert_no_p2pd_left
from tests.node.test_special_tokens import _pushed

MEMBERS = ("qwen3", "gemma2", "phi3", "llama")
"""The Llama node shares the Qwen3 node's tokenizer, so those two check each other's ids (``bad_token_id``,
``eos_mismatch``), and the Qwen3 node also ends at ``<|endoftext|>``, where the Llama's model does not."""
COMMON = [*FAST, "sapo.local_groups=2", "sapo.generated_groups=2", "sapo.external_groups=4", "train.steps=1000",
          "generation.max_new_tokens=6", "train.eval_every=1000", "train.checkpoint_every=1000"]


@pytest.fixture(scope="module")
def member_folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    corpus = [f"{a:02d}+{b:02d}=" for a in range(30) for b in range(30)] + ["the answer is"] * 20
    tokenizers = {"phi3": train_bpe_tokenizer(corpus, vocab_size=400), "llama": family_tokenizer("qwen3")}
    return {name: tiny_folder(name, tmp_path_factory.mktemp(f"member-{name}"),
                              tokenizers.get(name) or family_tokenizer(name), seed=i)
            for i, name in enumerate(MEMBERS)}


def _config(folders: dict[str, Path], name: str, run_dir: Path, *overrides: str) -> NodeConfig:
    seed = MEMBERS.index(name) + 1
    return load_config("configs/small-swarm.yaml", [*COMMON, f"model.name_or_path={folders[name]}",
                                                    f"run_dir={run_dir}", f"seed={seed}", *overrides])


def _offences(node: Node) -> dict[str, int]:
    ingestor = node.exchange.ingestor  # type: ignore[union-attr]
    rejected = {k: v for k, v in ingestor.rejected.items() if k in OFFENCES}
    return {**rejected, **dict(ingestor.offences)}


def _seen(node: Node) -> int:
    """Peer groups this node has looked at: accepted or rejected for any reason."""
    ingestor = node.exchange.ingestor  # type: ignore[union-attr]
    return int(ingestor.accepted_groups + sum(n for k, n in ingestor.rejected.items() if k != "peer_offended"))


def _run_in_memory(folders: dict[str, Path], tmp_path: Path, steps: int) -> dict[str, Node]:
    hub = InMemoryHub()
    nodes = {name: Node(_config(folders, name, tmp_path / name), show_progress=False, transport=hub.join)
             for name in MEMBERS}
    try:
        for node in nodes.values():
            node.setup()
        fingerprints = {node.policy.tokenizer_fingerprint for node in nodes.values()}
        assert len(fingerprints) == 3 and len({n.source.config_hash for n in nodes.values()}) == 1
        width = int(nodes["qwen3"].policy.model.get_output_embeddings().weight.shape[0])
        end = nodes["qwen3"].policy.tokenizer.convert_tokens_to_ids("<|endoftext|>")
        with _pushed(width, [end], boost=6.0):  # the Qwen3 node ends often at its second stop id
            for _ in range(steps):
                for node in nodes.values():
                    node.train_step()
                hub.epoch += 1
    finally:
        for node in nodes.values():
            node.close()
    return nodes


def _check_exchange(nodes: dict[str, Node]) -> None:
    for name, node in nodes.items():
        ingestor = node.exchange.ingestor  # type: ignore[union-attr]
        assert _offences(node) == {}, (name, dict(ingestor.rejected))
        assert _seen(node) > 0, f"{name} looked at no peer group"
        assert ingestor.accepted_groups > 0 and ingestor.retokenized > 0, name
    # the Qwen3 node's completions that end at <|endoftext|> reach the Llama node by their ids
    assert nodes["llama"].exchange.ingestor.rejected["special_token"] > 0  # type: ignore[union-attr]


def test_three_families_with_three_tokenizers_exchange_in_memory_without_an_offence(member_folders, tmp_path):
    """A short run (3 steps): every node takes groups of the others' text, re-tokenized, and counts no offence
    of any kind (the 20-step run is ``slow``)."""
    _check_exchange(_run_in_memory(member_folders, tmp_path, steps=3))


@pytest.mark.slow
def test_three_families_exchange_twenty_steps_in_memory_without_an_offence(member_folders, tmp_path):
    _check_exchange(_run_in_memory(member_folders, tmp_path, steps=20))


def test_three_families_exchange_over_hivemind_on_loopback(member_folders, tmp_path):
    """The same three nodes as real hivemind peers on 127.0.0.1 (the first one's address given to the other
    two): steps until each has looked at its peers' groups; no offence; no p2pd left behind."""
    swarm = ["swarm.epoch_seconds=5", "swarm.startup_timeout=30", "swarm.swarm_id=mixed-families-test"]
    nodes: dict[str, Node] = {}
    before = _p2pd_children()
    try:
        names = MEMBERS
        first = Node(_config(member_folders, names[0], tmp_path / names[0], *swarm), show_progress=False,
                     transport=start_swarm_transport)
        nodes[names[0]] = first
        first.setup()
        transport: Any = first.exchange.transport  # type: ignore[union-attr]
        assert transport.wait_until_up(30)
        address = ",".join(transport.visible_multiaddrs())
        for name in names[1:]:
            cfg = _config(member_folders, name, tmp_path / name, *swarm, f"swarm.initial_peers=[{address}]")
            nodes[name] = Node(cfg, show_progress=False, transport=start_swarm_transport)
            nodes[name].setup()
        deadline = time.monotonic() + 240  # the mechanism is asserted, not the time it takes
        while time.monotonic() < deadline and not all(_seen(n) > 0 for n in nodes.values()):
            for node in nodes.values():
                node.train_step()
            time.sleep(0.2)
        for name, node in nodes.items():
            assert _seen(node) > 0, f"{name} looked at no peer group"
            assert _offences(node) == {}, (name, dict(node.exchange.ingestor.rejected))  # type: ignore[union-attr]
    finally:
        for node in nodes.values():
            node.close()
    assert_no_p2pd_left(before)
