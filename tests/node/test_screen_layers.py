"""Each layer of the peer-text screen, switched off by its own key while the others stay on, lets through what
it alone holds (``node.exchange.screening``, ``node.train.screen``): a fast test a layer.

The victim is small-base with LoRA, wired as the node wires it (a ``ScreenBook`` sets the bounds and reads peer
text with the frozen base, the ``Trainer`` holds them, the book judges authors); the attacker's payload is a run
of tokens chosen by their log-prob under the base after the prompt (``_continuation``), so that each test sits
in the regime one layer governs, and the node's own profile is written by hand so that the other bounds pass
it. Other layers' tests: the length bound, ``test_ingest.py::test_the_length_bound_drops_long_completions_the_loss
_would_push_up``; the answer lifting, ``test_trainer.py::test_the_tokens_of_a_verified_answer_escape_the_floor_
and_the_weight``; the one-verdict ban, ``test_ingest.py::test_an_author_is_judged_once_a_row_and_banned_when_its
_rows_keep_failing``.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch

from node.exchange.plausibility import ScreenSettings
from node.train.groups import TrainGroup

PROMPT = "What day of the week is it?"
OWN_PROMPT = "How many days are in a week?"


def _victim(small_base: Any, **settings: Any) -> tuple[Any, Any, Any]:
    """``(policy, trainer, book)``: small-base with fresh LoRA adapters, a plain REINFORCE trainer at a large
    learning rate (3e-3), and the screen's book with ``settings`` over the defaults (bounds from 4 own completions)."""
    from node.config import AdapterConfig, ModelConfig
    from node.exchange.screening import ScreenBook
    from node.policy.model import build_policy
    from node.train.trainer import Trainer

    policy = build_policy(ModelConfig(name_or_path=str(small_base), device="cpu"), AdapterConfig(), seed=0)
    trainer = Trainer(policy, lr=3e-3, norm_lr=3e-3, router_lr=3e-3, weight_decay=0.0, max_grad_norm=1e9,
                      loss="reinforce", eps_low=0.2, eps_high=0.28, length_norm=False, micro_batch_size=8,
                      temperature=1.0)
    book = ScreenBook(policy, ScreenSettings(**{"min_own": 4, **settings}), temperature=1.0, anchor_bytes=2**28,
                      micro_batch_size=8, max_authors=16)
    return policy, trainer, book


def _prompt(policy: Any) -> list[int]:
    return list(policy.tokenizer(PROMPT, add_special_tokens=False)["input_ids"])


def _continuation(policy: Any, prompt: list[int], n: int, target: float) -> list[int]:
    """``n`` tokens after ``prompt``, each the (non-special) token whose log-prob under the model, after the prompt
    and the tokens before it, is closest to ``target``."""
    special = set(policy.tokenizer.all_special_ids)
    ids: list[int] = []
    for _ in range(n):
        with torch.no_grad():
            logits = policy.model(torch.tensor([prompt + ids])).logits[0, -1].float()
        order = (torch.log_softmax(logits, -1) - target).abs().argsort()
        ids.append(next(int(i) for i in order if int(i) not in special))
    return ids


def _group(prompt: list[int], payload: list[int], plain: list[int], base_reads: Any = None) -> TrainGroup:
    """A peer group of four: two right completions that are ``payload`` (pushed up), two wrong plain ones."""
    rows = [payload, payload, plain, plain]
    group = TrainGroup(key="k", peer_id="attacker", epoch=0, prompt_ids=prompt, completions=rows,
                       anchor_logprobs=[[-1.0] * len(r) for r in rows], rewards=[1.0, 1.0, 0.0, 0.0], dataset="d")
    group.advantages = torch.tensor([2 / 3, 2 / 3, -2 / 3, -2 / 3])
    if base_reads is not None:  # as the node does for the groups a step trains on
        base_reads.read_base([group])
    return group


def _row_logprobs(policy: Any, prompt: list[int], rows: list[list[int]]) -> list[list[float]]:
    """The policy's log-probs of each of ``rows`` after ``prompt`` (anchors of completions it sampled itself)."""
    from node.policy.logprobs import right_pad, shared_prompt_logprobs

    ids, mask = right_pad(rows, 0, torch.long)
    with torch.no_grad():
        lps = shared_prompt_logprobs(policy.model, [prompt] * len(rows), ids, mask, pad_id=0)
    return [lps[i, : len(r)].tolist() for i, r in enumerate(rows)]


