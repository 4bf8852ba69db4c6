"""Re-tokenizing a peer's text for a node with another tokenizer: the character tokenizer of tiny-base and
the byte-level BPE of small-base, each receiving the other's completions (``Ingestor._tokens``; the
end-to-end path is in ``test_heterogeneous``)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest

from node.config import IngestConfig
from node.exchange.ingest import IngestLimits, Ingestor
from node.exchange.plausibility import ScreenSettings
from node.generation.rollouts import encode_prompt
from node.policy.model import tokenizer_fingerprint
from node.run.setup import screen_settings
from node.sources.embedded.small import train_bpe_tokenizer
from node.sources.embedded.tiny import build_char_tokenizer
from node.tasks import build_task_source
from protocol.records import Rollout, SamplingParams

SOURCE = build_task_source("arith", ["add"], None, 0)


def _ingestor(tokenizer: Any) -> Ingestor:
    policy = SimpleNamespace(tokenizer=tokenizer, tokenizer_fingerprint=tokenizer_fingerprint(tokenizer),
                             context_length=None)
    return Ingestor(policy, SOURCE, temperature=1.0, max_completion_tokens=16)  # type: ignore[arg-type]


def _ids(tokenizer: Any, text: str, finish_reason: str = "eos") -> list[int] | None:
    """What a node with ``tokenizer`` makes of a peer's ``text``: our ids, or None with the reason checked."""
    ids, lps, why = _ingestor(tokenizer)._tokens(_rollout(text, finish_reason), "07+35=")
    assert lps is None  # the peer's log-probs are of other tokens: our own anchor is computed instead
    assert (ids is None) == (why is not None)
    return ids


def _why(tokenizer: Any, text: str) -> str | None:
    return _ingestor(tokenizer)._tokens(_rollout(text), "07+35=")[2]


def _rollout(text: str, finish_reason: str = "eos") -> Rollout:
    """A peer's rollout from a tokenizer unlike ours (its ids mean nothing to us)."""
    return Rollout(task=SOURCE.make_ref("add", 0), prompt="07+35=", completion=text, completion_ids=(5, 6, 7),
                   tokenizer_fingerprint="another-tokenizer", behavior_logprobs=(-0.5, -0.1, -0.2),
                   sampling=SamplingParams(temperature=1.0, top_p=1.0), model_fingerprint="peer-model",
                   policy_step=3, finish_reason=finish_reason)


@pytest.fixture(scope="module")
def char_tok() -> Any:
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def bpe_tok() -> Any:
    """small-base's tokenizer kind (byte-level BPE, ChatML specials), trained here on a little text."""
    corpus = [f"{a:02d}+{b:02d}=" for a in range(30) for b in range(30)] + ["<answer>Friday</answer>"] * 20
    return train_bpe_tokenizer(corpus, vocab_size=400)


def test_character_node_spells_bpe_text_and_adds_its_own_eos(char_tok):
    digits = char_tok.convert_tokens_to_ids(["0", "4", "2"])
    assert _ids(char_tok, "042") == [*digits, char_tok.eos_token_id]
    assert _ids(char_tok, "042", finish_reason="length") == digits


@pytest.mark.parametrize("text", ["Friday", "<answer>42</answer>", "4 → 2", "x\ty"])
def test_character_node_rejects_text_outside_its_vocabulary(char_tok, text):
    assert _ids(char_tok, text) is None
    assert _why(char_tok, text) == "untokenizable"


def test_character_node_rejects_special_token_text(char_tok):
    assert _why(char_tok, "04<eos>2") == "special_token"


@pytest.mark.parametrize("text", ["042", "7 ", " 12\n", "<answer>(P ∧ ¬Q)</answer>", "Friday, été"])
def test_bpe_node_spells_any_text_and_ends_with_its_eos(bpe_tok, text):
    ids = _ids(bpe_tok, text)
    assert ids is not None
    assert ids[-1] == bpe_tok.eos_token_id == bpe_tok.convert_tokens_to_ids("<|im_end|>")
    assert bpe_tok.decode(ids[:-1]) == text and bpe_tok.eos_token_id not in ids[:-1]


@pytest.mark.parametrize("text", ["042<|im_end|>", "<|im_start|>assistant", "<|endoftext|>"])
def test_bpe_node_rejects_special_token_text(bpe_tok, text):
    """A peer's text must not smuggle in our special tokens (our EOS mid-completion would end training there)."""
    assert _why(bpe_tok, text) == "special_token"


