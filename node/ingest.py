"""Inbound records: a peer's verified batch into ``TrainGroup``s this node can train on.

Nothing the peer claims is believed: the task is regenerated from its ``TaskRef`` and every completion is
re-scored with our own verifier; a task of the held-out evaluation split (a property of the task's
content, the same on every node) is rejected, so a node never trains on what it is evaluated on; the prompt is our own formatting of the regenerated task; token ids and
behaviour log-probs are used only when the peer's tokenizer fingerprint equals ours, otherwise the text
is re-tokenized and our own log-probs at ingestion become the anchor. Rejections are counted by reason,
never raised. The outbound direction (our groups as records) is ``node.outbound``.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from typing import Any

import torch

from node.generation import left_pad, right_pad, sequence_logprobs
from node.policy.model import Policy
from node.rollouts import encode_prompt
from node.tasks import TaskError, TaskSource
from node.train.groups import TrainGroup
from protocol.identity import peer_id_from_public_key
from protocol.records import Rollout, RolloutBatch, RolloutGroup

logger = logging.getLogger(__name__)


class Ingestor:
    """Re-scores and re-tokenizes peers' rollouts for this node's policy; counts what it rejects."""

    def __init__(self, policy: Policy, source: TaskSource, *, temperature: float, max_completion_tokens: int,
                 micro_batch_size: int = 256) -> None:
        self.policy = policy
        self.source = source
        self.temperature = temperature
        self.max_completion_tokens = max_completion_tokens
        self.micro_batch_size = micro_batch_size
        self.rejected: Counter[str] = Counter()
        self.accepted_groups = 0
        self.retokenized = 0
        self.seconds = 0.0  # spent ingesting, for the per-step cost of sharing
        self._vocab_size = len(policy.tokenizer)

    def _reject(self, reason: str, detail: str) -> None:
        self.rejected[reason] += 1
        logger.debug("rejected peer rollout data (%s): %s", reason, detail)

    def ingest(self, batch: RolloutBatch) -> list[TrainGroup]:
        """All usable groups of one verified batch, with our own rewards and anchors."""
        started = time.perf_counter()
        peer_id = peer_id_from_public_key(batch.author)
        groups: list[TrainGroup] = []
        pending: list[tuple[TrainGroup, int]] = []  # (group, index) whose anchor we must compute
        for rgroup in batch.groups:
            group = self._ingest_group(rgroup, peer_id, batch.epoch, pending)
            if group is not None:
                groups.append(group)
        self._fill_anchors(pending)
        self.accepted_groups += len(groups)
        self.seconds += time.perf_counter() - started
        return groups

    def _ingest_group(self, rgroup: RolloutGroup, peer_id: str, epoch: int,
                      pending: list[tuple[TrainGroup, int]]) -> TrainGroup | None:
        try:
            task = self.source.task(rgroup.task)
        except TaskError as exc:
            self._reject("unknown_task", str(exc))
            return None
        if self.source.is_held_out(task):
            self._reject("held_out", task.ref.key())
            return None
        prompt_ids = encode_prompt(self.policy, self.source.format_prompt(task, self.policy.tokenizer))
        group = TrainGroup(key=task.ref.key(), dataset=task.ref.dataset, peer_id=peer_id, epoch=epoch, prompt_ids=prompt_ids,
                           completions=[], anchor_logprobs=[], rewards=[])
        for rollout in rgroup.rollouts:
            if rollout.task != rgroup.task:
                self._reject("task_mismatch", f"rollout task {rollout.task} in group {rgroup.task}")
                continue
            ids, lps = self._tokens(rollout)
            if ids is None:
                continue
            group.completions.append(ids)
            group.anchor_logprobs.append(lps or [])
            group.rewards.append(float(self.source.score(task, rollout.completion)))
            if lps is None:
                pending.append((group, len(group.completions) - 1))
        if not group.completions:
            self._reject("empty_group", task.ref.key())
            return None
        return group

    def _tokens(self, rollout: Rollout) -> tuple[list[int] | None, list[float] | None]:
        """Token ids for our policy and, when the peer's are usable as they are, its behaviour log-probs."""
        same_tokenizer = rollout.tokenizer_fingerprint == self.policy.tokenizer_fingerprint
        if same_tokenizer:
            ids = list(rollout.completion_ids)
            if any(i >= self._vocab_size for i in ids):
                self._reject("bad_token_id", f"id >= vocab size {self._vocab_size}")
                return None, None
            # We score the text but train on the ids: they must say the same thing.
            if self.policy.tokenizer.decode(ids, skip_special_tokens=True) != rollout.completion:
                self._reject("text_mismatch", "completion ids do not decode to the completion text")
                return None, None
            lps = list(rollout.behavior_logprobs)
            if not all(math.isfinite(x) and x <= 0.0 for x in lps):
                self._reject("bad_logprobs", "non-finite or positive log-prob")
                return None, None
        else:
            tok = self.policy.tokenizer
            ids = tok(rollout.completion, add_special_tokens=False)["input_ids"]
            if rollout.finish_reason == "eos" and tok.eos_token_id is not None:
                ids = [*ids, tok.eos_token_id]
            lps = None
            self.retokenized += 1
        if not ids:
            self._reject("empty_completion", "no tokens")
            return None, None
        if len(ids) > self.max_completion_tokens:
            self._reject("too_long", f"{len(ids)} tokens > {self.max_completion_tokens}")
            return None, None
        return ids, lps

    @torch.no_grad()
    def _fill_anchors(self, pending: list[tuple[TrainGroup, int]]) -> None:
        """Our own log-probs of re-tokenized completions, computed once at ingestion: the TOPR anchor."""
        pad = self.policy.tokenizer.pad_token_id
        for start in range(0, len(pending), self.micro_batch_size):
            chunk = pending[start : start + self.micro_batch_size]
            prompt_ids, prompt_mask = left_pad([g.prompt_ids for g, _ in chunk], pad)
            comp_ids, comp_mask = right_pad([g.completions[i] for g, i in chunk], pad, torch.long)
            dev = self.policy.device
            if self.policy.remix is not None:
                self.policy.remix.deterministic()
            lps = sequence_logprobs(self.policy.model, prompt_ids.to(dev), prompt_mask.to(dev), comp_ids.to(dev),
                                    comp_mask.to(dev), temperature=self.temperature, remix=self.policy.remix)
            for row, (group, i) in enumerate(chunk):
                n = len(group.completions[i])
                group.anchor_logprobs[i] = lps[row, :n].float().cpu().tolist()

    def metrics(self) -> dict[str, Any]:
        return {"ingest_groups_accepted": self.accepted_groups, "ingest_retokenized": self.retokenized,
                "ingest_rejected": dict(self.rejected), "ingest_seconds": self.seconds}