def _payload_logprob(policy: Any, prompt: list[int], payload: list[int]) -> float:
    """The policy's mean log-prob a token of ``payload`` after ``prompt``."""
    from node.policy.logprobs import right_pad, shared_prompt_logprobs

    ids, mask = right_pad([payload], 0, torch.long)
    with torch.no_grad():
        return float(shared_prompt_logprobs(policy.model, [prompt], ids, mask, pad_id=0)[0].mean())


def _own(prompt: list[int], right: list[int], wrong: list[int]) -> TrainGroup:
    """The node's own group of the step: one right completion pushed up, one wrong pushed down (without it, a
    peer group alone would make each step's update the same size, Adam being blind to a common scale)."""
    group = TrainGroup(key="own", peer_id="", epoch=0, prompt_ids=prompt, completions=[right, wrong],
                       anchor_logprobs=[[-1.0] * len(right), [-1.0] * len(wrong)], rewards=[1.0, 0.0], dataset="d")
    group.advantages = torch.tensor([1.0, -1.0])
    return group


def _attacked(small_base: Any, own: list[list[float]], target: float, n: int, steps: int = 4,
              **settings: Any) -> tuple[float, Any]:
    """Train a victim ``steps`` steps on its own group and an attacker's group whose payload is ``n`` tokens near
    ``target`` nats each, the own profile ``own`` (log-probs of 8 own completions); ``(the payload's log-prob a
    token, less the silo's, the victim's book)``. The silo trains on the node's own group alone (``_silo``). The
    node's own group has a prompt of its own; the attacker's wrong completions begin otherwise than the payload
    (pushed down, they would push down a payload they share a prefix with)."""
    policy, trainer, book = _victim(small_base, **settings)
    book.profile.observe("d", own * 2)
    prompt, payload, plain, mine, right, wrong = _texts(policy, target, n)
    for step in range(1, steps + 1):
        trainer.step([_own(mine, right, wrong), _group(prompt, payload, plain, book)], screen=book.bounds())
        book.record(trainer.screened, step)
    return _payload_logprob(policy, prompt, payload) - _silo(small_base, target, n, steps), book


def _texts(policy: Any, target: float, n: int) -> tuple[list[int], ...]:
    """The attacker's prompt, payload and wrong completion; the node's own prompt, right and wrong completions."""
    prompt, mine = _prompt(policy), list(policy.tokenizer(OWN_PROMPT, add_special_tokens=False)["input_ids"])
    payload = _continuation(policy, prompt, n, target)
    plain = [t for t in _continuation(policy, prompt, 2, -3.0) + _continuation(policy, prompt, 1, -4.0)
             if t != payload[0]][:2]
    return prompt, payload, plain, mine, _continuation(policy, mine, 2, -0.5), _continuation(policy, mine, 2, -3.0)


@functools.cache
def _silo(small_base: Any, target: float, n: int, steps: int) -> float:
    """The payload's log-prob a token after ``steps`` steps of the node's own group alone (no screen acts on it)."""
    policy, trainer, _ = _victim(small_base)
    prompt, payload, _, mine, right, wrong = _texts(policy, target, n)
    for _ in range(steps):
        trainer.step([_own(mine, right, wrong)])
    return _payload_logprob(policy, prompt, payload)


def test_the_sequence_weight_holds_a_payload_of_likely_tokens(small_base: Any) -> None:
    """Eight tokens near -1.8 nats each (above the token floor and the weight's floor, and above the span bound:
    the node's own spans are near -2.5), whose sum is far below the node's own completions' (two tokens, -5 in
    all): weighted as a whole, the payload moves no more than the silo's; with ``screen_sequence_quantile`` off it
    is learned. Every pushed-up row fails, toward a ban, by the sequence weight alone (the figure that says which
    bound failed it)."""
    own = [[-0.2, -4.8]] * 4
    held, book = _attacked(small_base, own, target=-1.8, n=8)
    summary = book.verdicts.summary("attacker")
    assert abs(held) < 0.15 and summary["failed"] == summary["sequence_failed"] == 8, (held, summary)
    learned, _ = _attacked(small_base, own, target=-1.8, n=8, sequence_quantile=None)
    assert learned > 0.3, learned


