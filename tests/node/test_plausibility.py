"""What a peer's text may teach: the statistics against hand-worked values (``node.exchange.plausibility`` and
its torch form in ``node.train.screen``) and the bounds an own profile sets."""

from __future__ import annotations

import math

import pytest
import torch

from node.exchange.plausibility import (
    AuthorVerdicts,
    OwnProfile,
    ScreenSettings,
    answer_token_span,
    least_plausible_span,
    quantile,
)
from node.policy.logprobs import right_pad
from node.tasks.prompting import extract_answer, tagged_answer_span
from node.train.screen import (
    PeerScreen,
    least_plausible_spans,
    positive_peer_weights,
    screen_peer_tokens,
    share_dropped_advantages,
)


def test_least_plausible_span_is_the_lowest_window_mean():
    lps = [-1.0, -1.0, -5.0, -5.0, -1.0]
    assert least_plausible_span(lps, 2) == -5.0
    assert least_plausible_span(lps, 3) == pytest.approx(-11 / 3)
    assert least_plausible_span(lps, 5) == pytest.approx(-13 / 5)
    assert least_plausible_span(lps, 9) == pytest.approx(-13 / 5)  # shorter than the window: the mean
    assert least_plausible_span([], 3) == 0.0
    assert least_plausible_span([-2.0], 1) == -2.0


def test_the_torch_spans_are_the_reference_ones_row_by_row():
    gen = torch.Generator().manual_seed(0)
    rows = [(-torch.rand(n, generator=gen) * 8).tolist() for n in (0, 1, 3, 6, 7, 12)]
    values, mask = right_pad(rows, 0.0, torch.float32)
    for window in (1, 3, 6, 9):
        got = least_plausible_spans(values, mask, window).tolist()
        assert got == pytest.approx([least_plausible_span(r, window) for r in rows], abs=1e-5), window


def test_the_screen_masks_low_peer_tokens_and_drops_implausible_peer_rows_only():
    values, mask = right_pad([[-1.0, -12.0, -1.0], [-1.0, -12.0, -1.0], [-6.0, -6.0, -6.0, -6.0]], 0.0, torch.float32)
    peer = torch.tensor([False, True, True])
    keep, dropped = screen_peer_tokens(values, mask, peer, PeerScreen(token_floor=-9.2, window=2))
    assert keep.tolist() == [[True, True, True, False], [True, False, True, False], [True, True, True, True]]
    assert dropped.tolist() == [False, False, False]  # no span bound yet
    # spans (window 2): row 1: -6.5; row 2: -6 -> a floor of -6.2 drops row 1 whole, never the own row 0
    keep, dropped = screen_peer_tokens(values, mask, peer, PeerScreen(token_floor=-9.2, window=2, span_floor=-6.2))
    assert dropped.tolist() == [False, True, False] and not keep[1].any() and keep[0, :3].all()


@pytest.mark.parametrize("advantage, span_all, dropped_row", [(1.0, False, True), (-1.0, False, False),
                                                               (0.0, False, False), (-1.0, True, True)])
def test_the_span_bound_holds_the_peer_rows_the_loss_pushes_up(advantage, span_all, dropped_row):
    """An implausible peer row is dropped when its advantage is above 0 (or with span_all); pushed down or not
    moved, it is kept, and the token floor still masks its low tokens."""
    values, mask = right_pad([[-1.0, -12.0, -1.0], [-1.0, -1.0, -1.0]], 0.0, torch.float32)
    peer, advantages = torch.tensor([True, True]), torch.tensor([advantage, 1.0])
    screen = PeerScreen(token_floor=-9.2, window=2, span_floor=-6.2, span_all=span_all)
    keep, dropped = screen_peer_tokens(values, mask, peer, screen, advantages=advantages)
    assert dropped.tolist() == [dropped_row, False]
    assert keep[0].tolist() == ([False] * 3 if dropped_row else [True, False, True]) and keep[1].all()


