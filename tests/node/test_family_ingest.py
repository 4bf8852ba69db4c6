"""What a receiver makes of a peer's token ids where its family's model differs from a Llama's: an output layer
wider than the tokenizer (Qwen2.5, Phi-3) and a second end-of-turn id that is a special token (Gemma's
``<end_of_turn>``, Qwen2.5's ``<|endoftext|>``). A peer with our tokenizer sends ids, which are checked
(``node.exchange.ingest``): one past our tokenizer is ``bad_token_id``, an offence that bans the author; a
completion ending at any of our stop ids is a completion that ended, not a ``special_token``."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

import pytest

from node.config import AdapterConfig, ModelConfig
from node.exchange.ingest import IngestLimits, Ingestor
from node.policy.model import Policy, build_policy
from node.policy.special import stop_ids
from node.tasks import build_task_source
from protocol.identity import Identity, peer_id_from_public_key
from protocol.records import Rollout, RolloutBatch, RolloutGroup, SamplingParams

SOURCE = build_task_source("arith", ["add"], None, 0)


def _policy(folder: Any) -> Policy:
    return build_policy(ModelConfig(name_or_path=str(folder), device="cpu"), AdapterConfig(), seed=0)


def _refs(n: int) -> list[Any]:
    refs = (SOURCE.make_ref("add", i) for i in range(100))
    return [r for r in refs if not SOURCE.is_held_out(SOURCE.task(r))][:n]


def _rollout(policy: Policy, ref: Any, ids: list[int], finish_reason: str = "eos") -> Rollout:
    """A rollout of a peer with our tokenizer, its text what the ids say (a final stop id dropped)."""
    body = ids[:-1] if finish_reason == "eos" else ids
    text = policy.tokenizer.decode(body, skip_special_tokens=False)
    return Rollout(ref, "", text, tuple(ids), policy.tokenizer_fingerprint, (-0.5,) * len(ids),
                   SamplingParams(1.0, 1.0), "peer", 0, finish_reason)


def _ingestor(policy: Policy, reports: list[tuple[str, str]]) -> Ingestor:
    return Ingestor(policy, SOURCE, temperature=1.0, max_completion_tokens=16,
                    penalize=lambda peer, reason: reports.append((peer, reason)),
                    limits=IngestLimits(max_seconds=600.0, max_seconds_per_peer=600.0))


def _answer_ids(policy: Policy, ref: Any) -> list[int]:
    return list(policy.tokenizer(SOURCE.task(ref).answer, add_special_tokens=False)["input_ids"])


@pytest.mark.parametrize("name", ["qwen2", "phi3"])
def test_an_id_past_our_tokenizer_is_bad_token_id_an_offence_that_reports_the_author(name, family_folder):
    """The id is one our output layer has (a row of its padding) but our tokenizer has not: rejected as
    ``bad_token_id``, counted as an offence, the author reported once and its other groups skipped; an
    honest author's same group is accepted. Mutation seen failing: the check against the output layer's
    width instead of the tokenizer's (the id then fails as ``text_mismatch``, another reason)."""
    policy = _policy(family_folder(name))
    tok = policy.tokenizer
    width = int(policy.model.get_output_embeddings().weight.shape[0])
    first, second = _refs(2)
    good = [*_answer_ids(policy, first), tok.eos_token_id]
    bad = [*_answer_ids(policy, first), len(tok) + 3, tok.eos_token_id]
    assert len(tok) + 3 < width
    mallory, honest = Identity.generate(), Identity.generate()
    reports: list[tuple[str, str]] = []
    ingestor = _ingestor(policy, reports)
    attack = RolloutBatch("s", mallory.public_key, (), 0, 0, 0.0,
                          (RolloutGroup(first, (_rollout(policy, first, good), _rollout(policy, first, bad))),
                           RolloutGroup(second, (_rollout(policy, second, good),))))
    assert ingestor.ingest(attack) == []
    assert ingestor.rejected == Counter({"bad_token_id": 1, "peer_offended": 1})
    assert ingestor.offences == Counter({"bad_token_id": 1})
    assert reports == [(peer_id_from_public_key(mallory.public_key), "bad_token_id")]
    fair = RolloutBatch("s", honest.public_key, (), 0, 0, 0.0, (RolloutGroup(first, (_rollout(policy, first, good),)),))
    (group,) = ingestor.ingest(fair)
    assert group.completions == [good] and ingestor.offences == Counter({"bad_token_id": 1})