def test_a_new_authors_rows_teach_nothing_while_it_is_on_trial(small_base: Any) -> None:
    """The sequence weight's payload with that weight off (every other layer lets it through: learned, as above):
    with ``screen_trial`` beyond the run, the attacker's rows are judged (8 pushed up, none failed) and the payload
    moves exactly as the silo's; once its trial is passed (4 completions: two steps), it is learned again
    (mutation: the trial's rows left in the loss)."""
    own = [[-0.2, -4.8]] * 4
    held, book = _attacked(small_base, own, target=-1.8, n=8, sequence_quantile=None, trial=100)
    summary = book.verdicts.summary("attacker")
    assert abs(held) < 1e-3 and (summary["judged"], summary["failed"], summary["trial"]) == (8, 0, 92), (held, summary)
    assert book.bounds().trusted == frozenset() and book.metrics()["screen_peers_on_trial"] == 1
    later, book = _attacked(small_base, own, target=-1.8, n=8, sequence_quantile=None, trial=4)
    assert later > 0.1 and book.bounds().trusted == {"attacker"}, later


def test_the_weight_slows_a_payload_of_unlikely_tokens(small_base: Any) -> None:
    """Four tokens near -5 nats each (above the token floor, below the weight's floor of -2.3), the node's own
    completions long and unlikely so that neither the span nor the sequence bound holds them: the weight (about
    0.07 a token) keeps the payload where the silo has it; with ``screen_positive_floor`` off it is learned."""
    own = [[-6.0] * 40] * 4
    held, book = _attacked(small_base, own, target=-5.0, n=4)
    assert abs(held) < 0.15 and book.verdicts.summary("attacker")["failed"] == 0, held
    learned, _ = _attacked(small_base, own, target=-5.0, n=4, positive_floor=None)
    assert learned > 0.3, learned


def test_the_span_bound_drops_a_row_whole(small_base: Any) -> None:
    """Six tokens near -2 nats each (weight 1), the node's own spans near -0.5 and its completions long (the
    sequence bound does not hold the payload): the span bound drops the pushed-up rows, their advantage goes to
    the negatives, and the payload does not move at all; with ``screen_span_quantile`` off it is learned."""
    own = [[-0.5] * 40] * 4
    held, book = _attacked(small_base, own, target=-2.0, n=6)
    assert abs(held) < 1e-3 and book.verdicts.summary("attacker")["dropped"] == 8, held
    learned, _ = _attacked(small_base, own, target=-2.0, n=6, span_quantile=None)
    assert learned > 0.15, learned


def test_the_token_floor_fails_an_author_whose_tokens_the_node_would_not_say(small_base: Any) -> None:
    """Four tokens near -12 nats each (below the token floor of -9.2), the own profile low enough that neither the
    span nor the sequence bound holds them: the floor masks them, every pushed-up row fails, and the author is
    paused within the four steps (8 rows, a pause at 4 failures); with ``screen_token_floor`` out of reach it is
    not (the weight alone keeps the tokens from being learned, but nothing judges the author)."""
    own = [[-13.0] * 40] * 4
    _, book = _attacked(small_base, own, target=-12.0, n=4, pause_window=8, pause_share=0.5)
    summary = book.verdicts.summary("attacker")
    assert book.verdicts.paused("attacker") and summary["tokens_masked"] == 8 * 4 and summary["sequence_failed"] == 0
    _, open_book = _attacked(small_base, own, target=-12.0, n=4, pause_window=8, pause_share=0.5, token_floor=-1000.0)
    assert not open_book.verdicts.paused("attacker") and open_book.verdicts.summary("attacker")["failed"] == 0


