"""How far a peer's completion is from what this node could itself have said: the bounds, set by the node's own
completions.

The verifier reads only a completion's final answer; whatever precedes or follows it is the author's choice,
and a positive sample is trained like supervised data. So peer text is held to what the node's own recent
completions look like (``OwnProfile``, fed with their behaviour log-probs every step):

- the least plausible span: the lowest mean log-prob of ``window`` consecutive tokens. A peer completion
  whose span, read with the node's own model, falls below the ``span_quantile`` of its own, less
  ``span_margin`` nats, is dropped (``implausible``): an honest peer sampling what this node samples falls
  there about as often as ``span_quantile`` of its own completions. With it, a peer token the model gives
  less than ``exp(token_floor)`` is kept out of the loss. Both are applied in training, on the training pass's
  own log-probs (``node.train.screen``: no forward pass of its own), with the bounds ``Ingestor.screen_bounds``
  gives, as is the weight of a token the loss pushes up: full above ``exp(positive_floor)``, in proportion to
  its probability below;
- the answer: with ``answer_full``, the tokens of a positive peer completion that spell its tagged final
  answer, when it is the task's reference verbatim (``answer_token_span``), escape the token floor and the
  weight: the task chose them, not the peer; with ``answer_working`` too, the answer where the working
  states it right before the tag ("... = 14.\n<answer>14</answer>"), the step a peer that has learned
  something gets right and this node does not;
- length: a peer completion the loss would push up (its reward above its group's mean) longer than
  ``length_ratio`` times the node's own ``length_quantile`` length on the same dataset is dropped at ingestion
  (``too_long_for_us``): needlessly long but correct text is how an attacker makes a node verbose. One the
  loss pushes down (below the mean) cannot make the node longer, and is kept: between honest nodes at
  different stages most long completions are a weaker peer's rambling, truncated and wrong; with
  ``length_all`` every completion is held to the bound. The span bound likewise holds only the rows the loss
  pushes up (their advantage above 0, in training), every row with ``span_all``; its drops are made after the
  advantages, so a dropped row's advantage is taken up by its group's kept rows of the other sign
  (``share_dropped``), or a group whose positives it drops would train its negatives alone.

Until ``min_own`` own completions (of the dataset, for length) have been seen, the span and length bounds
wait; the token floor holds from the first step. Pure: no torch.
"""

from __future__ import annotations

import math
import re
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from node.tasks.prompting import tagged_answer_span

__all__ = ["OwnProfile", "ScreenSettings", "answer_token_span", "least_plausible_span", "quantile"]


@dataclass(frozen=True)
class ScreenSettings:
    """The ``ingest.screen_*`` settings (docs/configuration.md says why each default)."""

    enabled: bool = True
    token_floor: float = -9.2  # log(1e-4)
    positive_floor: float | None = -2.3  # log(0.1)
    answer_full: bool = True
    answer_working: bool = True
    window: int = 6
    span_quantile: float | None = 0.01  # None: no span bound
    span_margin: float = 1.0
    length_quantile: float = 0.95
    length_ratio: float = 2.0
    length_all: bool = False
    span_all: bool = False
    share_dropped: str | None = "other_sign"  # which kept rows take a dropped row's advantage; None: lost
    min_own: int = 64
    pause_share: float = 0.2
    pause_window: int = 64
    pause_steps: int = 32  # the first pause of an author; each next one twice the last
    probation: int = 16  # completions judged after a pause ends among which fewer failures pause again; 0: none
    probation_first: bool = True  # a new author's first completions on probation too, as after a pause
    probation_base: bool = True  # on probation, only failures the frozen base's read fails too count (reference both)
    probation_weight: float = 1.0  # the pushed-up rows of an author new or on probation weigh this much in the loss
    trial: int = 0  # a new author's rows carry no weight in the loss until this many of its completions passed; 0: off
    history: int = 1024
    reference: str = "both"  # which model reads peer text: "base" (frozen, read at ingestion), "policy" or "both"
    profile_rows: int = 4  # with the base as reference: own completions it reads a step for the profile
    profile_every: int = 1  # once the profile has min_own, those reads on every this many steps (the others none)
    prefix_cache: bool = True  # the base reads the prompts' shared prefix once and keeps its cache
    read_dtype: str = "model"  # the base's reads in the policy's dtype, or "bfloat16" (autocast) for a float32 one
    sequence_quantile: float | None = 0.25  # the sequence weight's floor, a quantile of own totals; None: off
    sequence_fail: float = 3.0  # nats below that floor at which a pushed-up row counts as failed
    group_cap: float | None = None  # a peer group's positive advantage at most this share of its rows' count
    author_cap: float | None = None  # one author's share of a step's positive advantage at most this

    def held_to_length(self, rewards: Sequence[float]) -> list[bool]:
        """Which completions of a group the length bound holds: those the loss would push up (reward above the
        group's mean), or all of them with ``length_all``."""
        mean = sum(rewards) / len(rewards)
        return [self.length_all or r > mean for r in rewards]


