"""An attacker node: it speaks the protocol like any peer (its own Ed25519 identity, signed batches published
through a real transport: an ``InMemoryHub`` member or a hivemind ``SwarmTransport``), names real tasks of the
swarm's task set, and fills each group with completions crafted by an ``Attack``: poisoned ones that the
verifier scores 1 and wrong ones that it scores 0. It needs no model: a malicious peer does not have to run
one, and the lab's CPU goes to the victim. Each crafted completion is checked against the task source's own
scorer before it is sent, so every poisoned completion it publishes passes the victim's verifier.

An echo attacker (``Attack.echo``) also listens: its transport receives every other member's signed batches, as
any peer's does, and it keeps the target's wrong completions (the verifier scores them below 1: reasoning-gym
gives a wrong answer partial credit, a well-formed weekday 0.1), with their own token ids,
tokenizer fingerprint and behaviour log-probs. Its groups then send those back beside the poisoned ones: the
most plausible wrong text there is to the victim, which a defence that drops only implausible rows lets
through as negatives alone."""

from __future__ import annotations

import itertools
import random
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from node.errors import TaskError
from protocol.identity import Identity
from protocol.records import Rollout, RolloutBatch, RolloutGroup, SamplingParams
from protocol.taskref import TaskRef
from scripts.lib.poison.attacks import Attack, plain_text, poisoned_text, wrong_text

FOREIGN_FINGERPRINT = "attacker-bytes"  # another tokenizer: the victim re-tokenizes the text
_CHARS_PER_TOKEN = 4  # the length attack's filler: characters a receiver's token holds, about
ECHO_TASKS = 64  # the target's latest tasks with a wrong completion an echo attacker remembers


class AttackerNode:
    """Publishes ``groups`` crafted groups a call of ``step()`` from each of its identities.

    ``join(settings, identity)`` is a transport factory (``InMemoryHub.join``); ``source`` the swarm's task
    source (same datasets and config hash as the victim's); ``tokenizer`` and ``fingerprint`` the victim's when
    the attack claims its tokenizer; ``prompt_of(task)`` the prompt text the victim formats for a task (sent as
    the rollout's prompt, so the victim keeps the claimed log-probs); ``max_tokens`` the victim's completion
    limit (the length attack fills up to it); ``target`` the public key whose batches an echo attacker sends
    back (what every batch it signs names; None: any other member's)."""

    def __init__(self, attack: Attack, join: Callable[[Any, Identity], Any], settings: Any, source: Any,
                 tokenizer: Any, fingerprint: str, prompt_of: Callable[[Any], str], *, group_size: int = 8,
                 groups: int = 4, max_tokens: int = 48, seed: int = 0, target: bytes | None = None) -> None:
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
        self.target = target
        self.heard: OrderedDict[TaskRef, list[Rollout]] = OrderedDict()  # the target's wrong completions, by task
        self.echoed = 0  # the target's completions sent back

    def step(self) -> int:
        """One batch from each identity; returns the groups published."""
        if self.attack.echo:
            self._listen()
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

    def _listen(self) -> None:
        """Read what the first identity's transport received since the last call (the verified batches a node's
        exchange reads, through the same ``collect``) and keep, a task, the target's completions that the
        verifier scores below 1 (below the poisoned ones: a negative advantage beside them), the latest
        ``ECHO_TASKS`` tasks."""
        own = {ident.public_key for ident in self.identities}
        for batch in self.transports[0].collect():
            if batch.author in own or (self.target is not None and batch.author != self.target):
                continue
            for group in batch.groups:
                try:
                    task = self.source.task(group.task)
                except TaskError:
                    continue
                if task.answer is None:
                    continue
                wrong = [r for r in group.rollouts if float(self.source.score(task, r.completion)) < 1.0]
                if wrong:
                    self.heard[group.task] = wrong
                    self.heard.move_to_end(group.task)
        while len(self.heard) > ECHO_TASKS:
            self.heard.popitem(last=False)

    def _echo(self) -> RolloutGroup | None:
        """A group of a task the target published wrong completions for: the poisoned completions, then the
        target's own wrong ones (repeated to fill the group). Each heard task is sent once, newest first: the
        same group again would be the same content, which a receiver drops. None when none is left."""
        a = self.attack
        while self.heard:
            ref, wrong = self.heard.popitem(last=True)
            task = self.source.task(ref)
            answer = str(task.answer)
            poisoned = poisoned_text(a, answer, 0)
            right = [poisoned] * a.poisoned + [plain_text(answer)] * a.plain
            if float(self.source.score(task, poisoned)) < 1.0:  # ``wrong`` was scored below 1 as it was heard
                self.skipped_tasks += 1
                continue
            prompt = self.prompt_of(task)
            echoes = [replace(r, prompt=prompt) for r in
                      itertools.islice(itertools.cycle(wrong), max(self.group_size - len(right), 0))]
            self.echoed += len(echoes)
            return RolloutGroup(task=ref, rollouts=(*(self._rollout(ref, prompt, t) for t in right), *echoes))
        return None

    def _group(self) -> RolloutGroup | None:
        """One crafted group, or None when no task with a checkable answer came up. An echo attacker sends back
        what it heard while it has some, and crafts its wrong completions only when it has none (before the
        target has published a wrong answer, or once all it heard is sent)."""
        if self.attack.echo:
            echoed = self._echo()
            if echoed is not None:
                return echoed
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
        poisoned = self._longest(answer) if a.length else poisoned_text(a, answer, 0, step=self.seq)
        texts = [poisoned] * a.poisoned_at(self.seq) + [plain_text(answer)] * a.plain
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