def test_a_dropped_rows_advantage_is_taken_up_by_its_groups_kept_rows_of_the_other_sign():
    # group 0: leave-one-out advantages of rewards [1, 1, 0, 0] (2/3 each way). Both positives dropped: the
    # negatives go to 0, as recomputing the group without them gives. One dropped: the negatives give up half of
    # theirs (-1/3 each), the kept positive keeps 2/3 (recomputing over three rows gives 1, -1/2, -1/2).
    adv = torch.tensor([2 / 3, 2 / 3, -2 / 3, -2 / 3, 1.0, -1 / 3, -1 / 3, -1 / 3])
    group = torch.tensor([0, 0, 0, 0, 6, 6, 6, 6])
    both = share_dropped_advantages(adv[:4], torch.tensor([True, True, False, False]), group[:4])
    assert torch.allclose(both, torch.tensor([2 / 3, 2 / 3, 0.0, 0.0]))
    one = share_dropped_advantages(adv[:4], torch.tensor([True, False, False, False]), group[:4])
    assert torch.allclose(one, torch.tensor([2 / 3, 2 / 3, -1 / 3, -1 / 3]))
    # group 1 ([1, 0, 0, 0]), one negative dropped: the positive gives up 1/3, the other negatives keep theirs
    neg = share_dropped_advantages(adv, torch.tensor([False] * 5 + [True, False, False]), group)
    assert torch.allclose(neg, torch.tensor([2 / 3, 2 / 3, -2 / 3, -2 / 3, 2 / 3, -1 / 3, -1 / 3, -1 / 3]))
    # mean baseline, rewards [1, 1, 1, 0, 0], one positive dropped: the advantages recomputed over the four left
    # ([1, 1, 0, 0]: 0.5 each way) times the share of the rows kept, 4/5
    mean = share_dropped_advantages(torch.tensor([0.4, 0.4, 0.4, -0.6, -0.6]),
                                    torch.tensor([True, False, False, False, False]), torch.zeros(5, dtype=torch.long))
    assert torch.allclose(mean, torch.tensor([0.4, 0.4, 0.4, -0.4, -0.4]))
    # in proportion: a dropped 0.5 beside negatives -0.2 and -0.6 takes 5/8 of each; the kept 0.1 keeps its own,
    # and the group's sum (-0.2) is what it was
    prop = share_dropped_advantages(torch.tensor([0.5, 0.1, -0.2, -0.6]), torch.tensor([True, False, False, False]),
                                    torch.tensor([2, 2, 2, 2]))
    assert torch.allclose(prop, torch.tensor([0.5, 0.1, -0.075, -0.225]))
    assert float(prop[1:].sum()) == pytest.approx(-0.2, abs=1e-6)
    # more dropped than the other sign holds: it stops at 0; a group with every row dropped, or none, or no row
    # of the other sign, is left as it was
    clamp = share_dropped_advantages(torch.tensor([1.0, -0.2, -0.3, 0.3, -0.3, 0.4, 0.2]),
                                     torch.tensor([True, False, False, True, True, True, False]),
                                     torch.tensor([0, 0, 0, 1, 1, 5, 5]))
    assert torch.allclose(clamp, torch.tensor([1.0, 0.0, 0.0, 0.3, -0.3, 0.4, 0.2]))
    untouched = torch.tensor([0.5, -0.5])
    assert torch.equal(share_dropped_advantages(untouched, torch.tensor([False, False]), torch.tensor([1, 1])),
                       untouched)


