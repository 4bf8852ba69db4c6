"""From tasks to scored, tokenized groups: prompt encoding, sampling G completions per task, scoring.

Used by the node loop for its own groups and by evaluation (greedy, one completion per task).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from node.generation.base import GenerationBackend, SamplingSettings
from node.policy.model import Policy
from node.policy.special import stop_ids
from node.tasks import Task, TaskSource
from node.train.groups import TrainGroup


def encode_prompt(policy: Policy, text: str) -> list[int]:
    """Token ids of a formatted prompt, with BOS in front when the tokenizer has one and the text lacks it."""
    tok = policy.tokenizer
    ids: list[int] = tok(text, add_special_tokens=False)["input_ids"]
    bos = tok.bos_token_id
    if bos is not None and (not ids or ids[0] != bos):
        ids = [bos, *ids]
    return ids


def split_by_fit(policy: Policy, source: TaskSource, tasks: list[Task],
                 max_len: int | None) -> tuple[list[Task], list[Task]]:
    """``tasks`` as (those whose formatted prompt leaves room for a completion within ``max_len`` tokens, the
    rest): a generation backend cannot take a prompt as long as the model's context."""
    if max_len is None:
        return list(tasks), []
    fit: list[Task] = []
    too_long: list[Task] = []
    for task in tasks:
        n = len(encode_prompt(policy, source.format_prompt(task, policy.tokenizer)))
        (fit if n < max_len else too_long).append(task)
    return fit, too_long


def decode_completion(policy: Policy, ids: list[int]) -> str:
    """The text of sampled ids as it is scored: the final end-of-sequence id dropped, any other special token
    kept.

    Special tokens are not skipped, so a completion with e.g. an EOS in the middle is scored as the
    text it is, not as the answer hiding behind it; peers' rollouts are checked the same way on arrival.
    """
    body = ids[:-1] if ids and ids[-1] in stop_ids(policy.model, policy.tokenizer) else ids
    return str(policy.tokenizer.decode(body, skip_special_tokens=False))


@dataclass
class SampledGroup:
    """One task's completions as sampled here, with everything a rollout record needs."""

    task: Task
    group: TrainGroup
    texts: list[str]
    finish_reasons: list[str]


def sample_groups(backend: GenerationBackend, policy: Policy, source: TaskSource, tasks: list[Task], *,
                  group_size: int, settings: SamplingSettings, generator: torch.Generator,
                  epoch: int = 0) -> list[SampledGroup]:
    """Sample ``group_size`` completions for each task and score each with the task's own verifier."""
    prompts = [encode_prompt(policy, source.format_prompt(t, policy.tokenizer)) for t in tasks]
    flat = [p for p in prompts for _ in range(group_size)]
    out = backend.generate(flat, settings, generator)
    rows: list[tuple[list[int], list[float], str, list[int]]] = []
    for i in range(out.completion_ids.shape[0]):
        ids, lps = out.row(i)
        routing = out.routing[i].flatten().tolist() if out.routing is not None else []
        rows.append((ids, lps, out.finish_reasons[i], routing))
    groups = []
    for t_idx, task in enumerate(tasks):
        chunk = rows[t_idx * group_size : (t_idx + 1) * group_size]
        texts = [decode_completion(policy, ids) for ids, _, _, _ in chunk]
        rewards = [float(source.score(task, text)) for text in texts]
        group = TrainGroup(key=task.ref.key(), dataset=task.ref.dataset, peer_id="", epoch=epoch, prompt_ids=prompts[t_idx],
                           completions=[c[0] for c in chunk], anchor_logprobs=[c[1] for c in chunk],
                           rewards=rewards, routings=[c[3] for c in chunk])
        groups.append(SampledGroup(task=task, group=group, texts=texts, finish_reasons=[c[2] for c in chunk]))
    return groups