def answer_token_span(decode: Callable[[list[int]], str], ids: Sequence[int], answer: str,
                      working: bool = False) -> tuple[int, int] | None:
    """``(lo, hi)``: the tokens ``ids[lo:hi]`` that spell a completion's tagged final answer, when that answer is
    ``answer`` (the task's reference) verbatim; None otherwise, or when those tokens would also carry text
    other than the answer, its tags and whitespace. ``decode`` turns ids into text (special tokens left out).
    With ``working``, the span begins earlier when the text right before the opening tag states the same answer,
    whole, with at most one punctuation mark and a little whitespace between (``working_answer_pattern``): the
    working's last result, as in "7 + 8 = 15.\n<answer>15</answer>".

    What the verifier has read and the task fixes: the one part of a peer's positive completion it did not
    choose (the answer itself; where it stands and the mark before the tag are the peer's, and carry nothing)."""
    ids = list(ids)
    text = decode(ids)
    span = tagged_answer_span(text)
    if span is None or not answer.strip() or text[span[0] : span[1]] != answer.strip():
        return None
    start, end = span

    def first(at_least: int, offset: int) -> int:
        """The smallest i with len(decode(ids[:i + offset])) > or >= the bound (prefix lengths grow with i)."""
        lo, hi = 0, len(ids)
        while lo < hi:
            mid = (lo + hi) // 2
            if len(decode(ids[: mid + offset])) >= at_least:
                hi = mid
            else:
                lo = mid + 1
        return lo

    lo = first(start + 1, 1)  # the token whose text reaches past the answer's first character
    hi = first(end, 0)  # the first prefix that holds the whole answer
    if lo >= hi:
        return None
    before = len(decode(ids[:lo]))
    lifted = decode(ids[lo:hi])
    head, tail = text[before:start], text[end : before + len(lifted)]
    if not text.startswith(lifted, before) or answer.strip() not in lifted:
        return None  # a tokenizer whose pieces do not decode to the whole's substrings
    if not "<answer>".endswith(head.strip().lower()) or not "</answer>".startswith(tail.strip().lower()):
        return None
    opening = text[:start].rstrip()
    if working and opening.lower().endswith("<answer>"):
        stated = working_answer_pattern(answer.strip()).search(opening[: -len("<answer>")])
        if stated is not None:  # the tokens from the stated answer's first character on
            at = first(stated.start() + 1, 1)
            before = len(decode(ids[:at]))
            if at < lo and not text[before : stated.start()].strip() and text.startswith(decode(ids[at:hi]), before):
                lo = at
    return lo, hi


def working_answer_pattern(answer: str) -> re.Pattern[str]:
    """The answer, whole (no letter, digit, point or sign joined to it in front), at the end of the text or
    followed by at most one of ``.,;:!`` and three whitespace characters each side of it."""
    return re.compile(r"(?<![\w.\-])" + re.escape(answer) + r"\s{0,3}[.,;:!]?\s{0,3}\Z")


def least_plausible_span(logprobs: Sequence[float], window: int) -> float:
    """The lowest mean of ``window`` consecutive log-probs (the mean of all when there are fewer); 0.0 for an
    empty sequence."""
    n = len(logprobs)
    if n == 0:
        return 0.0
    if n <= window:
        return sum(logprobs) / n
    run = sum(logprobs[:window])
    lowest = run
    for i in range(window, n):
        run += logprobs[i] - logprobs[i - window]
        lowest = min(lowest, run)
    return lowest / window


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank, lower side), ``values`` not empty."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1))]