def test_retokenized_text_longer_than_the_limit_is_rejected(char_tok):
    assert _ids(char_tok, "1" * 15) is not None  # 15 characters + eos: 16 tokens
    assert _why(char_tok, "1" * 16) == "too_long"


def test_a_completion_that_with_our_prompt_exceeds_our_models_context_is_rejected():
    """A peer's model may take longer sequences than ours: what ours cannot take is set aside, not punished."""
    from node.config import AdapterConfig, ModelConfig
    from node.policy.model import build_policy
    from protocol.identity import Identity
    from protocol.records import RolloutBatch, RolloutGroup

    policy = build_policy(ModelConfig(name_or_path="tiny-base", device="cpu"), AdapterConfig(), seed=0)
    tok, ref = policy.tokenizer, SOURCE.make_ref("add", 0)
    prompt = len(encode_prompt(policy, SOURCE.format_prompt(SOURCE.task(ref), tok)))
    room = policy.context_length - prompt  # tiny-base: 64 positions

    def rollout(text: str) -> Rollout:
        ids = (*tok(text, add_special_tokens=False)["input_ids"], tok.eos_token_id)
        return Rollout(ref, "", text, ids, policy.tokenizer_fingerprint, (-0.5,) * len(ids),
                       SamplingParams(1.0, 1.0), "peer", 0, "eos")

    fits, too_long = rollout("1" * (room - 1)), rollout("1" * room)  # + EOS: room tokens, room + 1
    ingestor = Ingestor(policy, SOURCE, temperature=1.0, max_completion_tokens=128)
    batch = RolloutBatch("s", Identity.generate().public_key, (), 0, 0, 0.0, (RolloutGroup(ref, (fits, too_long)),))
    groups = ingestor.ingest(batch)
    assert [len(c) for g in groups for c in g.completions] == [room]
    assert ingestor.rejected["too_long"] == 1 and not ingestor.offences


def test_a_paused_authors_groups_wait_for_the_pause_to_end_and_the_author_is_not_reported():
    """An author the screen paused (its completions kept failing) has its groups set aside unread
    (``screen_paused``) until its pause ends, then read again; the peer book is never told (a pause is no offence:
    an honest peer at another stage of training fails the screen too). Mutations caught: the pause reported as an
    offence, a pause that never ends, an author's other groups read during its pause."""
    from node.config import AdapterConfig, ModelConfig
    from node.policy.model import build_policy
    from node.train.peer_rows import COUNTS
    from protocol.identity import Identity, peer_id_from_public_key
    from protocol.records import RolloutBatch, RolloutGroup

    policy = build_policy(ModelConfig(name_or_path="tiny-base", device="cpu"), AdapterConfig(), seed=0)
    tok, reports = policy.tokenizer, []
    ingestor = Ingestor(policy, SOURCE, temperature=1.0, max_completion_tokens=32,
                        penalize=lambda peer, reason: reports.append(reason),
                        limits=IngestLimits(max_seconds=600.0, max_seconds_per_peer=600.0),  # not the clock's test
                        screen=ScreenSettings(pause_window=4, pause_share=0.5, pause_steps=2))
    author = Identity.generate().public_key
    peer = peer_id_from_public_key(author)

    def batch(seed: int) -> RolloutBatch:
        groups = []
        for k in (0, 1):
            ref = SOURCE.make_ref("add", seed + k)
            ids = (*tok(str(SOURCE.task(ref).answer), add_special_tokens=False)["input_ids"], tok.eos_token_id)
            rollout = Rollout(ref, "", str(SOURCE.task(ref).answer), ids, policy.tokenizer_fingerprint,
                              (-0.5,) * len(ids), SamplingParams(1.0, 1.0), "peer", 0, "eos")
            groups.append(RolloutGroup(ref, (rollout,)))
        return RolloutBatch("s", author, (), 0, 0, 0.0, tuple(groups))

    counts = dict.fromkeys(COUNTS, 0.0) | {"rows": 4, "judged": 4, "failed": 2}
    ingestor.record_screened({peer: list(counts.values())}, 1)  # 2 of 4 failed: paused until step 3
    assert ingestor.paused(peer) and ingestor.ingest(batch(0)) == []
    assert ingestor.rejected["screen_paused"] == 2 and not ingestor.offences and reports == []
    ingestor.record_screened({}, 2)
    assert ingestor.ingest(batch(10)) == [] and ingestor.rejected["screen_paused"] == 4
    ingestor.record_screened({}, 3)  # a step without peer rows: the pause is over all the same
    assert not ingestor.paused(peer) and len(ingestor.ingest(batch(20))) == 2
    assert ingestor.rejected["screen_paused"] == 4 and reports == []