def test_a_dropped_rows_advantage_can_be_shared_among_all_its_groups_kept_rows():
    # group 0: leave-one-out advantages of rewards [1, 1, 0, 0] (2/3 each way). Both positives dropped: the
    # negatives go to 0, as recomputing the group without them gives. Group 1 ([1, 0, 0, 0]: 1, -1/3 x 3), one
    # negative dropped: the other two negatives -1/3 - 1/9 = -4/9, the positive 1 - 1/9 = 8/9; its sum stays 0.
    adv = torch.tensor([2 / 3, 2 / 3, -2 / 3, -2 / 3, 1.0, -1 / 3, -1 / 3, -1 / 3])
    group = torch.tensor([0, 0, 0, 0, 6, 6, 6, 6])
    dropped = torch.tensor([True, True, False, False, False, True, False, False])
    got = share_dropped_advantages(adv, dropped, group, to="kept")
    assert torch.allclose(got, torch.tensor([2 / 3, 2 / 3, 0.0, 0.0, 8 / 9, -1 / 3, -4 / 9, -4 / 9]))
    assert float(got[4:][~dropped[4:]].sum()) == pytest.approx(float(adv[4:].sum()), abs=1e-6)
    # one positive of group 0 dropped: the others share 2/3: 2/3 + 2/9 and -2/3 + 2/9 (the exact recomputation
    # over three rows gives 1 and -1/2: the same signs, a factor 8/9 apart)
    one = share_dropped_advantages(adv[:4], torch.tensor([True, False, False, False]), group[:4], "kept")
    assert torch.allclose(one, torch.tensor([2 / 3, 8 / 9, -4 / 9, -4 / 9]))
    # a kept row moves toward 0 and stops there; a group with every row dropped, or none, is left as it was
    clamp = share_dropped_advantages(torch.tensor([1.0, -0.2, -0.8, 0.3, -0.3]),
                                     torch.tensor([True, False, False, True, True]), torch.tensor([0, 0, 0, 1, 1]),
                                     "kept")
    assert torch.allclose(clamp, torch.tensor([1.0, 0.0, -0.3, 0.3, -0.3]))
    # mean baseline as above: exactly the advantages recomputed over the four rows left
    mean = share_dropped_advantages(torch.tensor([0.4, 0.4, 0.4, -0.6, -0.6]),
                                    torch.tensor([True, False, False, False, False]), torch.zeros(5, dtype=torch.long),
                                    "kept")
    assert torch.allclose(mean, torch.tensor([0.4, 0.5, 0.5, -0.5, -0.5]))
    untouched = torch.tensor([0.5, -0.5])
    assert torch.equal(share_dropped_advantages(untouched, torch.tensor([False, False]), torch.tensor([1, 1]), "kept"),
                       untouched)


def test_positive_peer_tokens_weigh_their_probability_over_the_floors():
    """log(0.1) floor: a token of p = 0.01 weighs 0.1, one of p >= 0.1 weighs 1; own rows, negative peer rows and
    padding weigh 1."""
    rows = [[math.log(0.01), math.log(0.5)], [math.log(0.01), math.log(0.05)], [math.log(0.01)], [math.log(0.01)]]
    values, mask = right_pad(rows, 0.0, torch.float32)
    peer = torch.tensor([True, True, False, True])
    advantages = torch.tensor([1.0, 0.5, 1.0, -1.0])
    got = positive_peer_weights(values, mask, peer, advantages, math.log(0.1))
    torch.testing.assert_close(got, torch.tensor([[0.1, 1.0], [0.1, 0.5], [1.0, 1.0], [1.0, 1.0]]), rtol=1e-5, atol=0)
    zero = positive_peer_weights(values, mask, peer, torch.zeros(4), math.log(0.1))
    assert zero.tolist() == [[1.0, 1.0]] * 4  # no push, no weight


def test_verified_answer_tokens_escape_the_token_floor_and_the_weight_only():
    """The tokens ``verified`` marks count fully and are never masked by the token floor; the other tokens of
    their row, and a row dropped by the span bound, are screened as before."""
    rows = [[math.log(0.01), math.log(0.01), math.log(1e-6)], [-12.0, -12.0, -12.0]]
    values, mask = right_pad(rows, 0.0, torch.float32)
    peer, advantages = torch.tensor([True, True]), torch.tensor([1.0, 1.0])
    verified = torch.tensor([[False, True, True], [False, False, True]])
    weights = positive_peer_weights(values, mask, peer, advantages, math.log(0.1), verified)
    torch.testing.assert_close(weights[0], torch.tensor([0.1, 1.0, 1.0]), rtol=1e-5, atol=0)
    keep, dropped = screen_peer_tokens(values, mask, peer, PeerScreen(token_floor=-9.2, window=2), verified)
    assert keep.tolist() == [[True, True, True], [False, False, True]] and not dropped.any()
    keep, dropped = screen_peer_tokens(values, mask, peer, PeerScreen(token_floor=-9.2, window=2, span_floor=-10.0),
                                       verified)
    assert dropped.tolist() == [False, True] and not keep[1].any()


@pytest.mark.parametrize("text, span", [
    ("7 + 8 = 15. <answer>15</answer>", (20, 22)),
    ("<answer>  15 \n</answer>", (10, 12)),
    ("<ANSWER>15</ANSWER> and <answer>16</answer>", (32, 34)),  # the last pair, as extract_answer reads it
    ("it is <answer>15", (14, 16)),  # stopped at the closing tag
    ("<answer> </answer>", None),
    ("Answer: 15", None),  # scored, but not from tags
])
def test_the_tagged_answer_span_is_what_extract_answer_reads(text, span):
    assert tagged_answer_span(text) == span
    if span is not None:
        assert text[span[0] : span[1]] == extract_answer(text)