def test_the_base_reads_a_payload_the_policy_was_trained_toward(small_base: Any) -> None:
    """A policy trained on a payload of -5-nat tokens (supervised, as an undefended node learns a poisoned positive
    completion) until it finds it likely:
    read by the frozen base, the payload's tokens still weigh about exp(-5) / 0.1; with
    ``screen_reference=policy`` the moved policy reads them and they weigh nearly fully: a payload raises its
    own bar."""
    own = [[-6.0] * 40] * 4
    weights = {}
    for reference in ("base", "policy"):
        policy, trainer, book = _victim(small_base, reference=reference)
        for group in trainer.optimizer.param_groups:
            group["lr"] = 1e-2
        book.profile.observe("d", own * 2)
        prompt = _prompt(policy)
        payload = _continuation(policy, prompt, 4, -5.0)
        plain = [t for t in _continuation(policy, prompt, 2, -3.0) if t != payload[0]][:1] * 2
        for _ in range(7):  # supervised on the payload: what its poisoned completions do to an undefended node
            sft = TrainGroup(key="k", peer_id="", epoch=0, prompt_ids=prompt, completions=[payload],
                             anchor_logprobs=_row_logprobs(policy, prompt, [payload]), rewards=[1.0])
            sft.advantages = torch.tensor([1.0])
            trainer.step([sft])
        assert _payload_logprob(policy, prompt, payload) > -2.0  # the policy now finds it likely
        trainer.step([_group(prompt, payload, plain, book)], screen=book.bounds())
        rows, dropped, tokens, masked, pushed, weight, judged, failed, _, _ = trainer.screened["attacker"]
        weights[reference] = weight / pushed
    assert weights["base"] < 0.2 and weights["policy"] > 0.8, weights


def _trained(small_base: Any, reference: str, target: float, sign: float) -> tuple[Any, Any, Any, list[int], list[int],
                                                                          list[int]]:
    """A victim (``_victim``, the learning rate 1e-2) trained supervised 7 steps on a payload of 4 tokens near
    ``target`` nats each under the base, toward it (``sign`` 1) or away from it (-1), as the node's own training
    moves it toward or away from a text; ``(policy, trainer, book, prompt, payload, plain)``."""
    policy, trainer, book = _victim(small_base, reference=reference)
    for group in trainer.optimizer.param_groups:
        group["lr"] = 1e-2
    book.profile.observe("d", [[-6.0] * 40] * 8)
    prompt = _prompt(policy)
    payload = _continuation(policy, prompt, 4, target)
    plain = [t for t in _continuation(policy, prompt, 2, -3.0) if t != payload[0]][:1] * 2
    for _ in range(7):
        sft = TrainGroup(key="k", peer_id="", epoch=0, prompt_ids=prompt, completions=[payload],
                         anchor_logprobs=_row_logprobs(policy, prompt, [payload]), rewards=[1.0])
        sft.advantages = torch.tensor([sign])
        trainer.step([sft])
    return policy, trainer, book, prompt, payload, plain


def _pushed_weight(trainer: Any, book: Any, prompt: list[int], payload: list[int], plain: list[int]) -> float:
    """The payload's mean weight a token (0 for a token masked) when the attacker's group is trained on (its two
    payload rows pushed up)."""
    trainer.step([_group(prompt, payload, plain, book)], screen=book.bounds())
    rows, dropped, tokens, masked, pushed, weight, judged, failed, _, _ = trainer.screened["attacker"]
    return weight / (2 * len(payload))


def test_both_reads_a_payload_at_the_lower_of_the_base_and_the_policy(small_base: Any) -> None:
    """``screen_reference=both``: text the base writes (tokens of -2.8 to -0.2 nats) that the node was trained away
    from (below -5 nats a token) weighs about 0.8 read by the base alone, and little read by both (the policy's log-prob, lower,
    governs); a payload the policy was trained toward (-5-nat tokens under the base) weighs little under both, as
    under the base alone (the base's, lower). The wrong working an attacker takes from the base itself, against a
    node that has learned otherwise."""
    weights = {}
    for reference in ("base", "both"):
        policy, trainer, book, prompt, payload, plain = _trained(small_base, reference, -1.0, -1.0)
        assert _payload_logprob(policy, prompt, payload) < -5.0  # the policy no longer says it
        weights[reference, "away"] = _pushed_weight(trainer, book, prompt, payload, plain)
        policy, trainer, book, prompt, payload, plain = _trained(small_base, reference, -5.0, 1.0)
        assert _payload_logprob(policy, prompt, payload) > -2.0  # the policy now finds it likely
        weights[reference, "toward"] = _pushed_weight(trainer, book, prompt, payload, plain)
    assert weights["base", "away"] > 0.7 and weights["both", "away"] < 0.2, weights
    assert weights["base", "toward"] < 0.2 and weights["both", "toward"] < 0.2, weights