class OwnProfile:
    """The node's own recent completions: their least plausible spans (all datasets), lengths and sequence
    log-probs (the sum over their tokens, per dataset), ``history`` of each kept; the bounds a peer completion is
    held to. ``observe`` takes the log-probs of the model that reads peer text (the sampler's, when that is
    the policy); ``observe_lengths`` the lengths alone (when the reads come apart: the frozen base's)."""

    def __init__(self, settings: ScreenSettings) -> None:
        self.settings = settings
        self.spans: deque[float] = deque(maxlen=settings.history)
        self.lengths: dict[str, deque[int]] = {}
        self.sequences: dict[str, deque[float]] = {}

    def observe(self, dataset: str, logprobs: Sequence[Sequence[float]], lengths: bool = True) -> None:
        """Record own completions (their log-probs, one list a completion) of ``dataset``: spans and sequence
        log-probs, and their lengths unless ``lengths`` is False."""
        sequences = self.sequences.setdefault(dataset, deque(maxlen=self.settings.history))
        for lps in logprobs:
            if lps:
                self.spans.append(least_plausible_span(lps, self.settings.window))
                sequences.append(float(sum(lps)))
        if lengths:
            self.observe_lengths(dataset, [len(lps) for lps in logprobs if lps])

    def observe_lengths(self, dataset: str, lengths: Sequence[int]) -> None:
        self.lengths.setdefault(dataset, deque(maxlen=self.settings.history)).extend(lengths)

    def span_floor(self) -> float | None:
        """Below this a peer completion's span is implausible; None until ``min_own`` own completions (or with the
        bound off)."""
        s = self.settings
        if s.span_quantile is None or len(self.spans) < s.min_own:
            return None
        return quantile(list(self.spans), s.span_quantile) - s.span_margin

    def max_length(self, dataset: str) -> int | None:
        """The longest peer completion (tokens) kept on ``dataset``; None until ``min_own`` own ones of it."""
        s = self.settings
        lengths = self.lengths.get(dataset)
        if lengths is None or len(lengths) < s.min_own:
            return None
        return math.ceil(s.length_ratio * quantile(list(lengths), s.length_quantile))

    def sequence_floor(self, dataset: str) -> float | None:
        """The sequence log-prob (nats) at and above which a positive peer completion of ``dataset`` counts
        fully: the ``sequence_quantile`` of the node's own; None while it is off or before ``min_own`` of them.
        """
        s = self.settings
        totals = self.sequences.get(dataset)
        if s.sequence_quantile is None or totals is None or len(totals) < s.min_own:
            return None
        return quantile(list(totals), s.sequence_quantile)

    def sequence_floors(self) -> dict[str, float]:
        """``sequence_floor`` of each dataset that has one."""
        return {d: f for d in self.sequences if (f := self.sequence_floor(d)) is not None}

    def state(self) -> dict[str, Any]:
        """What the profile holds, for a checkpoint (plain lists: JSON)."""
        return {"spans": list(self.spans), "lengths": {d: list(v) for d, v in self.lengths.items()},
                "sequences": {d: list(v) for d, v in self.sequences.items()}}

    def load_state(self, state: Mapping[str, Any]) -> None:
        """The profile ``state`` saved, each list cut to this profile's ``history`` (its newest kept); what is not a
        number is left out."""
        n = self.settings.history
        self.spans = deque(_floats(state.get("spans")), maxlen=n)
        self.lengths = {str(d): deque((int(x) for x in _floats(v)), maxlen=n)
                        for d, v in dict(state.get("lengths") or {}).items()}
        self.sequences = {str(d): deque(_floats(v), maxlen=n) for d, v in dict(state.get("sequences") or {}).items()}


def _floats(values: Any) -> list[float]:
    """A saved list of numbers, as floats (anything else: empty)."""
    return [float(v) for v in values if isinstance(v, (int, float))] if isinstance(values, list) else []