def test_groups_past_the_budgets_are_surplus_not_rejections():
    """A peer that sends more than a step can use is not at fault: what is left unread is counted as
    ``ingest_surplus`` by reason, and ``ingest_rejected`` stays empty."""
    from node.config import AdapterConfig, ModelConfig
    from node.exchange.ingest import IngestLimits
    from node.policy.model import build_policy
    from protocol.identity import Identity
    from protocol.records import RolloutBatch, RolloutGroup

    policy = build_policy(ModelConfig(name_or_path="tiny-base", device="cpu"), AdapterConfig(), seed=0)
    tok = policy.tokenizer

    def group(i: int) -> RolloutGroup:
        ref = SOURCE.make_ref("add", i)
        if SOURCE.is_held_out(SOURCE.task(ref)):
            return group(i + 1000)
        text = SOURCE.task(ref).answer
        ids = (*tok(text, add_special_tokens=False)["input_ids"], tok.eos_token_id)
        rollout = Rollout(ref, "", text, ids, policy.tokenizer_fingerprint, (-0.5,) * len(ids),
                          SamplingParams(1.0, 1.0), "peer", 0, "eos")
        return RolloutGroup(ref, (rollout,))

    def batch(groups: tuple[RolloutGroup, ...]) -> RolloutBatch:
        return RolloutBatch("s", Identity.generate().public_key, (), 0, 0, 0.0, groups)

    # Generous time budgets: this test is about groups, and a loaded machine's first forward passes are slow.
    ingestor = Ingestor(policy, SOURCE, temperature=1.0, max_completion_tokens=8,
                        limits=IngestLimits(max_groups_per_peer=3, max_seconds=600.0, max_seconds_per_peer=600.0))
    got = ingestor.ingest_batches([batch(tuple(group(i) for i in range(10)))], max_groups=8)
    assert len(got) == 3 and ingestor.surplus == {"peer_budget": 7} and not ingestor.rejected
    got = ingestor.ingest_batches([batch(tuple(group(i) for i in range(3))) for _ in range(3)], max_groups=4)
    assert len(got) == 4 and ingestor.surplus == {"peer_budget": 7, "not_needed": 5} and not ingestor.rejected
    metrics = ingestor.metrics()
    assert metrics["ingest_surplus"] == {"peer_budget": 7, "not_needed": 5} and metrics["ingest_rejected"] == {}


def test_every_rejection_reason_in_the_code_is_declared():
    """``REJECT_REASONS`` (which docs/trust.md names one by one) holds every reason ``node/exchange/ingest.py`` counts."""
    import re
    from pathlib import Path

    from node.exchange.ingest import OFFENCES, REJECT_REASONS, SURPLUS_REASONS

    src = (Path(__file__).resolve().parents[2] / "node" / "exchange" / "ingest.py").read_text()
    used = set(re.findall(r'_reject\("(\w+)"', src)) | set(re.findall(r'return (?:None, None, )?"(\w+)"$', src, re.M))
    used |= set(re.findall(r'rejected\["(\w+)"\]', src)) | set(re.findall(r'_drop\(.*?"(\w+)"\)', src))
    assert used and used <= REJECT_REASONS, used - REJECT_REASONS
    assert OFFENCES <= REJECT_REASONS and not SURPLUS_REASONS & REJECT_REASONS
    assert set(re.findall(r'surplus\["(\w+)"\]', src)) | set(re.findall(r'_leave\(.*?"(\w+)"\)', src)) | {
        "not_needed"} == SURPLUS_REASONS  # not_needed: the leftover's other name, chosen in one expression


def test_a_peer_with_our_tokenizer_keeps_its_log_probs_only_when_it_prompted_as_we_do(char_tok: Any) -> None:
    """Prompting is each node's own: behaviour log-probs computed under another prompt are not our policy's
    in our context, so such a completion gets our own anchor (counted as re-anchored), as re-tokenized
    text does."""
    ingestor = _ingestor(char_tok)
    ids = char_tok("042", add_special_tokens=False)["input_ids"] + [char_tok.eos_token_id]
    ours = dataclasses.replace(_rollout("042"), completion_ids=tuple(ids),
                               tokenizer_fingerprint=tokenizer_fingerprint(char_tok),
                               behavior_logprobs=(-0.5, -0.1, -0.2, -0.3))
    kept_ids, lps, why = ingestor._tokens(ours, "07+35=")
    assert (kept_ids, why) == (ids, None) and lps == pytest.approx([-0.5, -0.1, -0.2, -0.3])
    assert ingestor.reanchored == 0
    assert ingestor._tokens(ours, "Question: 07+35=\nAnswer:") == (ids, None, None)
    assert ingestor.reanchored == 1 and ingestor.retokenized == 0