def test_both_profiles_the_nodes_own_completions_at_the_lower_of_the_two(small_base: Any) -> None:
    """With ``both``, the profile the span and sequence bounds come from reads the node's own completions as peer
    text is read: each token at the lower of the base's log-prob and its behaviour log-prob (here -20, below any
    the base gives), so that the node's own text and a peer's are held to one measure."""
    floors = {}
    for reference in ("base", "both"):
        policy, _, book = _victim(small_base, reference=reference)
        prompt = _prompt(policy)
        rows = [_continuation(policy, prompt, 4, -1.0), _continuation(policy, prompt, 4, -3.0)]
        book.observe_own([TrainGroup(key="k", peer_id="", epoch=0, prompt_ids=prompt, completions=rows,
                                     anchor_logprobs=[[-20.0] * 4, [-20.0] * 4], rewards=[1.0, 0.0], dataset="d")
                          for _ in range(2)])
        floors[reference] = book.profile.sequence_floors()["d"]
    assert floors["both"] == pytest.approx(-80.0) and floors["base"] > -40.0, floors


def test_the_base_reads_each_datasets_own_completions_until_its_sequence_floor_is_set(small_base: Any) -> None:
    """The sequence floor is per dataset: each own completion of a dataset with fewer than ``min_own`` (8) read is
    read by the base, so that four datasets of four completions a step all have a floor after two steps; then
    ``profile_rows`` (1) a step. Mutation caught: the reads chosen without regard to the dataset (``min_own`` at
    first, then ``profile_rows``, over all datasets), which left the floor unset for tens of steps on a node with
    several datasets (smollm2-swarm's four; qwen's nine). The book's figures count the step's reads, own and peer."""
    policy, _, book = _victim(small_base, reference="base", min_own=8, profile_rows=1)
    prompt = _prompt(policy)
    rows = [_continuation(policy, prompt, 3, t) for t in (-1.0, -2.0, -3.0, -4.0)]

    def step() -> None:
        book.observe_own([TrainGroup(key=f"k{d}", peer_id="", epoch=0, prompt_ids=prompt, completions=rows,
                                     anchor_logprobs=[[-1.0] * 3] * 4, rewards=[1.0, 0.0, 0.0, 0.0], dataset=d)
                          for d in "abcd"])

    step()
    assert set(book.profile.sequence_floors()) == set(), book.profile.sequences
    assert book.metrics()["screen_read_own_rows"] == 16
    step()
    assert set(book.profile.sequence_floors()) == set("abcd"), {d: len(v) for d, v in book.profile.sequences.items()}
    read = len(book.profile.spans)
    assert read == 32
    step()
    assert len(book.profile.spans) == read + 1
    # the step's figures: the own rows read, and the peer rows (those pushed up) read after them
    book.read_base([_group(prompt, rows[0], rows[3])])
    figures = book.metrics()
    assert (figures["screen_read_own_rows"], figures["screen_read_peer_rows"]) == (1, 2), figures
    assert figures["screen_read_own_seconds"] > 0 and figures["screen_read_peer_seconds"] > 0
    step()
    assert book.metrics()["screen_read_peer_rows"] == 0


def test_with_profile_every_the_full_profile_is_read_on_one_step_of_that_many(small_base: Any) -> None:
    """``profile_every`` (3): while the profile fills (``min_own``, 8: two steps of six own completions) the base
    reads every step; once it holds them, ``profile_rows`` (2) on one step of each three and none on the others,
    and a dataset whose sequence floor is not set is still read each step. Mutations caught: the count ignored (2
    every step), and the skipped steps applied while the profile fills (2 rows at the second step, not 6)."""
    from node.config import IngestConfig
    from node.run.setup import screen_settings

    assert screen_settings(IngestConfig(screen_profile_every=3)).profile_every == 3
    policy, _, book = _victim(small_base, reference="base", min_own=8, profile_rows=2, profile_every=3)
    prompt = _prompt(policy)
    rows = [_continuation(policy, prompt, 3, t) for t in (-1.0, -2.0)]

    def step(dataset: str = "d") -> int:
        book.observe_own([TrainGroup(key="k", peer_id="", epoch=0, prompt_ids=prompt, completions=rows,
                                     anchor_logprobs=[[-1.0] * 3] * 2, rewards=[1.0, 0.0], dataset=dataset)
                          for _ in range(3)])
        return book.metrics()["screen_read_own_rows"]

    assert [step(), step()] == [6, 6] and len(book.profile.spans) == 12
    assert [step() for _ in range(7)] == [2, 0, 0, 2, 0, 0, 2]
    assert step("e") == 6  # a new dataset's sequence floor unset: its completions read, the profile's turn or not
    assert len(book.profile.spans) == 24