class AuthorVerdicts:
    """Per author: one verdict for each of its completions judged (failed or not: ``record``), the last
    ``pause_window`` kept, its running screen figures (``figures``: completions judged, failed, dropped, tokens
    read, masked, pushed up, their weights) and its pauses; the ``max_authors`` most recently judged authors kept.

    A completion is judged once, where its fate is settled: dropped by the length bound at ingestion, or, kept
    there, by the training pass (the span bound and the token floor) when the loss pushes it up.

    An author whose completions keep failing is paused: its groups are not read for ``pause_steps`` of this node's
    training steps (twice as many at each next pause), after which its completions are judged afresh, the first
    ``probation`` of them held to the pause share of ``probation`` (4 failures of 16 at the defaults, not 13 of 64:
    each return lets fewer of an attacker's completions in); with ``probation_first``, a new author's first
    completions are held so too; with ``probation_base``, a probation counts only the failures that the frozen
    base's read fails too (not those of the policy's read alone), where the usual count takes every failure. With
    ``probation_weight`` below 1, the pushed-up rows of an author not ``settled`` (new, or on probation) weigh that
    much in the loss, so what an author sends before its probation passes teaches less. With
    ``trial``, a new author is on trial until ``trial`` of its completions have passed (judged, not failed;
    ``trusted``): its rows are judged as any other's and carry no weight in the loss, so what an author sends before
    its first pause teaches nothing. A pause says that this node would not write the author's text, not that the
    author cheats: an honest peer at another stage of training fails the bounds a node sets from its own answers as
    often as an attacker does (the weak-from-strong pair, docs/results/sapo-smollm2-pair.md), so a pause is not an
    offence and the peer book does not ban for it."""

    FIGURES = ("judged", "failed", "dropped", "tokens", "masked", "pushed", "weight", "sequence_failed",
               "policy_failed", "pauses")

    def __init__(self, settings: ScreenSettings, max_authors: int) -> None:
        self.settings = settings
        self.max_authors = max_authors
        self.step = 0  # the node's training steps, as ScreenBook.record is told them
        self._last: OrderedDict[str, deque[bool]] = OrderedDict()
        self.figures: OrderedDict[str, list[float]] = OrderedDict()
        self._until: dict[str, int] = {}  # a paused author: the step its pause ends at
        self._probation: dict[str, list[int]] = {}  # an author back from a pause: completions judged, failed since

    @property
    def judged(self) -> dict[str, int]:
        """Completions judged, by author (each counted once)."""
        return {a: int(f[0]) for a, f in self.figures.items()}

    def record(self, author: str, n: int, failed: int, *, dropped: int | None = None, tokens: int = 0,
               masked: int = 0, pushed: int = 0, weight: float = 0.0, sequence_failed: int = 0,
               policy_failed: int = 0) -> bool:
        """``n`` of the author's completions judged, ``failed`` of them failing a bound (``dropped`` of those
        kept out whole, all of them unless said; ``sequence_failed`` by the sequence weight alone;
        ``policy_failed`` by the policy's read alone, the base's passing them), and the tokens read of its rows:
        masked, pushed up and those tokens' weights summed. Returns whether this paused the author: at least
        ``pause_share`` of ``pause_window`` completions failed among its last ``pause_window`` judged (a count, so
        an author whose every completion fails is paused once ``pause_share * pause_window`` of them are in); or, for
        an author back from a pause (or, with ``probation_first``, new: not among the authors kept), at least
        ``pause_share`` of ``probation`` failed among the first ``probation`` judged since its pause ended (or since
        it was first judged; counted by whole calls: the call that reaches ``probation`` is the last), where with
        ``probation_base`` the probation counts ``failed - policy_failed``."""
        s = self.settings
        if s.probation_first and s.probation > 0 and author not in self.figures:
            self._probation[author] = [0, 0]  # a new author's first completions, held as a returning one's
        last = self._last.pop(author, None) or deque(maxlen=s.pause_window)
        self._last[author] = last
        last.extend([True] * failed + [False] * (n - failed))
        row = self.figures.pop(author, None) or [0.0] * len(self.FIGURES)
        self.figures[author] = row
        for i, v in enumerate((n, failed, failed if dropped is None else dropped, tokens, masked, pushed, weight,
                               sequence_failed, policy_failed)):
            row[i] += v
        # on probation: its verdicts since its pause ended (those during a pause are of text sent before it)
        paused = self.paused(author)
        probation = None if paused else self._probation.get(author)
        if probation is not None:
            probation[0] += n
            probation[1] += failed - policy_failed if s.probation_base else failed
        pausing = s.enabled and not paused and (
            sum(last) >= math.ceil(s.pause_share * s.pause_window)
            or (probation is not None and probation[1] >= math.ceil(s.pause_share * s.probation)))
        if pausing:
            self._until[author] = self.step + s.pause_steps * 2 ** min(int(row[-1]), 16)
            row[-1] += 1
            last.clear()  # judged afresh once the pause ends
            if s.probation > 0:
                self._probation[author] = [0, 0]
        elif probation is not None and probation[0] >= s.probation:
            del self._probation[author]  # probation passed: the pause share of pause_window from now on
        for book in (self._last, self.figures):
            while len(book) > self.max_authors:
                gone = book.popitem(last=False)[0]
                self._until.pop(gone, None)  # a forgotten author's pause and probation with it
                self._probation.pop(gone, None)
        return pausing

    def settled(self) -> frozenset[str] | None:
        """The authors kept that are not on probation, whose rows carry their full weight; None when
        ``probation_weight`` is 1 (or there is no probation, or the screen is off): every author's do. An author
        not yet judged is not among them (with ``probation_first`` off, it is once first judged)."""
        s = self.settings
        if not s.enabled or s.probation <= 0 or s.probation_weight >= 1:
            return None
        return frozenset(a for a in self.figures if a not in self._probation)

    def trusted(self) -> frozenset[str] | None:
        """The authors kept that are past their trial (``trial`` of their completions passed); None with no trial
        (or the screen off): every author's rows carry weight. A forgotten author is new again."""
        s = self.settings
        if not s.enabled or s.trial <= 0:
            return None
        return frozenset(a for a in self.figures if self.trial_left(a) == 0)

    def trial_left(self, author: str) -> int:
        """How many more of the author's completions must pass before its rows carry weight (0: past its trial,
        or no trial); a failed completion does not count toward it."""
        if self.settings.trial <= 0:
            return 0
        judged, failed = self.figures.get(author, [0.0, 0.0])[:2]
        return max(0, self.settings.trial - int(judged - failed))

    def state(self) -> dict[str, Any]:
        """The verdicts kept, for a checkpoint (plain lists and dicts: JSON; the authors in the order kept, oldest
        first): a paused author stays paused, and one on probation or on trial stays so, across a restart."""
        return {"step": self.step, "figures": list(self.FIGURES),
                "authors": [[a, [int(v) for v in self._last.get(a, ())], list(f), self._until.get(a),
                             self._probation.get(a)] for a, f in self.figures.items()]}

    def load_state(self, state: Mapping[str, Any]) -> None:
        """The verdicts ``state`` saved: figures matched by name (one this version does not keep is left out, one it
        keeps that was not saved is 0), each author's last verdicts cut to ``pause_window``, the ``max_authors``
        newest authors kept."""
        self.step = int(state.get("step", 0))
        names = [str(n) for n in state.get("figures", [])]
        self._last, self.figures, self._until, self._probation = OrderedDict(), OrderedDict(), {}, {}
        for author, last, figures, until, probation in list(state.get("authors", []))[-self.max_authors:]:
            saved = dict(zip(names, _floats(figures)))
            self.figures[str(author)] = [saved.get(n, 0.0) for n in self.FIGURES]
            self._last[str(author)] = deque((bool(v) for v in last), maxlen=self.settings.pause_window)
            if until is not None:
                self._until[str(author)] = int(until)
            if probation is not None:
                self._probation[str(author)] = [int(probation[0]), int(probation[1])]

    def paused(self, author: str) -> bool:
        """Whether the author is paused (screen on): its groups are not read until its pause ends."""
        return self.settings.enabled and self._until.get(author, 0) > self.step

    def paused_until(self, author: str) -> int | None:
        """The training step the author's pause ends at, None when it is not paused."""
        return self._until[author] if self.paused(author) else None

    def summary(self, author: str) -> dict[str, float]:
        """The author's figures: completions judged, failed, dropped, failed by the sequence weight alone, failed
        by the policy's read alone; tokens read and masked; the mean weight of its tokens the loss pushed up (1.0
        when none was); how often it was paused, the step its pause ends at (-1: not paused), and how many of its
        completions are still to be judged on probation (0: none; while paused, the whole probation), and how many
        must still pass before its rows carry weight (``trial``; 0: past it, or no trial)."""
        judged, failed, dropped, tokens, masked, pushed, weight, by_sequence, by_policy, pauses = self.figures.get(
            author, [0.0] * len(self.FIGURES))
        until = self.paused_until(author)
        return {"judged": int(judged), "failed": int(failed), "dropped": int(dropped),
                "sequence_failed": int(by_sequence), "policy_failed": int(by_policy), "tokens": int(tokens),
                "tokens_masked": int(masked), "mean_weight": weight / pushed if pushed else 1.0,
                "pauses": int(pauses), "paused_until": -1 if until is None else until,
                "probation": max(0, self.settings.probation - self._probation[author][0])
                if author in self._probation else 0,
                "trial": self.trial_left(author)}
