"""Nodes exchanging rollout records in memory: peers' rewards are recomputed, text from a node with a
different tokenizer is re-tokenized, and both nodes train on each other's groups."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoTokenizer

from node.run.node import Node
from node.sources.embedded.tiny import tiny_base_path
from protocol.codec import decode_batch
from protocol.records import RolloutBatch
from swarm.memory import InMemoryHub
from tests.node.conftest import make_config


def _permuted_tiny_model(folder) -> None:
    """The tiny base with its vocabulary ids reversed (embedding rows permuted to match): the same
    function of text, a different tokenizer (fingerprint and ids)."""
    import json
    import shutil

    src = tiny_base_path()
    shutil.copytree(src, folder)
    tok = json.loads((src / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    n = len(vocab)
    new_id = {old: n - 1 - old for old in range(n)}
    tok["model"]["vocab"] = {t: new_id[i] for t, i in vocab.items()}
    for added in tok.get("added_tokens", []):
        added["id"] = new_id[added["id"]]
    (folder / "tokenizer.json").write_text(json.dumps(tok))
    weights = load_file(str(src / "model.safetensors"))
    perm = torch.tensor([n - 1 - i for i in range(n)])
    for name, w in weights.items():
        if w.shape[0] == n and ("embed" in name or "lm_head" in name):
            weights[name] = w[perm].contiguous()
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((src / "config.json").read_text())
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if cfg.get(key) is not None:
            cfg[key] = new_id[cfg[key]]
    (folder / "config.json").write_text(json.dumps(cfg))
    gen = folder / "generation_config.json"
    if gen.exists():
        g = json.loads(gen.read_text())
        for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
            if isinstance(g.get(key), int):
                g[key] = new_id[g[key]]
        gen.write_text(json.dumps(g))


def _node(run_dir, hub, *overrides):
    cfg = make_config(str(run_dir), "sapo.external_groups=4", "train.steps=3", *overrides)
    node = Node(cfg, show_progress=False, transport=hub.join)
    node.setup()
    return node


def _announced_batch(node):
    """The one batch announced to ``node`` and not collected yet, decoded (signature checked)."""
    ((_manifest, data),) = node.exchange.transport.pending
    return decode_batch(data)


@pytest.fixture(scope="module")
def permuted_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("permuted") / "tiny-permuted"
    _permuted_tiny_model(folder)
    return folder


def test_permuted_model_is_the_same_function_with_another_tokenizer(permuted_model):
    a = AutoTokenizer.from_pretrained(tiny_base_path())
    b = AutoTokenizer.from_pretrained(permuted_model)
    assert a("07+35=")["input_ids"] != b("07+35=")["input_ids"]
    assert b.decode(b("07+35=")["input_ids"]) == "07+35="


def test_two_nodes_with_different_tokenizers_train_on_each_other(tmp_path, permuted_model):
    hub = InMemoryHub()
    a = _node(tmp_path / "a", hub)
    b = _node(tmp_path / "b", hub, f"model.name_or_path={permuted_model}", "seed=1")
    assert a.policy.tokenizer_fingerprint != b.policy.tokenizer_fingerprint
    before = {n: {k: v.detach().clone() for k, v in x.policy.trainable_state().items()} for n, x in (("a", a), ("b", b))}
    rows = {"a": [], "b": []}
    for _ in range(3):
        rows["a"].append(a.train_step())
        rows["b"].append(b.train_step())
        hub.epoch += 1
    for name, node in (("a", a), ("b", b)):
        assert sum(r["n_peer_groups"] for r in rows[name]) > 0, f"node {name} trained on no peer group"
        assert node.exchange.ingestor.retokenized > 0
        after = node.policy.trainable_state()
        assert any(not torch.equal(before[name][k], after[k]) for k in after)
    a.close()
    b.close()


def test_peer_rewards_are_ignored_and_recomputed(tmp_path):
    hub = InMemoryHub()
    a = _node(tmp_path / "a", hub)
    b = _node(tmp_path / "b", hub)
    a.train_step()  # publishes a batch
    batch = _announced_batch(b)
    lying = dataclasses.replace(batch, groups=tuple(
        dataclasses.replace(g, rollouts=tuple(dataclasses.replace(r, reward=1.0) for r in g.rollouts))
        for g in batch.groups))
    groups = b.exchange.ingestor.ingest(lying)
    for rg, tg in zip(lying.groups, groups):
        task = b.source.task(rg.task)
        assert tg.rewards == [b.source.score(task, r.completion) for r in rg.rollouts]
    assert any(r < 1.0 for g in groups for r in g.rewards)
    # Same tokenizer: the peer's ids and behaviour log-probs are used as they are.
    assert groups[0].anchor_logprobs[0] == pytest.approx(list(lying.groups[0].rollouts[0].behavior_logprobs))
    a.close()
    b.close()


def test_unknown_tasks_are_rejected_and_counted(tmp_path):
    hub = InMemoryHub()
    a = _node(tmp_path / "a", hub)
    b = _node(tmp_path / "b", hub)
    a.train_step()
    batch = _announced_batch(b)
    bad_ref = dataclasses.replace(batch.groups[0].task, config_hash="0" * 12)
    g0 = batch.groups[0]
    bad_group = dataclasses.replace(g0, task=bad_ref, rollouts=tuple(dataclasses.replace(r, task=bad_ref)
                                                                      for r in g0.rollouts))
    forged = RolloutBatch(**{**{f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)},
                            "groups": (bad_group, *batch.groups[1:])})
    groups = b.exchange.ingestor.ingest(forged)
    assert len(groups) == len(batch.groups) - 1
    assert b.exchange.ingestor.rejected["unknown_task"] == 1
    a.close()
    b.close()


def test_a_dead_transport_is_restarted_with_backoff_and_training_goes_on(tmp_path):
    hub = InMemoryHub()
    a = _node(tmp_path / "a", hub)
    transport = a.exchange.transport
    transport.close()  # the network side dies
    a.exchange.restart_backoff = 3600.0
    calls = []
    real_restart = transport.restart

    def counting_restart():
        calls.append(1)
        real_restart()

    transport.restart = counting_restart
    rec = a.train_step()  # restarts it, then publishes
    assert calls == [1] and transport.is_alive() and rec["network_running"] and rec["connected"] is False
    transport.close()
    transport.restart = lambda: calls.append(1)  # a restart that fails to bring it back
    rec = a.train_step()
    rec = a.train_step()  # within the backoff: no second attempt, still trains locally
    assert calls == [1, 1] and not rec["network_running"] and rec["n_local_groups"] > 0
    a.close()


def test_ids_that_do_not_spell_the_scored_text_are_rejected(tmp_path):
    """A peer cannot get reward for a correct text while training us on other tokens."""
    hub = InMemoryHub()
    a = _node(tmp_path / "a", hub)
    b = _node(tmp_path / "b", hub)
    a.train_step()
    batch = _announced_batch(b)
    g0 = batch.groups[0]
    task = b.source.task(g0.task)
    wrong_ids = tuple(b.policy.tokenizer("999", add_special_tokens=False)["input_ids"])
    if g0.rollouts[0].finish_reason == "eos":
        wrong_ids = (*wrong_ids, b.policy.tokenizer.eos_token_id)
    forged_rollout = dataclasses.replace(g0.rollouts[0], completion=task.answer, completion_ids=wrong_ids,
                                         behavior_logprobs=(-0.1,) * len(wrong_ids))
    forged = dataclasses.replace(batch, groups=(dataclasses.replace(g0, rollouts=(forged_rollout,)),))
    assert b.exchange.ingestor.ingest(forged) == []
    assert b.exchange.ingestor.rejected["text_mismatch"] == 1
    a.close()
    b.close()