def test_the_lower_of_both_by_hand() -> None:
    """``peer_rows._reference``: a row that carries the base's log-probs is read at them, or with ``lower_of_both``
    at the lower of them and the training pass's, token by token; a row that carries none at the training pass's."""
    from node.train.peer_rows import _reference

    row = ([1], [5, 6, 7], [0.0] * 3, 1.0, False, "a", None, 0, [-1.0, -4.0, -2.0], float("nan"))
    bare = ([1], [5, 6], [0.0] * 2, 1.0, False, "a", None, 0, None, float("nan"))
    policy = torch.tensor([[-3.0, -2.0, -2.5], [-0.5, -0.75, 0.0]])
    assert _reference([row, bare], policy).tolist() == [[-1.0, -4.0, -2.0], [-0.5, -0.75, 0.0]]
    assert _reference([row, bare], policy, True).tolist() == [[-3.0, -4.0, -2.5], [-0.5, -0.75, 0.0]]


def test_the_group_cap_scales_a_peer_group_down(small_base: Any) -> None:
    """``screen_group_positive_cap`` 0.05 (off by default): a group of four with two right sums to 4/3 up, capped at
    0.2, so the group weighs 0.15 of itself against the node's own; the payload, every other bound let through,
    moves less than uncapped."""
    own = [[-0.2, -4.8]] * 4
    off = {"sequence_quantile": None, "positive_floor": None}
    capped, _ = _attacked(small_base, own, target=-1.8, n=8, group_cap=0.05, **off)
    uncapped, _ = _attacked(small_base, own, target=-1.8, n=8, **off)
    assert uncapped > 0.3 and capped < 0.7 * uncapped, (capped, uncapped)


def test_capping_peer_advantages_by_hand() -> None:
    """``cap_peer_advantages`` against hand-worked values: a capped group or author scaled whole (both signs), the
    node's own rows left alone."""
    from node.train.screen import cap_peer_advantages

    adv = torch.tensor([1.0, -1.0, 0.6, 0.6, -0.4, -0.4, -0.4, 0.5])
    author = torch.tensor([0, 0, 1, 1, 1, 1, 1, 2])
    group = torch.tensor([0, 0, 1, 1, 1, 1, 1, 2])
    # group 1: five rows, positives sum to 1.2; a cap of 0.2 allows 1.0: the group times 5/6. Group 2: one row of
    # 0.5 against 0.2: times 0.4. The own group 0 is over the cap and left alone.
    got = cap_peer_advantages(adv, author, group, 0.2, None)
    assert got.tolist() == pytest.approx([1.0, -1.0, 0.5, 0.5, -1 / 3, -1 / 3, -1 / 3, 0.2])
    # author cap 0.25, no group cap: positives 1.0 + 1.2 + 0.5 = 2.7; author 1 may have 0.25 * 1.5 / 0.75 = 0.5
    # (times 0.5 / 1.2), author 2 0.25 * 2.2 / 0.75 = 0.733 (left)
    got = cap_peer_advantages(adv, author, group, None, 0.25)
    assert got.tolist() == pytest.approx([1.0, -1.0, 0.25, 0.25, -1 / 6, -1 / 6, -1 / 6, 0.5])
    assert torch.equal(cap_peer_advantages(adv, author, group, None, None), adv)