def _words(ids):
    """A toy decoder: token i is VOCAB[i] (pieces that cut through the tags, as real tokenizers do)."""
    return "".join(VOCAB[i] for i in ids)


VOCAB = ["So ", "4", "2", "<answer>", "</answer>", "<ans", "wer>4", "2</", "answer>", "evil ", "wer>evil 42", "42"]


@pytest.mark.parametrize("ids, span", [
    ([0, 3, 1, 2, 4], (2, 4)),  # "So <answer>42</answer>": the two digit tokens
    ([0, 5, 6, 7, 8], (2, 4)),  # "<ans" "wer>4" "2</" "answer>": tag pieces ride along with the digits
    ([9, 3, 11, 4], (2, 3)),  # text before the tags is not lifted
    ([3, 9, 11, 4], None),  # "<answer>evil 42</answer>": not the reference verbatim
    ([5, 10, 4], None),  # "<answer>evil 42" inside one token with the answer: carries other text
    ([3, 1, 1, 4], None),  # a wrong answer
    ([0, 1, 2], None),  # no tags
])
def test_the_answer_tokens_spell_the_reference_and_nothing_a_peer_chose(ids, span):
    assert answer_token_span(_words, ids, "42") == span
    if span is not None:
        assert "42" in _words(ids[span[0] : span[1]])


def test_the_answer_tokens_of_a_real_byte_level_tokenizer(small_base):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(small_base)
    for text, answer in [("7 + 8 = 15. <answer>15</answer>", "15"), ("So it is <answer> -123 </answer>", "-123"),
                         ("<answer>Friday</answer>", "Friday")]:
        ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        span = answer_token_span(lambda x: tok.decode(x, skip_special_tokens=True), ids, answer)
        assert span is not None, text
        lifted = tok.decode(ids[span[0] : span[1]])
        assert answer in lifted and set(lifted.replace(answer, "", 1)) <= set("<answer/> "), (text, lifted)
        assert answer_token_span(lambda x: tok.decode(x, skip_special_tokens=True), ids, answer + "0") is None


@pytest.mark.parametrize("text, answer, lifted", [
    ("7 + 8 = 15.\n<answer>15</answer>", "15", "15.\n<answer>15"),  # the working's result
    ("So the answer is Friday: <answer>Friday</answer>", "Friday", "Friday: <answer>Friday"),
    ("2 - 7 = -5 <answer>-5</answer>", "-5", "-5 <answer>-5"),
    ("7 + 8 = 115.\n<answer>15</answer>", "15", "15"),  # part of another number: not the answer
    ("7 - 22 = -15.\n<answer>15</answer>", "15", "15"),  # a sign joined to it: another number
    ("It is 15 BUY NOW\n<answer>15</answer>", "15", "15"),  # text between: the peer's
    ("It is 15.......\n<answer>15</answer>", "15", "15"),  # more than one mark between
    ("It is 15.\n\n\n\n\n\n\n<answer>15</answer>", "15", "15"),  # a run of newlines between
    ("15 15 15\n<answer>15</answer>", "15", "15\n<answer>15"),  # only the last statement
])
def test_the_working_answer_is_lifted_only_where_it_states_the_reference_right_before_the_tag(
        small_base, text, answer, lifted):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(small_base)
    ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    decode = lambda x: tok.decode(x, skip_special_tokens=True)  # noqa: E731
    plain, working = answer_token_span(decode, ids, answer), answer_token_span(decode, ids, answer, working=True)
    assert plain is not None and working is not None and working[1] == plain[1]
    got = decode(ids[working[0] : working[1]]).strip()  # pieces of the closing tag may ride on the answer's
    assert got.startswith(lifted) and "</answer>".startswith(got[len(lifted) :]), got
    assert set(decode(ids[working[0] : plain[0]]).replace(answer, "", 1)) <= set("<answer>.,;:! \n")


def test_quantile():
    values = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert quantile(values, 0.2) == 1.0 and quantile(values, 0.5) == 3.0 and quantile(values, 1.0) == 5.0
    assert quantile(values, 0.01) == 1.0