@pytest.mark.parametrize("anchor_flat", [False, True])
def test_a_flat_group_is_anchored_only_when_a_baseline_shift_can_give_it_signal(anchor_flat: bool) -> None:
    """Our own anchor is a forward pass per completion (most of ingestion's cost on a large model). A group
    whose re-scored rewards are all equal has zero advantage without ``train.external_shift``, so the node
    leaves it unanchored then; a group with signal is always anchored, with finite log-probs."""
    from node.config import AdapterConfig, ModelConfig
    from node.policy.model import build_policy
    from protocol.identity import Identity
    from protocol.records import RolloutBatch, RolloutGroup

    policy = build_policy(ModelConfig(name_or_path="tiny-base", device="cpu"), AdapterConfig(), seed=0)
    refs = [SOURCE.make_ref("add", i) for i in range(40)]
    refs = [r for r in refs if not SOURCE.is_held_out(SOURCE.task(r))][:2]

    def group(ref: Any, texts: list[str]) -> RolloutGroup:
        return RolloutGroup(ref, tuple(dataclasses.replace(_rollout(t), task=ref) for t in texts))

    right = SOURCE.task(refs[0]).answer
    signal, flat = group(refs[0], [right, "1", right]), group(refs[1], ["1", "2"])
    ingestor = Ingestor(policy, SOURCE, temperature=1.0, max_completion_tokens=16, anchor_flat_groups=anchor_flat,
                        limits=IngestLimits(max_seconds=600.0, max_seconds_per_peer=600.0))
    batch = RolloutBatch("s", Identity.generate().public_key, (), 0, 0, 0.0, (signal, flat))
    got = {g.key: g for g in ingestor.ingest(batch)}
    assert got[refs[0].key()].rewards == [1.0, 0.0, 1.0] and len(set(got[refs[1].key()].rewards)) == 1
    anchors = got[refs[0].key()].anchor_logprobs
    assert [len(a) for a in anchors] == [len(c) for c in got[refs[0].key()].completions]
    assert all(lp < 0 for a in anchors for lp in a)
    flat_anchors = got[refs[1].key()].anchor_logprobs
    if anchor_flat:
        assert [len(a) for a in flat_anchors] == [len(c) for c in got[refs[1].key()].completions]
    else:
        assert flat_anchors == [[], []]


@pytest.mark.parametrize("answer_full, answer_working", [(False, False), (True, False), (True, True)])
def test_a_peer_completion_whose_answer_is_the_reference_has_its_answer_tokens_marked(
        answer_full: bool, answer_working: bool, small_base: Any) -> None:
    """With ``screen.answer_full``, each correct peer completion carries the tokens of its tagged answer (when
    the answer is the task's reference verbatim and those tokens say nothing else); counted. Without it, none.
    With ``answer_working`` too, the span begins at the working's statement of the answer right before the tag."""
    from node.config import AdapterConfig, ModelConfig
    from node.exchange.plausibility import ScreenSettings
    from node.policy.model import build_policy
    from protocol.identity import Identity
    from protocol.records import RolloutBatch, RolloutGroup

    policy = build_policy(ModelConfig(name_or_path=str(small_base), device="cpu"), AdapterConfig(), seed=0)
    source = build_task_source("reasoning_gym", ["basic_arithmetic"], None, 0)  # scores the tagged answer
    ref = next(r for r in (source.make_ref("basic_arithmetic", i) for i in range(40))
               if not source.is_held_out(source.task(r)))
    right = source.task(ref).answer
    texts = [f"<answer>{right}</answer>", f"Visit example.org <answer>{right}</answer>",
             f"<answer>example.org {right}</answer>", "<answer>1</answer>", f"So it is {right}.\n<answer>{right}</answer>"]
    group = RolloutGroup(ref, tuple(dataclasses.replace(_rollout(t), task=ref) for t in texts))
    ingestor = Ingestor(policy, source, temperature=1.0, max_completion_tokens=64,
                        limits=IngestLimits(max_seconds=600.0, max_seconds_per_peer=600.0),
                        screen=ScreenSettings(answer_full=answer_full, answer_working=answer_working))
    (got,) = ingestor.ingest(RolloutBatch("s", Identity.generate().public_key, (), 0, 0, 0.0, (group,)))
    assert got.rewards[0] == got.rewards[1] == 1.0 and got.rewards[3] == 0.0
    if not answer_full:
        assert got.answer_spans == [] and ingestor.metrics()["ingest_answers_verified"] == 0
        return
    decode = policy.tokenizer.decode
    spans = got.answer_spans
    assert spans[2] is None and spans[3] is None
    for ids, span in zip(got.completions[:2], spans[:2]):
        assert span is not None and right in decode(ids[span[0] : span[1]])
        assert "example" not in decode(ids[span[0] : span[1]])
    stated = spans[4]
    assert stated is not None
    assert decode(got.completions[4][stated[0] : stated[1]]).count(right) == (2 if answer_working else 1)
    assert ingestor.metrics()["ingest_answers_verified"] == 3


