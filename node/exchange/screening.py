"""The peer-text screen's book outside the training pass: what the node's own completions look like (the
profile the bounds come from), who reads peer text (the frozen base, or the policy), one verdict per peer
completion toward a pause, and the figures (``node.exchange.plausibility`` has the statistics, ``node.train.screen``
the bounds on tensors, held in training).

With ``reference="base"`` (a LoRA policy), every completion the loss will push up of a peer group the step is
about to train on is read by the base once (``read_base``: the policy with its adapters switched off; its log-probs travel with the group as
``TrainGroup.reference_logprobs``), and so is a handful of the node's own completions a step, for the spans and
sequence log-probs of the profile: what a payload is judged by cannot move with the policy it trains. Only the
groups a step trains on are read (at most ``sapo.external_groups``), outside ingestion's time budgets. With
``reference="both"``, the same reads, and the bounds take the lower of the base's and the policy's log-prob of
each token (the training pass's for a peer's; the behaviour log-probs for the node's own, in the profile): text
fails if the base would not say it, or the node no longer would.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

import torch

from node.exchange.plausibility import AuthorVerdicts, OwnProfile, ScreenSettings
from node.policy.logprobs import FrozenPrefix, logit_micro_batches, right_pad, shared_prompt_logprobs
from node.policy.model import Policy
from node.train.groups import TrainGroup
from node.train.peer_rows import COUNTS
from node.train.screen import PeerScreen

logger = logging.getLogger(__name__)

__all__ = ["ScreenBook"]


class ScreenBook:
    """The screen's state in the exchange: settings, own profile, verdicts by author, the last step's figures."""

    def __init__(self, policy: Policy, settings: ScreenSettings, *, temperature: float, anchor_bytes: int,
                 micro_batch_size: int, max_authors: int) -> None:
        self.policy = policy
        self.settings = settings
        self.temperature = temperature
        self.anchor_bytes = anchor_bytes
        self.micro_batch_size = micro_batch_size
        self.profile = OwnProfile(settings)
        self.verdicts = AuthorVerdicts(settings, max_authors)
        # peer rows trained on, their tokens, tokens masked out of the loss, tokens pushed up, those tokens' weights
        self.totals = [0, 0, 0, 0, 0.0]
        self.last_step = dict.fromkeys(COUNTS, 0.0)  # the last training step's, all authors together
        self.step_authors: list[str] = []
        # the base's reads this step (reset by observe_own, the first call of a step): rows and seconds, own and peer
        self.reads = {"own_rows": 0, "own_seconds": 0.0, "peer_rows": 0, "peer_seconds": 0.0}
        self.own_steps = 0  # observe_own's calls once the profile held min_own spans (profile_every counts them)
        # The frozen base reads peer text: the adapters switched off for a forward pass (a plain-LoRA policy;
        # ReMix's routed adapters have no such switch).
        model = getattr(policy, "model", None)
        wants_base = settings.enabled and settings.reference in ("base", "both")
        self.base_reads = (wants_base and getattr(policy, "remix", None) is None
                           and callable(getattr(model, "disable_adapter", None)))
        # with "both", every bound reads the lower of the base's and the policy's log-prob of each token
        self.lower_of_both = self.base_reads and settings.reference == "both"
        # the prompts' shared prefix (system turn, worked example) read by the base once, its cache kept
        self.prefix = FrozenPrefix() if self.base_reads and settings.prefix_cache else None
        if wants_base and not self.base_reads and model is not None:
            logger.warning("ingest.screen_reference=%s needs a LoRA policy; the policy reads peer text instead",
                           settings.reference)

    def observe_own(self, groups: list[TrainGroup]) -> None:
        """Record the node's own sampled groups: their behaviour log-probs when the policy reads peer text; with
        the base, their lengths, and those ``_own_reads`` picks read by the base (with ``both``, each token at the
        lower of the base's log-prob and its behaviour log-prob, as peer text is read)."""
        self.reads = dict.fromkeys(self.reads, 0)
        if not self.base_reads:
            for group in groups:
                self.profile.observe(group.dataset, group.anchor_logprobs)
            return
        for group in groups:
            self.profile.observe_lengths(group.dataset, [len(ids) for ids in group.completions if ids])
        turns = self._own_reads(groups)
        if turns:
            start = time.perf_counter()
            read = self.base_logprobs([(g.prompt_ids, g.completions[k]) for g, k in turns])
            self.reads["own_rows"], self.reads["own_seconds"] = len(turns), time.perf_counter() - start
            for (group, k), lps in zip(turns, read):
                if self.lower_of_both and k < len(group.anchor_logprobs) and len(group.anchor_logprobs[k]) == len(lps):
                    lps = [min(b, p) for b, p in zip(lps, group.anchor_logprobs[k])]
                self.profile.observe(group.dataset, [lps], lengths=False)

    def _own_reads(self, groups: list[TrainGroup]) -> list[tuple[TrainGroup, int]]:
        """The own completions the base reads this step, a completion of each group in turn: ``profile_rows``
        (``min_own`` while the profile's spans are fewer; once they are not, on one step of each ``profile_every``
        and none on the others), and besides those every completion of a dataset whose sequence floor still lacks
        ``min_own`` of them (the floor is per dataset: a few reads a step shared among several datasets would leave
        it unset for tens of steps)."""
        s = self.settings
        want = s.min_own
        if len(self.profile.spans) >= s.min_own:
            want = s.profile_rows if self.own_steps % max(1, s.profile_every) == 0 else 0
            self.own_steps += 1
        missing: dict[str, int] = {}
        if s.sequence_quantile is not None:
            for g in groups:
                missing.setdefault(g.dataset, max(0, s.min_own - len(self.profile.sequences.get(g.dataset, ()))))
        width = max((len(g.completions) for g in groups), default=0)
        turns: list[tuple[TrainGroup, int]] = []
        general = 0
        for k in range(width):
            for g in groups:
                if k >= len(g.completions) or not g.completions[k]:
                    continue
                if missing.get(g.dataset, 0) > 0:
                    missing[g.dataset] -= 1
                elif general < want:
                    general += 1
                else:
                    continue
                turns.append((g, k))
        return turns

    def judge_length(self, group: TrainGroup, peer_id: str) -> int:
        """Drop from ``group`` the completions the loss would push up (reward above the group's mean; all with
        ``length_all``) longer than the node's own on the dataset allow (``OwnProfile.max_length``), each judged
        here, failed; returns how many. A completion kept is judged once, in training."""
        limit = self.profile.max_length(group.dataset) if self.settings.enabled else None
        held = self.settings.held_to_length(group.rewards)
        keep = [i for i, ids in enumerate(group.completions) if limit is None or len(ids) <= limit or not held[i]]
        too_long = len(group.completions) - len(keep)
        if too_long:
            self.verdicts.record(peer_id, too_long, too_long)
            group.keep_only(keep)
        return too_long

    def read_base(self, groups: list[TrainGroup]) -> None:
        """Give each peer group of ``groups`` not yet read the base's log-probs of its completions the loss pushes up
        (advantage above 0; an empty list for the others, which the training pass reads: a completion pushed down
        cannot teach the node its text). Nothing when the policy reads peer text."""
        pending = [g for g in groups if not g.is_local and not g.reference_logprobs and g.advantages is not None]
        if not self.base_reads or not pending:
            return
        up = [(g, i) for g in pending for i, a in enumerate(_advantages(g)) if a > 0 and g.completions[i]]
        start = time.perf_counter()
        read = iter(self.base_logprobs([(g.prompt_ids, g.completions[i]) for g, i in up]))
        self.reads["peer_rows"] += len(up)
        self.reads["peer_seconds"] += time.perf_counter() - start
        for group in pending:
            group.reference_logprobs = [[] for _ in group.completions]
        for (group, i), lps in zip(up, read):
            group.reference_logprobs[i] = lps

    @torch.no_grad()
    def base_logprobs(self, rows: list[tuple[list[int], list[int]]]) -> list[list[float]]:
        """The frozen base's log-probs (at the sampling temperature) of each ``(prompt, completion)``: a forward
        pass of the policy with its adapters switched off, in micro-batches whose logits fit ``anchor_bytes``;
        with ``prefix_cache``, the prefix the prompts share read from its kept cache."""
        tok, dev, model = self.policy.tokenizer, self.policy.device, self.policy.model
        vocab = int(getattr(getattr(model, "config", None), "vocab_size", 0) or len(tok))
        out: list[list[float]] = []
        with model.disable_adapter(), self._read_precision():  # type: ignore[operator]
            for r in logit_micro_batches([len(c) for _, c in rows], vocab, self.anchor_bytes, self.micro_batch_size):
                chunk = rows[r.start : r.stop]
                ids, mask = (t.to(dev) for t in right_pad([c for _, c in chunk], tok.pad_token_id, torch.long))
                lps = shared_prompt_logprobs(model, [p for p, _ in chunk], ids, mask, pad_id=tok.pad_token_id,
                                             temperature=self.temperature, prefix=self.prefix)
                out += [lps[k, : len(c)].float().cpu().tolist() for k, (_, c) in enumerate(chunk)]
        return out

    def _read_precision(self) -> contextlib.AbstractContextManager[Any]:
        """With ``read_dtype="bfloat16"`` and a float32 policy, bfloat16 autocast on the policy's device for the
        base's reads (the weights are not copied: each matrix product casts its inputs); else nothing. Every read of
        one book runs the same way, the prefix cache's too, so the bounds and the reads they judge agree."""
        model = self.policy.model
        first = next(model.parameters(), None) if isinstance(model, torch.nn.Module) else None
        if self.settings.read_dtype != "bfloat16" or first is None or first.dtype != torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.policy.device.type, dtype=torch.bfloat16)

    def bounds(self) -> PeerScreen | None:
        """The bounds the trainer holds peers' tokens to this step (None with the screen off)."""
        s = self.settings
        if not s.enabled:
            return None
        return PeerScreen(s.token_floor, s.window, self.profile.span_floor(), s.positive_floor, s.span_all,
                          s.share_dropped, self.profile.sequence_floors() if s.sequence_quantile is not None else None,
                          s.sequence_fail, s.group_cap, s.author_cap,
                          lower_of_both=self.lower_of_both, trusted=self.verdicts.trusted(),
                          settled=self.verdicts.settled(), probation_weight=s.probation_weight)

    def record(self, by_peer: dict[str, list[float]], step: int) -> dict[str, int]:
        """Training step ``step``'s ``Trainer.screened`` (per author, ``node.train.peer_rows.COUNTS``): each judged
        row one verdict, the figures added up, an author whose completions keep failing paused (logged); returns
        the rows dropped, by author."""
        self.verdicts.step = step
        self.last_step = dict.fromkeys(COUNTS, 0.0)
        dropped: dict[str, int] = {}
        for peer_id, values in by_peer.items():
            c = dict(zip(COUNTS, values))
            paused = self.verdicts.record(peer_id, int(c["judged"]), int(c["failed"]), dropped=int(c["dropped"]),
                                 tokens=int(c["tokens"]), masked=int(c["masked"]), pushed=int(c["pushed"]),
                                 weight=c["weight"], sequence_failed=int(c["sequence_failed"]),
                                 policy_failed=int(c["policy_failed"]))
            if paused:
                logger.debug("peer %s paused until step %d: its completions keep failing the screen (%s)", peer_id[:12],
                            self.verdicts.paused_until(peer_id), self.verdicts.summary(peer_id))
            for i, key in enumerate(("rows", "tokens", "masked", "pushed")):
                self.totals[i] += int(c[key])
            self.totals[4] += c["weight"]
            for key in COUNTS:
                self.last_step[key] += c[key]
            dropped[peer_id] = int(c["dropped"])
        self.step_authors = list(by_peer)
        return dropped

    def state(self) -> dict[str, Any]:
        """The profile and the verdicts, for a checkpoint: after a restart the bounds hold at once (no profile to
        fill again with the base's reads) and a paused author stays paused."""
        return {"profile": self.profile.state(), "verdicts": self.verdicts.state()}

    def load_state(self, state: dict[str, Any]) -> None:
        self.profile.load_state(state.get("profile") or {})
        self.verdicts.load_state(state.get("verdicts") or {})

    def metrics(self) -> dict[str, Any]:
        """``screen_rows``, ``screen_tokens``, ``screen_tokens_masked`` and ``screen_positive_weight`` over the run;
        with the screen on, its live bounds (``screen_span_floor``, absent until set; ``screen_length_bound`` and
        ``screen_sequence_floor`` by dataset), the last step's figures (``screen_step_*``: completions judged,
        failed, dropped, the share of peer tokens masked, the mean weight of those pushed up) and, for each author
        that step judged, its running figures (``screen_peer_*``, by peer id: ``AuthorVerdicts.summary``), and how
        many authors are paused now (``screen_peers_paused``) and how many of the step's are on trial
        (``screen_peers_on_trial``: their rows judged, not trained on). With the base as reference, what its reads took this
        step: ``screen_read_own_rows`` and ``screen_read_own_seconds`` (the profile's), ``screen_read_peer_rows`` and
        ``screen_read_peer_seconds`` (the completions of the peer groups trained on that the loss pushes up)."""
        rows, tokens, masked, pushed, weight = self.totals
        out: dict[str, Any] = {"screen_rows": rows, "screen_tokens": tokens, "screen_tokens_masked": masked,
                               "screen_positive_weight": weight / max(1, pushed)}
        if self.base_reads:
            out.update({f"screen_read_{k}": v for k, v in self.reads.items()})
        if not self.settings.enabled:
            return out
        step = self.last_step
        out.update({
            "screen_peers_paused": sum(self.verdicts.paused(a) for a in self.verdicts.figures),
            "screen_peers_on_trial": sum(self.verdicts.summary(a)["trial"] > 0 for a in self.step_authors),
            "screen_length_bound": {d: n for d in self.profile.lengths if (n := self.profile.max_length(d)) is not None},
            "screen_step_judged": int(step["judged"]), "screen_step_failed": int(step["failed"]),
            "screen_step_dropped": int(step["dropped"]),
            "screen_step_masked_share": step["masked"] / step["tokens"] if step["tokens"] else 0.0,
            "screen_step_weight": step["weight"] / step["pushed"] if step["pushed"] else 1.0,
        })
        floor = self.profile.span_floor()
        if floor is not None:
            out["screen_span_floor"] = floor
        if self.settings.sequence_quantile is not None:
            out["screen_sequence_floor"] = self.profile.sequence_floors()
        summaries = {a: self.verdicts.summary(a) for a in self.step_authors}
        for figure in ("judged", "failed", "dropped", "sequence_failed", "policy_failed", "tokens_masked",
                       "mean_weight", "pauses", "trial"):
            out[f"screen_peer_{figure}"] = {a: f[figure] for a, f in summaries.items()}
        return out


def _advantages(group: TrainGroup) -> list[float]:
    return [] if group.advantages is None else [float(a) for a in group.advantages.tolist()]