def _profile(**kw) -> OwnProfile:
    settings = ScreenSettings(**{"window": 2, "span_quantile": 0.25, "span_margin": 0.5, "length_quantile": 0.5,
                                 "length_ratio": 2.0, "min_own": 4, **kw})
    return OwnProfile(settings)


def test_bounds_wait_for_enough_own_completions_then_follow_them():
    profile = _profile()
    own = [[-1.0, -1.0, -1.0], [-2.0, -2.0], [-0.5, -3.5, -0.5, -0.5], [-1.0] * 6]
    profile.observe("add", own[:3])
    assert profile.span_floor() is None and profile.max_length("add") is None
    profile.observe("add", own[3:])
    # spans: -1, -2, -2 (window 2 of [-0.5, -3.5, ...]), -1 -> the 0.25 quantile is -2, less 0.5
    assert profile.span_floor() == -2.5
    # lengths 3, 2, 4, 6 -> the median (lower) is 3, twice that is 6
    assert profile.max_length("add") == 6 and profile.max_length("sub") is None


def test_profile_keeps_only_recent_history():
    profile = _profile(history=4)
    profile.observe("add", [[-10.0, -10.0]] * 4)
    assert profile.span_floor() == -10.5
    profile.observe("add", [[-1.0, -1.0]] * 4)
    assert profile.span_floor() == -1.5 and math.isclose(profile.max_length("add") or 0, 4)


def test_an_author_is_paused_once_enough_of_its_last_window_failed_for_a_term_that_doubles():
    """A count of failures among the last ``pause_window`` verdicts, ``ceil(pause_share * pause_window)``: reached
    before the window is full by an author whose every completion fails (mutation: requiring a full window
    leaves "a" unpaused after its first three). The pause lasts ``pause_steps`` of the node's steps, twice as long
    the next time (mutations: a pause that never ends, one that does not double), and the author is judged afresh
    after it (its window cleared). The figures add up per author; the oldest authors are forgotten. Mutation:
    recording a completion twice (the old double entry) pauses "h" after its 2 failures of 6."""
    verdicts = AuthorVerdicts(ScreenSettings(pause_window=4, pause_share=0.75, pause_steps=2), max_authors=2)
    verdicts.step = 1
    assert not verdicts.record("a", 2, 2) and not verdicts.paused("a")  # 2 failures: 3 are needed
    assert verdicts.record("a", 1, 1, dropped=0, tokens=10, masked=2, pushed=8, weight=6.0, sequence_failed=1,
                           policy_failed=1)  # 3 failures, the window not yet full
    assert verdicts.paused("a") and verdicts.paused_until("a") == 3
    assert verdicts.summary("a") == {"judged": 3, "failed": 3, "dropped": 2, "sequence_failed": 1,
                                     "policy_failed": 1, "tokens": 10, "tokens_masked": 2, "mean_weight": 0.75,
                                     "pauses": 1, "paused_until": 3, "probation": 16, "trial": 0}
    verdicts.step = 3
    assert not verdicts.paused("a") and verdicts.summary("a")["paused_until"] == -1  # the pause is over
    assert not verdicts.record("a", 2, 2)  # judged afresh: 2 failures since, 3 needed
    assert verdicts.record("a", 1, 1) and verdicts.paused_until("a") == 3 + 4  # the second pause, twice as long
    verdicts.step = 7
    assert not verdicts.paused("a") and verdicts.judged["a"] == 6
    verdicts.record("a", 3, 1)
    assert not verdicts.paused("a")  # 1 of its last 3
    verdicts.record("b", 4, 4)
    verdicts.record("c", 1, 0)
    assert list(verdicts.judged) == ["b", "c"] and not verdicts.paused("a")
    assert verdicts.summary("a")["mean_weight"] == 1.0 and verdicts.summary("a")["pauses"] == 0  # forgotten
    honest = AuthorVerdicts(ScreenSettings(pause_window=6, pause_share=0.5), max_authors=2)
    for failed in (1, 0, 1):
        honest.record("h", 2, failed)
    assert not honest.paused("h")  # 2 failures of 6: 3 are needed
    off = AuthorVerdicts(ScreenSettings(enabled=False, pause_window=1, pause_share=0.5), max_authors=2)
    off.record("a", 1, 1)
    assert not off.paused("a")