@pytest.mark.parametrize("length_all", [False, True])
def test_the_length_bound_drops_long_completions_the_loss_would_push_up(length_all: bool, small_base: Any) -> None:
    """A peer completion longer than twice the node's own on the dataset is dropped when its reward is above its
    group's mean (the loss would push it up: the length attack); a long one below the mean is kept (pushed
    down, it cannot make the node verbose) unless ``length_all``. A baseline shift on peer groups holds all."""
    from node.config import AdapterConfig, IngestConfig, ModelConfig
    from node.exchange.plausibility import ScreenSettings
    from node.policy.model import build_policy
    from node.run.setup import screen_settings
    from protocol.identity import Identity
    from protocol.records import RolloutBatch, RolloutGroup

    policy = build_policy(ModelConfig(name_or_path=str(small_base), device="cpu"), AdapterConfig(), seed=0)
    source = build_task_source("reasoning_gym", ["basic_arithmetic"], None, 0)
    ref = next(r for r in (source.make_ref("basic_arithmetic", i) for i in range(40))
               if not source.is_held_out(source.task(r)) and source.task(r).answer != "1")
    right = source.task(ref).answer
    filler = "Let me work this out slowly, one small step after another, and then check it twice over. " * 2
    texts = [f"<answer>{right}</answer>", "<answer>1</answer>", f"{filler}<answer>{right}</answer>",
             f"{filler}<answer>1</answer>"]
    group = RolloutGroup(ref, tuple(dataclasses.replace(_rollout(t), task=ref) for t in texts))
    ingestor = Ingestor(policy, source, temperature=1.0, max_completion_tokens=256,
                        limits=IngestLimits(max_seconds=600.0, max_seconds_per_peer=600.0),
                        screen=ScreenSettings(length_all=length_all, min_own=8))
    ingestor.profile.observe("basic_arithmetic", [[-0.5] * 12] * 8)  # the node's own: 12 tokens, so 24 at most
    (got,) = ingestor.ingest(RolloutBatch("s", Identity.generate().public_key, (), 0, 0, 0.0, (group,)))
    assert len(got.completions[0]) <= 24 and all(len(ids) > 24 for ids in got.completions[2:])
    assert got.rewards == ([1.0, 0.0] if length_all else [1.0, 0.0, 0.0])
    assert ingestor.metrics()["ingest_rejected"]["too_long_for_us"] == (2 if length_all else 1)
    # a completion dropped here is judged here, failed; one kept is judged once, in training (mutation: judging
    # the kept ones here as well counts the correct short one twice once training judges it)
    assert ingestor.verdicts.judged == {got.peer_id: 2 if length_all else 1}
    assert ingestor.verdicts.summary(got.peer_id)["failed"] == (2 if length_all else 1)
    assert not screen_settings(IngestConfig()).length_all and screen_settings(IngestConfig(), 0.1).length_all
    # which kept rows take a dropped row's advantage up: the other sign's by default, every kept one, or none
    assert [screen_settings(IngestConfig(**kw)).share_dropped for kw in (
        {}, {"screen_share_to": "kept"}, {"screen_share_dropped": False})] == ["other_sign", "kept", None]


def test_the_screen_defaults_are_the_configs() -> None:
    """``ScreenSettings`` repeats the ``ingest.screen*`` defaults for an ingestor built without a config (tools,
    tests): the two agree key for key, so a default changed in one place and not the other fails here."""
    assert screen_settings(IngestConfig()) == ScreenSettings()


