"""Hostile rollouts that attack the verifier and the re-tokenization path (attacks 11 and 12).

The victim is a ``SwarmExchange`` on a real ``SwarmTransport`` over random-weight models whose character
tokenizers can spell what the attacks need (logic symbols; a 152k-entry output vocabulary). A raw
hivemind attacker (``tests.swarm.attacker``) and an honest transport publish to it.
"""

from __future__ import annotations

import dataclasses
import json
import random
import string
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import torch

from node.config import AdapterConfig, ModelConfig
from node.exchange.exchange import SwarmExchange
from node.exchange.ingest import IngestLimits
from node.exchange.scoring import ScoringWorker, SourceSpec
from node.policy.model import Policy, build_policy
from node.tasks import TaskSource, build_task_source
from protocol.identity import Identity
from protocol.records import Rollout, RolloutBatch, RolloutGroup, SamplingParams
from protocol.taskref import TaskRef
from swarm.transport import SwarmTransport
from tests.swarm.attacker import Attacker, peer_id_of, wait_until
from tests.swarm.conftest import SWARM_ID, fast_settings, p2pd_pid

_MIB = 1024 * 1024
LOGIC = SourceSpec("reasoning_gym", ("propositional_logic",), None, 0, {"chat_template": "never"})
SLOW_NEGATIONS = 3000  # reasoning-gym's parser: ~6 s on an idle 2024 server core for this many nested negations
SCORE_LIMIT = 1.0  # the scorer's per-completion limit in these tests: several times below that, on any machine


def _char_model(folder: Path, *, vocab_size: int | None = None) -> Path:
    """A 1-layer random Llama with a character tokenizer over printable ASCII and the logic symbols."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<pad>", "<bos>", "<eos>", "<unk>"]
    chars = sorted(set(string.printable) - set("\r\x0b\x0c") | set("¬∧∨→↔"))
    backend = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate([*specials, *chars])}, merges=[],
                                   unk_token="<unk>"))
    backend.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", bos_token="<bos>",
                                  eos_token="<eos>", unk_token="<unk>", clean_up_tokenization_spaces=False)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab_size or len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096,
                      tie_word_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    LlamaForCausalLM(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    # Loaded as is (the embedded tiny-base's way): some model types would swap in a byte-level decoder.
    config_path = folder / "tokenizer_config.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()),
                                       "tokenizer_class": "PreTrainedTokenizerFast"}))
    return folder


def _policy(folder: Path) -> Policy:
    return build_policy(ModelConfig(name_or_path=str(folder), device="cpu", chat_template="never"),
                        AdapterConfig(), seed=0)


@dataclasses.dataclass
class Net:
    victim: SwarmTransport
    honest: SwarmTransport
    attacker: Attacker

    def deliver(self, honest: RolloutBatch | None, attacks: list[tuple[Identity, RolloutBatch]]) -> None:
        expected = self.victim.stats()["batches_accepted"] + len(attacks) + (honest is not None)
        epoch = self.victim.current_epoch()
        records = [self.attacker.manifest_record(a, dataclasses.replace(b, author=a.public_key, seq=k), epoch=epoch)
                   for k, (a, b) in enumerate(attacks)]
        if records:
            assert self.attacker.store_many(peer_id_of(self.victim), records) == [True] * len(records)
        if honest is not None:
            assert self.honest.publish(honest) is not None
        assert wait_until(lambda: self.victim.stats()["batches_accepted"] >= expected, timeout=20)


@pytest.fixture(scope="module")
def net() -> Iterator[Net]:
    victim = SwarmTransport(fast_settings(epoch_seconds=600), Identity.generate())
    honest: SwarmTransport | None = None
    attacker: Attacker | None = None
    try:
        victim.start(wait=True)
        p2pd_pid(victim)
        honest = SwarmTransport(fast_settings(initial_peers=victim.visible_multiaddrs(), epoch_seconds=600),
                                Identity.generate())
        honest.start(wait=True)
        p2pd_pid(honest)
        attacker = Attacker(SWARM_ID, victim.visible_multiaddrs())
        yield Net(victim, honest, attacker)
    finally:
        for closer in (attacker, honest, victim):
            if closer is not None:
                closer.close()


def _rollout(policy: Policy, ref: TaskRef, text: str, *, fingerprint: str | None = None) -> Rollout:
    ids = [*policy.tokenizer(text, add_special_tokens=False)["input_ids"], policy.tokenizer.eos_token_id]
    return Rollout(task=ref, prompt="", completion=text, completion_ids=tuple(ids),
                   tokenizer_fingerprint=fingerprint or policy.tokenizer_fingerprint,
                   behavior_logprobs=(-1.0,) * len(ids), sampling=SamplingParams(1.0, 1.0),
                   model_fingerprint="peer", policy_step=0, finish_reason="eos")


def _batch(author: Identity, groups: list[RolloutGroup]) -> RolloutBatch:
    return RolloutBatch(SWARM_ID, author.public_key, (), 0, 0, 0.0, tuple(groups))


@pytest.mark.slow
def test_a_slow_verifier_is_killed_at_its_time_limit() -> None:
    """Attack 11, the mechanism alone (the end-to-end test below covers it by default): reasoning-gym's
    propositional_logic parser on nested negations, killed at the limit; the next child scores again."""
    source = LOGIC.build()
    ref = source.sample(1, random.Random(0))[0]
    variable = source.task(ref).metadata["variables"][0]
    worker = ScoringWorker(LOGIC, timeout=SCORE_LIMIT)
    try:
        assert worker.score([(ref, f"<answer>{variable}</answer>")])[0].status == "ok"  # started and warm
        started = time.monotonic()
        slow = f"<answer>{'¬' * SLOW_NEGATIONS}{variable}</answer>"
        outcomes = worker.score([(ref, slow), (ref, f"<answer>{variable}</answer>")])
        elapsed = time.monotonic() - started
        assert [o.status for o in outcomes] == ["timeout", "skipped"]
        assert elapsed < SCORE_LIMIT + 2.0, elapsed  # the limit, plus killing the child
        assert worker.score([(ref, f"<answer>{variable}</answer>")])[0].status == "ok"  # a fresh child
        assert worker.metrics() == {"score_timeouts": 1, "score_errors": 0, "scorer_restarts": 1}
    finally:
        worker.close()
    assert worker.pid() is None


def test_a_slow_answer_from_a_peer_is_timed_out_and_punished(net: Net, tmp_path: Path) -> None:
    """Attack 11 end to end: the scorer runs in a child with a per-completion limit; the time-out is
    counted, charged to the author (banned) and the honest peer's groups are scored as usual."""
    policy = _policy(_char_model(tmp_path / "logic-model"))
    source = LOGIC.build()
    scorer = ScoringWorker(LOGIC, timeout=SCORE_LIMIT)
    scorer.start()
    exchange = SwarmExchange(policy, source, net.victim, net.victim.identity, swarm_id=SWARM_ID, temperature=1.0,
                             top_p=1.0, max_completion_tokens=4096, scorer=scorer,
                             ingest_limits=IngestLimits(max_seconds=30.0, max_seconds_per_peer=30.0))
    try:
        honest_refs = source.sample(2, random.Random(1))
        mallory = Identity.generate()
        mallory_ref = source.sample(1, random.Random(2))[0]
        variable = source.task(mallory_ref).metadata["variables"][0]
        slow = _rollout(policy, mallory_ref, f"<answer>{'¬' * SLOW_NEGATIONS}{variable}</answer>")
        honest = _batch(net.honest.identity, [
            RolloutGroup(r, (_rollout(policy, r, f"<answer>{v}</answer>"), _rollout(policy, r, "<answer></answer>")))
            for r in honest_refs for v in source.task(r).metadata["variables"][:1]])
        attack = _batch(mallory, [RolloutGroup(mallory_ref, (slow, slow))])
        assert wait_until(lambda: scorer.score([(mallory_ref, "x")], wait=0.5)[0].status == "ok", timeout=60)
        net.deliver(honest, [(mallory, attack)])
        started = time.monotonic()
        groups = exchange.receive(step=0)
        elapsed = time.monotonic() - started
        ingestor = exchange.ingestor
        assert ingestor.rejected["score_timeout"] == 1, dict(ingestor.rejected)
        assert ingestor.offences["score_timeout"] == 1
        assert scorer.timeouts == 1
        offences = net.victim.stats()["offences"]
        assert isinstance(offences, dict) and offences.get("score_timeout", 0) == 1
        assert all(g.peer_id == net.honest.identity.peer_id for g in groups)
        # The honest groups are scored by the fresh child (waited for within the step's budget).
        assert len(groups) == 2 and all(g.rewards[1] == 0.0 and g.rewards[0] > 0 for g in groups)
        assert elapsed < 30.0  # one time-out (1 s) and one child restart, not 2 x 6 s of parsing
    finally:
        scorer.close()