@pytest.mark.parametrize("name, second", [("gemma2", "<end_of_turn>"), ("qwen2", "<|endoftext|>"),
                                          ("qwen3", "<|endoftext|>")])
def test_a_completion_ending_at_our_second_stop_id_is_accepted(name, second, family_folder):
    """Our model's generation config declares a second end-of-turn id, a special token of our tokenizer: a
    peer's completion ending there ended (accepted, its ids kept), one with it in the middle is
    ``special_token`` (not an offence), one ending there while it says it ran out of length is
    ``eos_mismatch``. Mutation seen failing: the receiver's stop ids reduced to the tokenizer's eos (the
    first completion rejected as ``eos_mismatch``)."""
    policy = _policy(family_folder(name))
    tok = policy.tokenizer
    end = tok.convert_tokens_to_ids(second)
    assert end in tok.all_special_ids and end != tok.eos_token_id and stop_ids(policy.model, tok)[1:] == (end,)
    ref, other, third = _refs(3)
    answer = _answer_ids(policy, ref)
    reports: list[tuple[str, str]] = []
    ingestor = _ingestor(policy, reports)
    ended = RolloutBatch("s", Identity.generate().public_key, (), 0, 0, 0.0,
                         (RolloutGroup(ref, (_rollout(policy, ref, [*answer, end]),)),))
    (group,) = ingestor.ingest(ended)
    assert group.completions == [[*answer, end]] and not ingestor.rejected
    inside = _rollout(policy, other, [*answer[:1], end, *answer[1:], tok.eos_token_id])
    ingestor.ingest(RolloutBatch("s", Identity.generate().public_key, (), 0, 0, 0.0, (RolloutGroup(other, (inside,)),)))
    assert ingestor.rejected["special_token"] == 1 and not ingestor.offences
    cut = _rollout(policy, third, [*answer, end], finish_reason="length")
    ingestor.ingest(RolloutBatch("s", Identity.generate().public_key, (), 0, 0, 0.0, (RolloutGroup(third, (cut,)),)))
    assert ingestor.offences == Counter({"eos_mismatch": 1}) and len(reports) == 1


def test_a_peer_of_our_tokenizer_stopping_where_our_model_does_not_is_not_an_offence(family_folder):
    """A Qwen3 node's model (Qwen3's and Qwen2.5-Instruct's kind) also ends at ``<|endoftext|>``; a Llama node
    with the same tokenizer stops at ``<|im_end|>`` only. The Qwen3 node's honest completion ending at
    ``<|endoftext|>`` reaches the Llama node: a ``special_token`` it does not train on, not an
    ``eos_mismatch`` offence that would ban an honest peer (as it did before). A completion claiming an end
    at a plain token is still ``eos_mismatch``."""
    author, receiver = _policy(family_folder("qwen3")), _policy(family_folder("llama"))
    assert author.tokenizer_fingerprint == receiver.tokenizer_fingerprint
    tok = receiver.tokenizer
    end = tok.convert_tokens_to_ids("<|endoftext|>")
    assert end in stop_ids(author.model, author.tokenizer) and end not in stop_ids(receiver.model, tok)
    ref, other = _refs(2)
    answer = _answer_ids(receiver, ref)
    reports: list[tuple[str, str]] = []
    ingestor = _ingestor(receiver, reports)
    ended = RolloutBatch("s", Identity.generate().public_key, (), 0, 0, 0.0,
                         (RolloutGroup(ref, (_rollout(author, ref, [*answer, end]),)),))
    assert ingestor.ingest(ended) == [] and ingestor.rejected == Counter({"special_token": 1, "empty_group": 1})
    assert not ingestor.offences and not reports
    lying = _rollout(author, other, _answer_ids(receiver, other), finish_reason="length")
    lying = dataclasses.replace(lying, finish_reason="eos", completion=tok.decode(lying.completion_ids[:-1]))
    ingestor.ingest(RolloutBatch("s", Identity.generate().public_key, (), 0, 0, 0.0, (RolloutGroup(other, (lying,)),)))
    assert ingestor.offences == Counter({"eos_mismatch": 1})