def test_sequence_weights_by_hand() -> None:
    from node.train.screen import sequence_weights

    lps = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -1.0, 0.0], [-5.0, -5.0, 0.0], [-9.0, -9.0, -9.0]])
    mask = torch.tensor([[True, True, True], [True, True, False], [True, True, False], [True, True, True]])
    pushed = torch.tensor([True, True, True, False])
    floors = torch.tensor([-4.0, -4.0, float("nan"), -4.0])
    verified = torch.zeros_like(mask)
    verified[0, 2] = True  # row 0 sums -3 without its verified token: exp(-3 + 4) capped at 1
    got = sequence_weights(lps, mask, pushed, floors, verified)
    assert got.tolist() == pytest.approx([1.0, 1.0, 1.0, 1.0])
    got = sequence_weights(lps, mask, pushed, torch.tensor([-2.0, -1.0, -1.0, -1.0]))
    assert got.tolist() == pytest.approx([torch.exp(torch.tensor(-4.0)).item(), torch.exp(torch.tensor(-1.0)).item(),
                                          torch.exp(torch.tensor(-9.0)).item(), 1.0])


def test_a_row_failed_by_the_policys_read_alone_is_counted_as_such() -> None:
    """``policy_failed`` (reference both): a pushed-up peer row that fails only because the policy's read is
    lower than the base's counts there; one the base's read fails too does not, whatever the policy's read
    (mutation: counting every failure under both, or reading the base's failures from the lower of the two,
    gives 2 or 0). Worked out by hand: the floor -9.2, rows of three tokens, every other bound off."""
    from node.train.peer_rows import COUNTS, screen_rows
    from node.train.screen import PeerScreen

    def row(base: list[float]) -> tuple[Any, ...]:
        return ([1], [5, 6, 7], [0.0] * 3, 1.0, False, "a", None, 0, base, float("nan"))

    rows = [row([-1.0, -1.0, -1.0]), row([-1.0, -12.0, -1.0]), row([-1.0, -1.0, -1.0]), row([-12.0, -1.0, -1.0])]
    policy = torch.tensor([[-1.0, -12.0, -1.0], [-1.0, -1.0, -1.0], [-2.0, -2.0, -2.0], [-12.0, -1.0, -1.0]])
    mask, peer = torch.ones(4, 3, dtype=torch.bool), torch.ones(4, dtype=torch.bool)
    advantages = torch.ones(4)
    for both, expected in ((True, 1), (False, 0)):
        screen = PeerScreen(token_floor=-9.2, window=2, share_dropped=None, lower_of_both=both)
        _, _, _, counts = screen_rows(rows, policy, mask, peer, advantages, screen)
        c = dict(zip(COUNTS, counts.sum(-1).tolist()))
        assert (c["judged"], c["failed"], c["policy_failed"]) == (4, 2 + expected, expected), (both, c)


def test_a_new_authors_pushed_up_rows_carry_the_probation_weight_until_its_probation_passes(small_base: Any) -> None:
    """With ``screen_probation_weight`` 0.5, a new author's pushed-up tokens weigh half in the loss: on the first
    step (the same policy, the same reads) its mean weight is exactly half the full run's, and over six steps its
    payload rises less (0.54 nats a token against 0.72 here). Once its probation passes (4 completions: two steps)
    its rows weigh in full again (0.62), and it is among the ``settled``. Mutations caught: the weight ignored; the
    weight held after the probation passed."""
    own = [[-0.2, -4.8]] * 4
    held = {"target": -1.8, "n": 8, "sequence_quantile": None, "probation": 100}
    _, full = _attacked(small_base, own, steps=1, **held)
    _, half = _attacked(small_base, own, steps=1, probation_weight=0.5, **held)
    weight = full.verdicts.summary("attacker")["mean_weight"]
    assert half.verdicts.summary("attacker")["mean_weight"] == pytest.approx(0.5 * weight, rel=1e-5), weight
    assert full.bounds().settled is None and half.bounds().settled == frozenset()
    learned, _ = _attacked(small_base, own, steps=6, **held)
    halved, _ = _attacked(small_base, own, steps=6, probation_weight=0.5, **held)
    assert 0.0 < halved < learned - 0.1, (halved, learned)
    passed, book = _attacked(small_base, own, steps=6, probation_weight=0.5, **{**held, "probation": 4})
    assert halved < passed - 0.04 and book.bounds().settled == {"attacker"}, (halved, passed)
