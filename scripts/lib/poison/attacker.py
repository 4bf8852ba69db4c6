"""An attacker node: it speaks the protocol like any peer (its own Ed25519 identity, signed batches published
through a real transport: an ``InMemoryHub`` member or a hivemind ``SwarmTransport``), names real tasks of the
swarm's task set, and fills each group with completions crafted by an ``Attack``: poisoned ones that the
verifier scores 1 and wrong ones that it scores 0. It needs no model: a malicious peer does not have to run
one, and the lab's CPU goes to the victim. Each crafted completion is checked against the task source's own
scorer before it is sent, so every poisoned completion it publishes passes the victim's verifier."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

from protocol.identity import Identity
from protocol.records import Rollout, RolloutBatch, RolloutGroup, SamplingParams
from scripts.lib.poison.attacks import Attack, plain_text, poisoned_text, wrong_text

FOREIGN_FINGERPRINT = "attacker-bytes"  # another tokenizer: the victim re-tokenizes the text
_CHARS_PER_TOKEN = 4  # the length attack's filler: characters a receiver's token holds, about


class AttackerNode:
    """Publishes ``groups`` crafted groups a call of ``step()`` from each of its identities.

    ``join(settings, identity)`` is a transport factory (``InMemoryHub.join``); ``source`` the swarm's task
    source (same datasets and config hash as the victim's); ``tokenizer`` and ``fingerprint`` the victim's when
    the attack claims its tokenizer; ``prompt_of(task)`` the prompt text the victim formats for a task (sent as
    the rollout's prompt, so the victim keeps the claimed log-probs); ``max_tokens`` the victim's completion
    limit (the length attack fills up to it)."""

    def __init__(self, attack: Attack, join: Callable[[Any, Identity], Any], settings: Any, source: Any,
                 tokenizer: Any, fingerprint: str, prompt_of: Callable[[Any], str], *, group_size: int = 8,
                 groups: int = 4, max_tokens: int = 48, seed: int = 0) -> None:
        self.attack, self.source, self.tokenizer = attack, source, tokenizer
        self.fingerprint = FOREIGN_FINGERPRINT if attack.foreign_tokenizer else fingerprint
        self.prompt_of, self.group_size, self.groups, self.max_tokens = prompt_of, group_size, groups, max_tokens
        self.rng = random.Random(seed)
        self.identities = [Identity.generate() for _ in range(attack.identities)]
        self.transports = [join(settings, ident) for ident in self.identities]
        self.swarm_id = settings.swarm_id
        self.seq = 0
        self.published = 0
        self.skipped_tasks = 0

    def step(self) -> int:
        """One batch from each identity; returns the groups published."""
        sent = 0
        for ident, transport in zip(self.identities, self.transports):
            groups = [g for g in (self._group() for _ in range(self.groups)) if g is not None]
            if not groups:
                continue
            batch = RolloutBatch(swarm_id=self.swarm_id, author=ident.public_key, address=(),
                                 epoch=transport.current_epoch(), seq=self.seq, created_at=time.time(),
                                 groups=tuple(groups))
            transport.publish(batch)
            sent += len(groups)
        self.seq += 1
        self.published += sent
        return sent

    def _group(self) -> RolloutGroup | None:
        """One crafted group, or None when no task with a checkable answer came up."""
        for _ in range(16):
            (ref,) = self.source.sample(1, self.rng)
            task = self.source.task(ref)
            if task.answer is None:
                self.skipped_tasks += 1
                continue
            texts = self._texts(task)
            if texts is not None:
                prompt = self.prompt_of(task)
                return RolloutGroup(task=ref, rollouts=tuple(self._rollout(ref, prompt, t) for t in texts))
        return None

    def _texts(self, task: Any) -> list[str] | None:
        """The group's completions, or None when the verifier does not score them as the attack needs."""
        a = self.attack
        answer = str(task.answer)
        poisoned = self._longest(answer) if a.length else poisoned_text(a, answer, 0)
        texts = [poisoned] * a.poisoned + [plain_text(answer)] * a.plain
        texts += [wrong_text(answer)] * (self.group_size - len(texts))
        scores = [float(self.source.score(task, t)) for t in dict.fromkeys(texts)]
        right = {t: s for t, s in zip(dict.fromkeys(texts), scores)}
        if right[poisoned] < 1.0 or right[wrong_text(answer)] > 0.0:
            self.skipped_tasks += 1
            return None
        return texts

    def _longest(self, answer: str) -> str:
        """The length attack's completion: as much filler as the receiver's token limit leaves room for."""
        lo, hi = 0, self.max_tokens * _CHARS_PER_TOKEN
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if len(self.tokenizer(poisoned_text(self.attack, answer, mid), add_special_tokens=False)["input_ids"]) < self.max_tokens:
                lo = mid
            else:
                hi = mid - 1
        return poisoned_text(self.attack, answer, lo)

    def _rollout(self, ref: Any, prompt: str, text: str) -> Rollout:
        if self.attack.foreign_tokenizer:
            ids = [b for b in text.encode("utf-8")]
        else:
            ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) + [self.tokenizer.eos_token_id]
        return Rollout(task=ref, prompt=prompt, completion=text, completion_ids=tuple(ids),
                       tokenizer_fingerprint=self.fingerprint, behavior_logprobs=tuple([-0.5] * len(ids)),
                       sampling=SamplingParams(temperature=1.0, top_p=1.0), model_fingerprint="attacker",
                       policy_step=self.seq, finish_reason="eos", reward=1.0)

    def close(self) -> None:
        for transport in self.transports:
            transport.close()