def _downsample(chunk: list[int], rewards: list[float], n: int, rng: torch.Generator,
                positive_threshold: float = 1.0) -> list[int]:
    """Up to ``n`` of the indices ``chunk``: half positive (reward >= ``positive_threshold``) and half
    negative where possible."""
    order = [chunk[i] for i in torch.randperm(len(chunk), generator=rng, device=rng.device).tolist()]
    pos = [i for i in order if rewards[i] >= positive_threshold]
    neg = [i for i in order if rewards[i] < positive_threshold]
    take_pos = min(len(pos), max(n // 2, n - len(neg)))
    take_neg = min(len(neg), n - take_pos)
    return sorted(pos[:take_pos] + neg[:take_neg])


def sample_groups_adaptive(backend: GenerationBackend, policy: Policy, source: TaskSource, tasks: list[Task], *,
                           group_size: int, round_size: int, max_rounds: int, mode: str, settings: SamplingSettings,
                           generator: torch.Generator, epoch: int = 0,
                           positive_threshold: float = 1.0) -> list[SampledGroup]:
    """Reinforce-Ada: draw ``round_size`` completions per active task per round, up to ``max_rounds``; a task
    leaves the active set once it has ``group_size/2`` positives and negatives (``ada_balanced``) or one
    positive (``ada_positive``). A positive is a completion with reward >= ``positive_threshold`` (1.0:
    fully correct, so partial credit counts as negative). Each task is downsampled to ``group_size``
    completions, balanced where possible; ``all_rewards`` keeps every reward drawn, for the global
    baseline (``node.train.groups.assign_advantages`` uses it whatever the configured advantage)."""
    pools: list[list[SampledGroup]] = [[] for _ in tasks]
    active = list(range(len(tasks)))
    for _ in range(max_rounds):
        if not active:
            break
        drawn = sample_groups(backend, policy, source, [tasks[i] for i in active], group_size=round_size,
                              settings=settings, generator=generator, epoch=epoch)
        still = []
        for i, sg in zip(active, drawn):
            pools[i].append(sg)
            rewards = [r for part in pools[i] for r in part.group.rewards]
            n_pos = sum(r >= positive_threshold for r in rewards)
            done = n_pos >= 1 if mode == "ada_positive" else (
                n_pos >= group_size / 2 and len(rewards) - n_pos >= group_size / 2)
            if not done:
                still.append(i)
        active = still
    return [_merge_pool(parts, group_size, generator, positive_threshold) for parts in pools]


def _merge_pool(parts: list[SampledGroup], n: int, rng: torch.Generator, positive_threshold: float) -> SampledGroup:
    """One task's rounds as one group of up to ``n`` completions; ``all_rewards`` keeps every draw."""
    first = parts[0].group
    rewards = [r for p in parts for r in p.group.rewards]
    keep = _downsample(list(range(len(rewards))), rewards, n, rng, positive_threshold)

    def kept(values: list[Any]) -> list[Any]:
        return [values[i] for i in keep] if values else []

    completions = [c for p in parts for c in p.group.completions]
    anchors = [a for p in parts for a in p.group.anchor_logprobs]
    routings = [r for p in parts for r in p.group.routings]
    group = TrainGroup(key=first.key, dataset=first.dataset, peer_id="", epoch=first.epoch, prompt_ids=first.prompt_ids,
                       completions=kept(completions), anchor_logprobs=kept(anchors), rewards=kept(rewards),
                       routings=kept(routings), all_rewards=rewards)
    texts = [t for p in parts for t in p.texts]
    reasons = [r for p in parts for r in p.finish_reasons]
    return SampledGroup(task=parts[0].task, group=group, texts=kept(texts), finish_reasons=kept(reasons))


def score_tasks(backend: GenerationBackend, policy: Policy, source: TaskSource, tasks: list[Task],
                settings: SamplingSettings, generator: torch.Generator | None = None) -> list[float]:
    """The score of one completion per task (greedy or sampled, as ``settings`` say); a task whose prompt
    does not fit the backend's context scores 0."""
    return score_tasks_routed(backend, policy, source, tasks, settings, generator)[0]


def score_tasks_routed(backend: GenerationBackend, policy: Policy, source: TaskSource, tasks: list[Task],
                       settings: SamplingSettings, generator: torch.Generator | None = None,
                       ) -> tuple[list[float], list[torch.Tensor | None]]:
    """``score_tasks`` and, a task, the ReMix routing its completion used (``[L, k]``; None without ReMix
    or for a task that did not fit)."""
    prompts = [encode_prompt(policy, source.format_prompt(t, policy.tokenizer)) for t in tasks]
    fit = [i for i, p in enumerate(prompts) if backend.max_len is None or len(p) < backend.max_len]
    scores = [0.0] * len(tasks)
    routings: list[torch.Tensor | None] = [None] * len(tasks)
    if fit:
        out = backend.generate([prompts[i] for i in fit], settings, generator)
        for row, i in enumerate(fit):
            scores[i] = float(source.score(tasks[i], decode_completion(policy, out.row(row)[0])))
            routings[i] = out.routing[row] if out.routing is not None else None
    return scores, routings


def greedy_accuracy(backend: GenerationBackend, policy: Policy, source: TaskSource, tasks: list[Task], *,
                    max_new_tokens: int) -> float:
    """Mean score of one greedy completion per task (the evaluation metric); a task whose prompt does not
    fit the backend's context scores 0."""
    if not tasks:
        return float("nan")
    scores = score_tasks(backend, policy, source, tasks, SamplingSettings(max_new_tokens=max_new_tokens, greedy=True))
    return sum(scores) / len(tasks)
