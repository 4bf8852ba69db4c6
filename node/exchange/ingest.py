"""Inbound records: peers' verified batches into ``TrainGroup``s, as a bounded stage of each step.

Nothing the peer claims is believed: the task is regenerated from its ``TaskRef`` and every completion is
re-scored with our own verifier; a task of the held-out evaluation split (a property of the task's
content, the same on every node: ``held_out``) is rejected, so a node never trains on what it is
evaluated on; the prompt is our own formatting of the regenerated task; token ids and
behaviour log-probs are used only when the peer's tokenizer fingerprint equals ours, otherwise the text
is re-tokenized and our own log-probs at ingestion become the anchor. The outbound direction (our groups
as records) is ``node.exchange.outbound``.

Bounded in work: one call ingests at most the groups the step can use (``max_groups``, from the runner)
and at most ``IngestLimits`` rollouts, tokens and seconds. Groups are taken round-robin over authors,
newest batch first, each author at most ``max_groups_per_peer`` groups and ``max_seconds_per_peer``
seconds a call. What does not fit is surplus, not a rejection: it is counted apart (``ingest_surplus``:
``peer_budget`` past an author's share of the call, ``step_budget`` past the call's rollouts, tokens or
seconds, ``not_needed`` once the step has all the groups it can use). Checks run cheapest first:

* the ref: our source and config hash (``unknown_task``), one of this node's own datasets
  (``foreign_dataset``), at most ``max_seeds_per_peer_epoch`` distinct seeds per author and epoch
  (``seed_cap``: a new seed makes the task source build a new table);
* each rollout as this node would have generated it: at most our own ``max_new_tokens`` (or the wider
  limit for re-tokenized text), and with our prompt within our model's context (``too_long``), ids in the
  vocabulary, an EOS at the end exactly when ``finish_reason`` says so (``eos_mismatch``; a special token
  there that our model does not end at, another model's stop, and any inside: ``special_token``), re-tokenized
  text our tokenizer spells exactly (``untokenizable``: characters outside its vocabulary), ids that
  decode -- special tokens not skipped -- to exactly the scored text (``text_mismatch``), behaviour
  log-probs no lower than ``min_logprob`` (``bad_logprobs``);
* scoring, in a child process with a time limit per completion for sources whose scorers may be slow
  (``node.exchange.scoring``; ``score_timeout``);
* anchoring (for a flat group, whose re-scored rewards are all equal, only with ``anchor_flat_groups``: without
  a baseline shift it carries no signal and is dropped before training): our own
  log-probs of the completions that have no usable behaviour log-probs, a forward pass of the policy, inside
  the step's and the author's time budgets like everything above.

Every rejection is counted by reason, never raised. ``text_mismatch``, ``bad_token_id``,
``eos_mismatch``, ``bad_logprobs`` and ``score_timeout`` are offences: the author is reported once
(``penalize``, which bans it in the peer book) and its other groups are skipped for the call.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from node.exchange.plausibility import ScreenSettings, answer_token_span
from node.exchange.scoring import ScoringWorker
from node.exchange.screening import ScreenBook
from node.generation.rollouts import encode_prompt
from node.policy.logprobs import logit_micro_batches, right_pad, shared_prompt_logprobs
from node.policy.model import Policy
from node.policy.remix.logprobs import routed_logprobs
from node.policy.special import stop_ids
from node.tasks import Task, TaskError, TaskSource
from node.train.groups import TrainGroup
from node.train.screen import PeerScreen
from protocol.identity import peer_id_from_public_key
from protocol.records import Rollout, RolloutBatch, RolloutGroup
from protocol.taskref import TaskRef
from swarm.peer_book import MAX_TRACKED_PEERS

logger = logging.getLogger(__name__)

__all__ = ["OFFENCES", "REJECT_REASONS", "SURPLUS_REASONS", "IngestLimits", "Ingestor"]

OFFENCES = frozenset({"text_mismatch", "bad_token_id", "eos_mismatch", "bad_logprobs", "score_timeout"})
"""Rejections no honest peer causes: each bans the author (once per call). A screen's pause is not one
(``screen_paused``: ``AuthorVerdicts``; an honest peer at another stage of training fails the screen too)."""
REJECT_REASONS = frozenset({
    "unknown_task", "foreign_dataset", "seed_cap", "held_out", "too_long", "bad_token_id", "eos_mismatch",
    "special_token", "text_mismatch", "bad_logprobs", "untokenizable", "empty_completion", "empty_group",
    "score_error", "score_timeout", "scorer_unavailable", "peer_offended", "penalize_failed",
    "implausible", "too_long_for_us", "screen_paused",
})
"""Every reason ``ingest_rejected`` counts (docs/trust.md names each)."""
SURPLUS_REASONS = frozenset({"peer_budget", "step_budget", "not_needed"})
"""Why groups were left unread (``ingest_surplus``): budgets and the step's needs, not the peer's fault."""

_MIB = 1024 * 1024
_CHARS_PER_TOKEN = 16  # a re-tokenized text longer than this many chars per allowed token is not tokenized
_SEED_EPOCHS_KEPT = 8


@dataclass(frozen=True)
class IngestLimits:
    """Per-call (one step) budgets of ingestion; see the module docstring."""

    max_groups_per_peer: int = 16
    max_rollouts: int = 1024
    max_tokens: int = 256 * 1024
    max_seconds: float = 5.0
    max_seconds_per_peer: float = 2.0
    max_seeds_per_peer_epoch: int = 2
    min_logprob: float = -100.0
    anchor_bytes: int = 256 * _MIB


@dataclass
class _Budget:
    rollouts: int
    tokens: int
    deadline: float


class Ingestor:
    """Re-scores and re-tokenizes peers' rollouts for this node's policy; counts what it rejects."""

    def __init__(self, policy: Policy, source: TaskSource, *, temperature: float, max_completion_tokens: int,
                 max_peer_tokens: int | None = None, limits: IngestLimits | None = None,
                 scorer: ScoringWorker | None = None, penalize: Callable[[str, str], None] | None = None,
                 micro_batch_size: int = 256, anchor_flat_groups: bool = True,
                 screen: ScreenSettings | None = None) -> None:
        self.policy = policy
        # What a peer's text may teach: read with the frozen base (or the policy), bounded by the node's own
        # completions, one verdict a completion toward a pause (node.exchange.screening).
        self.book = ScreenBook(policy, screen or ScreenSettings(), temperature=temperature,
                               anchor_bytes=(limits or IngestLimits()).anchor_bytes, micro_batch_size=micro_batch_size,
                               max_authors=MAX_TRACKED_PEERS)
        self.screen, self.profile, self.verdicts = self.book.settings, self.book.profile, self.book.verdicts
        # A group whose re-scored rewards are all equal has zero advantage unless a baseline shift
        # (``train.external_shift``) gives it one; without a shift its anchors are never used.
        self.anchor_flat_groups = anchor_flat_groups
        self.source = source
        self.temperature = temperature
        self.max_completion_tokens = max_completion_tokens
        self.max_peer_tokens = max_peer_tokens or max_completion_tokens
        self.limits = limits or IngestLimits()
        self.scorer = scorer
        self.penalize = penalize
        self.micro_batch_size = micro_batch_size
        self.rejected: Counter[str] = Counter()
        self.surplus: Counter[str] = Counter()
        self.offences: Counter[str] = Counter()
        self.accepted_groups = 0
        self.retokenized = 0
        self.answers_verified = 0  # peer completions whose answer tokens count fully (screen.answer_full)
        self.reanchored = 0  # same tokenizer, but the peer prompted otherwise: our own anchor, not its log-probs
        self.last_seconds = 0.0
        tok = policy.tokenizer
        self._vocab_size = len(tok)
        self._eos = tok.eos_token_id
        # any of the model's end-of-sequence ids ends a completion (node.policy.special)
        self._stops = frozenset(stop_ids(getattr(policy, "model", None), tok))
        self._special = frozenset(int(i) for i in tok.all_special_ids)
        self._seeds: dict[tuple[str, int], set[int]] = {}  # (author, epoch) -> task seeds seen
        self.by_peer: OrderedDict[str, tuple[int, Counter[str]]] = OrderedDict()  # groups accepted, rejected
        self._peer: str | None = None  # whose groups are being looked at, for the per-peer counts

    def _reject(self, reason: str, detail: str, n: int = 1) -> None:
        self.rejected[reason] += n
        if self._peer is not None:
            self._peer_counts(self._peer)[1][reason] += n
        logger.debug("rejected peer rollout data (%s): %s", reason, detail)

    def _peer_counts(self, peer_id: str) -> tuple[int, Counter[str]]:
        """The per-peer counts of ``peer_id``, bounded: the peer heard from longest ago goes first."""
        counts = self.by_peer.pop(peer_id, None) or (0, Counter())
        self.by_peer[peer_id] = counts
        while len(self.by_peer) > MAX_TRACKED_PEERS:
            self.by_peer.popitem(last=False)
        return counts

    # -- one step ---------------------------------------------------------------------------------------

    def ingest(self, batch: RolloutBatch) -> list[TrainGroup]:
        """All usable groups of one batch (within the per-call budgets)."""
        return self.ingest_batches([batch], max_groups=len(batch.groups))

    def ingest_batches(self, batches: list[RolloutBatch], max_groups: int) -> list[TrainGroup]:
        """At most ``max_groups`` usable groups of ``batches`` (oldest first), fairly over their authors."""
        started = time.perf_counter()
        queues = self._queues(batches)
        budget = _Budget(self.limits.max_rollouts, self.limits.max_tokens, started + self.limits.max_seconds)
        groups: list[TrainGroup] = []
        used: Counter[str] = Counter()
        seconds: dict[str, float] = dict.fromkeys(queues, 0.0)
        while queues and len(groups) < max_groups and self._within(budget):
            for peer_id in list(queues):
                queue = queues[peer_id]
                if (not queue or used[peer_id] >= self.limits.max_groups_per_peer
                        or seconds[peer_id] >= self.limits.max_seconds_per_peer):
                    self._leave(queues.pop(peer_id), "peer_budget")
                    continue
                if len(groups) >= max_groups or not self._within(budget):
                    break
                epoch, rgroup = queue.popleft()
                t0 = time.perf_counter()
                self._peer = peer_id
                try:
                    group, offence = self._ingest_group(rgroup, peer_id, epoch, budget)
                finally:
                    self._peer = None
                seconds[peer_id] += time.perf_counter() - t0
                used[peer_id] += 1
                if group is not None:
                    groups.append(group)
                if offence == "screen_paused":  # the author's other groups wait for the pause to end
                    self._drop(peer_id, queues.pop(peer_id), "screen_paused")
                elif offence is not None:
                    self._offence(peer_id, offence)
                    self._drop(peer_id, queues.pop(peer_id), "peer_offended")
        leftover = "not_needed" if len(groups) >= max_groups else "step_budget"  # the step had all it can use
        for queue in queues.values():
            self._leave(queue, leftover)
        self.accepted_groups += len(groups)
        for peer_id, n in Counter(g.peer_id for g in groups).items():
            accepted, rejected = self._peer_counts(peer_id)
            self.by_peer[peer_id] = (accepted + n, rejected)
        self.last_seconds = time.perf_counter() - started
        return groups

    def _queues(self, batches: list[RolloutBatch]) -> dict[str, deque[tuple[int, RolloutGroup]]]:
        """Each author's groups, newest batch first; old seed records pruned."""
        queues: dict[str, deque[tuple[int, RolloutGroup]]] = {}
        for batch in reversed(batches):
            queue = queues.setdefault(peer_id_from_public_key(batch.author), deque())
            queue.extend((batch.epoch, group) for group in batch.groups)
        if batches:
            newest = max(b.epoch for b in batches)
            self._seeds = {k: v for k, v in self._seeds.items() if k[1] > newest - _SEED_EPOCHS_KEPT}
        return queues

    def _within(self, budget: _Budget) -> bool:
        return budget.rollouts > 0 and budget.tokens > 0 and time.perf_counter() < budget.deadline

    def _leave(self, queue: deque[tuple[int, RolloutGroup]], reason: str) -> None:
        """Groups not looked at because a budget or the step's need ran out: surplus, not rejected."""
        if queue:
            self.surplus[reason] += len(queue)
            logger.debug("%d peer groups left unread (%s)", len(queue), reason)

    def _drop(self, peer_id: str, queue: deque[tuple[int, RolloutGroup]], reason: str) -> None:
        if queue:
            self._peer = peer_id
            self._reject(reason, f"{len(queue)} groups not ingested", len(queue))
            self._peer = None

    def _offence(self, peer_id: str, reason: str) -> None:
        self.offences[reason] += 1
        if self.penalize is not None:
            try:
                self.penalize(peer_id, reason)
            except Exception as exc:  # reporting must never stop ingestion
                self.rejected["penalize_failed"] += 1
                logger.debug("could not report %s of %s: %r", reason, peer_id[:12], exc)

    # -- one group --------------------------------------------------------------------------------------

    def _ingest_group(self, rgroup: RolloutGroup, peer_id: str, epoch: int,
                      budget: _Budget) -> tuple[TrainGroup | None, str | None]:
        """``(group or None, why the author's other groups are skipped or None: an offence, or "screen_paused")``;
        budgets are charged for what is looked at, anchoring included.

        Our own anchors (a forward pass of the policy over every completion without usable behaviour
        log-probs) are computed here, group by group, so their time counts against the step's and the peer's
        time budgets: on a large model they, not scoring, are most of ingestion's cost. A group whose
        re-scored rewards are all equal carries no signal without a baseline shift (every advantage kind then
        gives it zero advantages and the node drops it before training), so it is not anchored unless ``anchor_flat_groups``."""
        cost = sum(max(len(r.completion_ids), 1) for r in rgroup.rollouts)
        if len(rgroup.rollouts) > budget.rollouts or cost > budget.tokens:
            self.surplus["step_budget"] += 1  # larger than what is left of the step's budget
            return None, None
        budget.rollouts -= len(rgroup.rollouts)
        budget.tokens -= cost
        if self.verdicts.paused(peer_id):  # before any work on its text
            self._reject("screen_paused", rgroup.task.key())
            return None, "screen_paused"
        reason = self._check_ref(rgroup.task, peer_id, epoch)
        if reason is not None:
            self._reject(reason, rgroup.task.key())
            return None, None
        try:
            task = self.source.task(rgroup.task)
        except TaskError as exc:
            self._reject("unknown_task", str(exc))
            return None, None
        if self.source.is_held_out(task):
            self._reject("held_out", task.ref.key())
            return None, None
        prompt_ids = encode_prompt(self.policy, self.source.format_prompt(task, self.policy.tokenizer))
        group = TrainGroup(key=task.ref.key(), dataset=task.ref.dataset, peer_id=peer_id, epoch=epoch,
                           prompt_ids=prompt_ids, completions=[], anchor_logprobs=[], rewards=[])
        texts: list[str] = []
        context = self.policy.context_length
        our_prompt = str(self.policy.tokenizer.decode(prompt_ids, skip_special_tokens=True))  # as peers send theirs
        for rollout in rgroup.rollouts:
            ids, lps, why = self._tokens(rollout, our_prompt)
            if ids is not None and context is not None and len(prompt_ids) + len(ids) > context:
                ids, lps, why = None, None, "too_long"  # more than our model takes (a peer's may take more)
            if why is not None or ids is None:
                self._reject(why or "empty_completion", task.ref.key())
                if why in OFFENCES:
                    return None, why
                continue
            group.completions.append(ids)
            group.anchor_logprobs.append(lps or [])
            texts.append(rollout.completion)
        if not group.completions:
            self._reject("empty_group", task.ref.key())
            return None, None
        rewards, offence = self._score(task, texts, budget.deadline)
        if rewards is None:
            return None, offence
        group.rewards = rewards
        if self.screen.enabled and self.screen.answer_full and task.answer is not None:
            decode = lambda ids: str(self.policy.tokenizer.decode(ids, skip_special_tokens=True))  # noqa: E731
            working = self.screen.answer_working
            group.answer_spans = [answer_token_span(decode, ids, task.answer, working) if r > 0 else None
                                  for ids, r in zip(group.completions, rewards)]
            self.answers_verified += sum(span is not None for span in group.answer_spans)
        if len(set(rewards)) > 1 or self.anchor_flat_groups:
            self._fill_anchors([(group, i) for i, lps in enumerate(group.anchor_logprobs) if not lps])
        return self._screened(group, peer_id)

    # -- what a peer's text may teach (node.exchange.screening) ------------------------------------------

    def observe_own(self, groups: list[TrainGroup]) -> None:
        """The node's own sampled groups: what a peer's text is held to (``ScreenBook.observe_own``)."""
        self.book.observe_own(groups)

    def screen_bounds(self) -> PeerScreen | None:
        """The bounds the trainer holds peers' tokens to this step (None with the screen off)."""
        return self.book.bounds()

    def paused(self, peer_id: str) -> bool:
        """Whether the screen has paused ``peer_id`` (its completions keep failing: ``AuthorVerdicts``)."""
        return self.book.verdicts.paused(peer_id)

    def record_screened(self, by_peer: dict[str, list[float]], step: int) -> None:
        """What training step ``step`` kept out of peers' text (``Trainer.screened``, empty when it trained on
        none): counted, each judged row one verdict; the rows dropped are rejections (``implausible``), and an
        author whose text keeps failing is paused (``ScreenBook.record``)."""
        for peer_id, dropped in self.book.record(by_peer, step).items():
            if dropped:
                self._peer = peer_id
                try:
                    self._reject("implausible", "trained rows", dropped)
                finally:
                    self._peer = None

    def _screened(self, group: TrainGroup, peer_id: str) -> tuple[TrainGroup | None, str | None]:
        """``group`` without the completions the length bound drops (``ScreenBook.judge_length``: judged here; the
        others are judged once, in training); ``(None, "screen_paused")`` once the author's text keeps failing."""
        too_long = self.book.judge_length(group, peer_id)
        if too_long:
            self._reject("too_long_for_us", group.key, too_long)
        if self.paused(peer_id):
            self._reject("screen_paused", group.key)
            return None, "screen_paused"
        if not group.completions:
            self._reject("empty_group", group.key)
            return None, None
        return group, None

    def _check_ref(self, ref: TaskRef, peer_id: str, epoch: int) -> str | None:
        """Cheap checks of a ref before any task is generated."""
        if ref.source != self.source.name or ref.config_hash != self.source.config_hash:
            return "unknown_task"
        if ref.dataset not in self.source.datasets:
            return "foreign_dataset"
        seeds = self._seeds.setdefault((peer_id, epoch), set())
        if ref.seed not in seeds:
            if len(seeds) >= self.limits.max_seeds_per_peer_epoch:
                return "seed_cap"
            seeds.add(ref.seed)
        return None

    def _tokens(self, rollout: Rollout, our_prompt: str) -> tuple[list[int] | None, list[float] | None, str | None]:
        """``(ids, behaviour log-probs or None to compute our anchor, rejection reason or None)``."""
        if rollout.tokenizer_fingerprint == self.policy.tokenizer_fingerprint:
            return self._own_tokens(rollout, our_prompt)
        return self._retokenize(rollout)

    def _own_tokens(self, rollout: Rollout, our_prompt: str) -> tuple[list[int] | None, list[float] | None, str | None]:
        """A peer with our tokenizer: its ids, checked as ours would be.

        Its behaviour log-probs are kept only when it prompted its model with the text we prompt ours with
        (``our_prompt``): prompting is each node's own (system prompt, worked examples), and log-probs
        computed under another prompt are not those of our policy's context."""
        ends_with_eos = rollout.finish_reason == "eos"
        ids = list(rollout.completion_ids)
        if len(ids) > self.max_completion_tokens:
            return None, None, "too_long"
        if any(i >= self._vocab_size for i in ids):
            return None, None, "bad_token_id"
        if ends_with_eos != (bool(ids) and ids[-1] in self._stops):  # a special id: an honest author's stop
            other_stop = ends_with_eos and bool(ids) and ids[-1] in self._special
            return None, None, "special_token" if other_stop else "eos_mismatch"
        body = ids[:-1] if ends_with_eos else ids
        if any(i in self._special for i in body):
            return None, None, "special_token"
        # We score the text but train on the ids: they must say exactly the same thing.
        if self.policy.tokenizer.decode(body, skip_special_tokens=False) != rollout.completion:
            return None, None, "text_mismatch"
        lps = list(rollout.behavior_logprobs)
        if lps and min(lps) < self.limits.min_logprob:
            return None, None, "bad_logprobs"
        if not ids:
            return None, None, "empty_completion"
        if rollout.prompt != our_prompt:
            self.reanchored += 1
            return ids, None, None
        return ids, lps, None

    def _retokenize(self, rollout: Rollout) -> tuple[list[int] | None, list[float] | None, str | None]:
        """A peer with another tokenizer: its text in our tokens; our own anchor is computed later."""
        tok = self.policy.tokenizer
        if len(rollout.completion) > _CHARS_PER_TOKEN * self.max_peer_tokens:
            return None, None, "too_long"
        ids = list(tok(rollout.completion, add_special_tokens=False)["input_ids"])
        # Text our tokenizer cannot spell (characters outside a character vocabulary become <unk>; a
        # normalizer may rewrite text): we would train on other text than the one we score.
        if tok.decode(ids, skip_special_tokens=False) != rollout.completion:
            return None, None, "untokenizable"
        if any(i in self._special for i in ids):  # literal special-token text, e.g. our EOS mid-completion
            return None, None, "special_token"
        if rollout.finish_reason == "eos" and self._eos is not None:
            ids.append(self._eos)
        if not ids:
            return None, None, "empty_completion"
        if len(ids) > self.max_peer_tokens:
            return None, None, "too_long"
        self.retokenized += 1
        return ids, None, None

    def _score(self, task: Task, texts: list[str], deadline: float) -> tuple[list[float] | None, str | None]:
        """Our own rewards for ``texts``, or ``(None, offence or None)`` when they could not be had."""
        if self.scorer is None or not self.source.isolated_scoring:
            errors = self.source.score_errors
            rewards = [float(self.source.score(task, text)) for text in texts]
            if self.source.score_errors != errors:
                self._reject("score_error", task.ref.key(), self.source.score_errors - errors)
            return rewards, None
        wait = max(0.0, deadline - time.perf_counter())  # a child still starting is waited for within the budget
        outcomes = self.scorer.score([(task.ref, text) for text in texts], wait=wait)
        statuses = Counter(o.status for o in outcomes)
        if statuses["timeout"]:
            self._reject("score_timeout", task.ref.key())
            return None, "score_timeout"
        if statuses["unavailable"] or statuses["skipped"]:
            self._reject("scorer_unavailable", task.ref.key())
            return None, None
        if statuses["error"]:
            self._reject("score_error", task.ref.key(), statuses["error"])
        return [o.reward for o in outcomes], None

    # -- anchors ----------------------------------------------------------------------------------------

    def _chunks(self, pending: list[tuple[TrainGroup, int]]) -> list[list[tuple[TrainGroup, int]]]:
        """Micro-batches whose logits fit ``anchor_bytes`` (``logprobs.logit_micro_batches``)."""
        vocab = int(getattr(getattr(self.policy.model, "config", None), "vocab_size", 0) or self._vocab_size)
        lengths = [len(group.completions[i]) for group, i in pending]
        return [pending[r.start : r.stop] for r in logit_micro_batches(lengths, vocab, self.limits.anchor_bytes,
                                                                        self.micro_batch_size)]

    @torch.no_grad()
    def _fill_anchors(self, pending: list[tuple[TrainGroup, int]]) -> None:
        """Our own log-probs of re-tokenized completions, computed once at ingestion: the TOPR anchor."""
        pad = self.policy.tokenizer.pad_token_id
        dev = self.policy.device
        for chunk in self._chunks(pending):
            comp_ids, comp_mask = (t.to(dev) for t in right_pad([g.completions[i] for g, i in chunk], pad, torch.long))
            prompts = [g.prompt_ids for g, _ in chunk]
            if self.policy.remix is None:  # a group's prompt runs once for all of its completions
                lps = shared_prompt_logprobs(self.policy.model, prompts, comp_ids, comp_mask, pad_id=pad,
                                             temperature=self.temperature)
            else:  # routed as generation routes it (top-k), once a prompt too
                lps = routed_logprobs(self.policy.model, self.policy.remix.deterministic(), prompts, comp_ids,
                                      comp_mask, pad_id=pad, temperature=self.temperature)
            for row, (group, i) in enumerate(chunk):
                n = len(group.completions[i])
                group.anchor_logprobs[i] = lps[row, :n].float().cpu().tolist()

    def metrics(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ingest_groups_accepted": self.accepted_groups, "ingest_retokenized": self.retokenized,
                               "ingest_reanchored": self.reanchored, "ingest_answers_verified": self.answers_verified,
                               "ingest_rejected": dict(self.rejected), "ingest_surplus": dict(self.surplus),
                               "ingest_offences": dict(self.offences),
                               "ingest_seconds": self.last_seconds, **self.book.metrics()}
        if self.scorer is not None:
            out.update(self.scorer.metrics())
        return out