def test_retokenized_completions_are_anchored_in_bounded_memory(net: Net, tmp_path: Path) -> None:
    """Attack 12: a free-string tokenizer fingerprint forces our own log-probs over the full vocabulary;
    256 rows at a time of ``length x vocab`` logits was an out-of-memory lever on a real model (here a
    100k-entry output layer)."""
    policy = _policy(_char_model(tmp_path / "wide-model", vocab_size=100_000))
    source: TaskSource = build_task_source("arith", ["add"], None, 0)
    # time budgets out of reach: memory is the subject, and on a loaded machine one 100k-vocabulary group can take
    # longer than the 2 s a peer gets a call (its second group then waits for the next call)
    limits = IngestLimits(anchor_bytes=32 * _MIB, max_seconds=600.0, max_seconds_per_peer=600.0)
    exchange = SwarmExchange(policy, source, net.victim, net.victim.identity, swarm_id=SWARM_ID, temperature=1.0,
                             top_p=1.0, max_completion_tokens=8, max_peer_tokens=200, ingest_limits=limits)
    mallory = Identity.generate()
    refs = [source.make_ref("add", 2 * i, seed=5) for i in range(2)]
    long_text = "0" * 100  # re-tokenized: 100 tokens + EOS each, within the 200 allowed
    attack = _batch(mallory, [RolloutGroup(r, tuple(_rollout(policy, r, long_text, fingerprint="free string")
                                                    for _ in range(4))) for r in refs])
    honest_ref = source.make_ref("add", 100, seed=6)
    right = str(source.task(honest_ref).answer)
    honest = _batch(net.honest.identity, [RolloutGroup(honest_ref, (_rollout(policy, honest_ref, right),
                                                                    _rollout(policy, honest_ref, "000")))])
    net.deliver(honest, [(mallory, attack)])
    process, peak, stop = psutil.Process(), [0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], process.memory_info().rss)
            time.sleep(0.005)

    baseline = process.memory_info().rss
    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        groups = exchange.receive(step=0)
    finally:
        stop.set()
        sampler.join()
    assert exchange.ingestor.retokenized == 8
    assert {g.peer_id for g in groups} == {net.honest.identity.peer_id, mallory.peer_id}
    # Unbounded: 8 rows x ~110 positions x 100k x 3 float32 = 1 GB at once. Bounded: a row at a time.
    assert peak[0] - baseline < 512 * _MIB, (peak[0] - baseline) / _MIB
    assert all(len(lps) == len(ids) and all(x <= 0 for x in lps)
               for g in groups for ids, lps in zip(g.completions, g.anchor_logprobs))