@pytest.mark.parametrize("probation", [4, 0])
def test_an_author_back_from_a_pause_is_paused_again_at_a_lower_count_until_its_probation_passes(probation):
    """Usually 4 failures of the last 8 pause (``pause_share`` 0.5); back from a pause, 2 of its first 4 judged
    do (mutation: no probation, or ``probation`` 0 ignored). The verdicts given during the pause are of text sent
    before it and do not count toward the probation (mutation: counting them pauses "a" at its first failure
    back); a probation passed is over (mutation: one that never ends pauses "a" at 3 failures of 6), and a
    forgotten author's probation goes with it; a new author is held to the usual count here
    (``probation_first`` off: its own test below)."""
    verdicts = AuthorVerdicts(ScreenSettings(pause_window=8, pause_share=0.5, pause_steps=2, probation=probation,
                                             probation_first=False), max_authors=2)
    verdicts.step = 1
    assert verdicts.record("a", 4, 4) and verdicts.paused_until("a") == 3
    assert not verdicts.record("a", 2, 1)  # judged during the pause: in its window, not in its probation
    verdicts.step = 3
    assert not verdicts.record("a", 1, 1)  # back: 1 failure on probation, 2 in its window
    assert verdicts.summary("a")["probation"] == (3 if probation else 0)  # judged 1 of its 4
    assert verdicts.record("a", 1, 1) == bool(probation)  # 2 of the probation's 4; 3 of the window's 4
    if not probation:
        return
    assert verdicts.paused_until("a") == 3 + 4  # the next term, doubled
    verdicts.step = 7
    assert not verdicts.record("a", 4, 1)  # 1 failure of its first 4 back: probation passed
    assert not verdicts.record("a", 2, 2)  # 3 failures of its last 6, 4 needed now
    assert verdicts.record("a", 1, 1) and verdicts.paused_until("a") == 7 + 8  # the usual count reached
    verdicts.step = 15
    verdicts.record("b", 1, 0)
    verdicts.record("c", 1, 0)  # "a" forgotten
    assert not verdicts.record("a", 1, 1) and not verdicts.record("a", 1, 1)  # a stranger: 4 of 8 needed


@pytest.mark.parametrize("first", [True, False])
def test_with_probation_first_a_new_author_is_held_to_the_probation_from_its_first_completion(first):
    """With ``probation_first``, 2 failures of an author's first 4 judged pause it (pause share 0.5 of a probation
    of 4), where otherwise 4 of its last 8 are needed (mutation: the flag ignored, or a new author's probation not
    opened); one that passes its first 4 is held to the usual count from then on, and an author forgotten and back
    is new again."""
    verdicts = AuthorVerdicts(ScreenSettings(pause_window=8, pause_share=0.5, pause_steps=2, probation=4,
                                             probation_first=first), max_authors=2)
    verdicts.step = 1
    assert verdicts.summary("a")["probation"] == 0  # not yet judged
    assert not verdicts.record("a", 1, 1)
    assert verdicts.summary("a")["probation"] == (3 if first else 0)
    assert verdicts.record("a", 1, 1) == first  # 2 of its first 4
    assert not verdicts.record("b", 4, 1)  # 1 of its first 4: passed
    assert verdicts.summary("b")["probation"] == 0
    assert not verdicts.record("b", 2, 2)  # 3 of its last 6: the usual 4 of 8 needed
    verdicts.record("c", 1, 0)
    verdicts.record("d", 1, 0)  # "b" forgotten
    assert verdicts.record("b", 2, 2) == first  # new again