@pytest.mark.parametrize("keys", [{}, {"screen_probation_first": False}, {"screen_probation_base": False}])
def test_at_the_defaults_a_new_author_is_paused_by_4_base_failures_among_its_first_16(keys: dict) -> None:
    """At the node's defaults a new author is on probation from its first completion (``screen_probation_first``):
    4 failures the frozen base's read fails too among its first 16 pause it, where the usual count needs 13 of
    64; failures of the policy's read alone do not count on probation (``screen_probation_base``). Mutations
    seen failing: either key's default off, or the setup not passing it on."""
    from node.exchange.plausibility import AuthorVerdicts

    verdicts = AuthorVerdicts(screen_settings(IngestConfig(**keys)), max_authors=4)
    verdicts.step = 1
    for _ in range(3):
        assert not verdicts.record("attacker", 4, 1) and not verdicts.record("drifted", 4, 1, policy_failed=1)
    paused = verdicts.record("attacker", 4, 1)  # 4 failures of its first 16
    assert paused == ("screen_probation_first" not in keys)
    drifted = verdicts.record("drifted", 4, 1, policy_failed=1)  # 4 of 16, each the policy's read alone
    assert drifted == ("screen_probation_base" in keys)


def test_every_screen_key_reaches_the_screen() -> None:
    """Each ``ingest.screen*`` key set away from its default changes the settings the screen is built with
    (mutation: a key the config reads and ``screen_settings`` does not pass on, as ``screen_probation`` would be
    with its line removed)."""
    other = {bool: lambda v: not v, int: lambda v: v + 1, float: lambda v: v / 2}
    changed = {"screen_positive_floor": -1.0, "screen_span_quantile": 0.05, "screen_share_to": "kept",
               "screen_reference": "base", "screen_sequence_quantile": 0.5, "screen_group_positive_cap": 0.25,
               "screen_author_positive_cap": 0.5, "screen_read_dtype": "bfloat16"}
    keys = [k for k in IngestConfig.model_fields if k.startswith("screen")]
    assert "screen_probation" in keys and len(keys) >= 25
    for key in keys:
        default = getattr(IngestConfig(), key)
        value = changed[key] if key in changed else other[type(default)](default)
        assert screen_settings(IngestConfig(**{key: value})) != ScreenSettings(), key


@pytest.mark.parametrize("held, failed, paused", [(8, 8, True), (20, 6, False), (20, 7, True)])
def test_an_author_is_judged_once_a_row_and_paused_when_its_rows_keep_failing(char_tok: Any, held: int, failed: int,
                                                                             paused: bool) -> None:
    """A training step's screen reports, per author, the rows it judged (those the loss pushed up by default) and
    those that failed (dropped, or with a token below the floor: 8 rows dropped here); each judged row is one
    verdict, and an author with ``ceil(pause_share * pause_window)`` failures among its last ``pause_window`` is
    paused (7 of 32 at 0.2; a new author's probation off here), the rows the bound did not hold aside; a pause is no
    offence. Its figures reach the metrics by peer id."""
    from node.exchange.plausibility import ScreenSettings

    policy = SimpleNamespace(tokenizer=char_tok, tokenizer_fingerprint=tokenizer_fingerprint(char_tok),
                             context_length=None)
    ingestor = Ingestor(policy, SOURCE, temperature=1.0, max_completion_tokens=16,  # type: ignore[arg-type]
                        screen=ScreenSettings(pause_window=32, pause_share=0.2, probation_first=False))
    ingestor.record_screened({"a": [24, min(failed, 8), 200, 80, 40, 30.0, held, failed, failed // 2, failed // 4]}, 1)
    assert ingestor.verdicts.judged["a"] == held and ingestor.paused("a") == paused
    metrics = ingestor.metrics()
    assert metrics["ingest_rejected"]["implausible"] == min(failed, 8)
    assert not metrics["ingest_offences"] and metrics["screen_peers_paused"] == int(paused)
    assert metrics["screen_peer_judged"] == {"a": held} and metrics["screen_peer_failed"] == {"a": failed}
    assert metrics["screen_peer_sequence_failed"] == {"a": failed // 2}
    assert metrics["screen_peer_policy_failed"] == {"a": failed // 4}
    assert metrics["screen_peer_tokens_masked"] == {"a": 80} and metrics["screen_peer_mean_weight"] == {"a": 0.75}
    assert metrics["screen_step_judged"] == held and metrics["screen_step_masked_share"] == 0.4
    assert "screen_span_floor" not in metrics and metrics["screen_length_bound"] == {}  # no own completions yet