@pytest.mark.parametrize("base", [True, False])
def test_with_probation_base_a_probation_counts_only_failures_the_base_read_fails_too(base):
    """With ``probation_base``, a probation counts ``failed - policy_failed``: a new author (``probation_first``)
    whose first 4 completions all fail by the policy's read alone is not paused (mutation: the flag ignored, or
    ``policy_failed`` not subtracted, pauses it at its second), one whose failures the base's read fails too is;
    the usual count still takes every failure, so the first is paused once 4 of its last 8 failed (mutation: the
    subtraction in the usual count too leaves it unpaused); and a returning author's probation counts the same
    way."""
    settings = ScreenSettings(pause_window=8, pause_share=0.5, pause_steps=2, probation=4, probation_first=True,
                              probation_base=base)
    verdicts = AuthorVerdicts(settings, max_authors=4)
    verdicts.step = 1
    assert not verdicts.record("drifted", 1, 1, policy_failed=1)
    assert verdicts.record("drifted", 1, 1, policy_failed=1) == (not base)  # 2 of its first 4, the policy's read alone
    assert not verdicts.record("attacker", 1, 1, policy_failed=0)
    assert verdicts.record("attacker", 1, 1, policy_failed=0)  # the base fails it too: paused either way
    if base:
        assert not verdicts.record("drifted", 2, 0)  # probation passed: 0 of its first 4 counted
        assert verdicts.summary("drifted")["probation"] == 0
        assert verdicts.record("drifted", 2, 2, policy_failed=2)  # 4 of its last 6 failed: the usual count pauses
        verdicts.step = 1 + 2  # its pause over: on probation again, counted on the base's read
        assert not verdicts.record("drifted", 1, 1, policy_failed=1)
        assert not verdicts.record("drifted", 1, 0)
        assert verdicts.summary("drifted")["probation"] == 2
        assert verdicts.record("drifted", 2, 2, policy_failed=0)  # 2 of its 4 back that the base fails too


def test_a_new_author_is_on_trial_until_enough_of_its_completions_have_passed():
    """With ``trial`` 3, an author's rows carry weight (it is ``trusted``) once 3 of its completions have passed:
    judged and not failed, so failures do not count toward it (mutation: counting judged completions trusts "b"
    after its 4 failures); an author forgotten and back is on trial again; with no trial nothing is held back
    (None: every author's rows carry weight)."""
    assert AuthorVerdicts(ScreenSettings(), max_authors=2).trusted() is None
    verdicts = AuthorVerdicts(ScreenSettings(pause_window=64, trial=3), max_authors=2)
    verdicts.step = 1
    assert verdicts.trusted() == frozenset() and verdicts.summary("a")["trial"] == 3  # not yet judged
    verdicts.record("a", 2, 1)
    assert "a" not in verdicts.trusted() and verdicts.summary("a")["trial"] == 2
    verdicts.record("a", 2, 0)
    assert verdicts.trusted() == {"a"} and verdicts.summary("a")["trial"] == 0
    verdicts.record("b", 4, 4)
    assert verdicts.trusted() == {"a"} and verdicts.summary("b")["trial"] == 3
    verdicts.record("c", 1, 0)  # "a" forgotten
    verdicts.record("a", 1, 0)
    assert verdicts.trusted() == frozenset() and verdicts.summary("a")["trial"] == 2
    assert AuthorVerdicts(ScreenSettings(enabled=False, trial=3), max_authors=2).trusted() is None


def test_the_verdicts_and_profile_load_what_another_version_or_setting_saved():
    """``load_state`` matches figures by name (a figure saved that this version lacks is left out, one it keeps
    that was not saved reads 0), keeps the newest ``max_authors`` authors and cuts each list to this node's
    ``pause_window`` and ``history`` (mutation: figures read by position would put 7.0 under ``failed``)."""
    saved = {"step": 9, "figures": ["judged", "renamed", "failed"],
             "authors": [["a", [1, 1], [3.0, 7.0, 2.0], 40, None], ["b", [0, 1, 1, 1], [5.0, 7.0, 3.0], None, [1, 0]]]}
    verdicts = AuthorVerdicts(ScreenSettings(pause_window=2, probation=4), max_authors=1)
    verdicts.load_state(saved)
    assert list(verdicts.figures) == ["b"] and verdicts.step == 9
    assert verdicts.summary("b") | {"mean_weight": 0} == {"judged": 5, "failed": 3, "dropped": 0, "sequence_failed": 0,
                                                         "policy_failed": 0, "tokens": 0, "tokens_masked": 0,
                                                         "mean_weight": 0, "pauses": 0, "paused_until": -1,
                                                         "probation": 3, "trial": 0}
    assert verdicts.state()["authors"] == [["b", [1, 1], [5.0, 3.0, 0, 0, 0, 0, 0, 0, 0, 0], None, [1, 0]]]
    profile = OwnProfile(ScreenSettings(history=2))
    profile.load_state({"spans": [-1.0, -2.0, -3.0], "lengths": {"d": [4, 5, 6]}, "sequences": {"d": ["x", -9.0]}})
    assert list(profile.spans) == [-2.0, -3.0] and list(profile.lengths["d"]) == [5, 6]
    assert list(profile.sequences["d"]) == [-9.0]
