"""From tasks to scored, tokenized groups: prompt encoding, sampling G completions per task, scoring.

Used by the node loop for its own groups and by evaluation (greedy, one completion per task).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from node.generation import Completions, generate
from node.policy.model import Policy
from node.tasks import Task, TaskSource
from node.train.trainer import TrainGroup


def encode_prompt(policy: Policy, text: str) -> list[int]:
    """Token ids of a formatted prompt, with BOS in front when the tokenizer has one and the text lacks it."""
    tok = policy.tokenizer
    ids: list[int] = tok(text, add_special_tokens=False)["input_ids"]
    bos = tok.bos_token_id
    if bos is not None and (not ids or ids[0] != bos):
        ids = [bos, *ids]
    return ids


def decode_completion(policy: Policy, ids: list[int]) -> str:
    return policy.tokenizer.decode(ids, skip_special_tokens=True)


@dataclass
class SampledGroup:
    """One task's completions as sampled here, with everything a rollout record needs."""

    task: Task
    group: TrainGroup
    texts: list[str]
    finish_reasons: list[str]


def _generate_batched(policy: Policy, prompts: list[list[int]], batch_size: int, **kwargs: object) -> list[Completions]:
    return [
        generate(policy.model, policy.tokenizer, prompts[i : i + batch_size], device=policy.device,
                 remix=policy.remix, **kwargs)  # type: ignore[arg-type]
        for i in range(0, len(prompts), batch_size)
    ]


def sample_groups(policy: Policy, source: TaskSource, tasks: list[Task], *, group_size: int, max_new_tokens: int,
                  temperature: float, top_p: float, batch_size: int, generator: torch.Generator,
                  epoch: int = 0) -> list[SampledGroup]:
    """Sample ``group_size`` completions for each task and score each with the task's own verifier."""
    prompts = [encode_prompt(policy, source.format_prompt(t, policy.tokenizer)) for t in tasks]
    flat = [p for p in prompts for _ in range(group_size)]
    outs = _generate_batched(policy, flat, batch_size, max_new_tokens=max_new_tokens, temperature=temperature,
                             top_p=top_p, generator=generator)
    rows: list[tuple[list[int], list[float], str, list[int]]] = []
    for out in outs:
        for i in range(out.completion_ids.shape[0]):
            ids, lps = out.row(i)
            routing = out.routing[i].flatten().tolist() if out.routing is not None else []
            rows.append((ids, lps, out.finish_reasons[i], routing))
    groups = []
    for t_idx, task in enumerate(tasks):
        chunk = rows[t_idx * group_size : (t_idx + 1) * group_size]
        texts = [decode_completion(policy, ids) for ids, _, _, _ in chunk]
        rewards = [float(source.score(task, text)) for text in texts]
        group = TrainGroup(key=task.ref.key(), peer_id="", epoch=epoch, prompt_ids=prompts[t_idx],
                           completions=[c[0] for c in chunk], anchor_logprobs=[c[1] for c in chunk],
                           rewards=rewards, routings=[c[3] for c in chunk])
        groups.append(SampledGroup(task=task, group=group, texts=texts, finish_reasons=[c[2] for c in chunk]))
    return groups


def greedy_accuracy(policy: Policy, source: TaskSource, tasks: list[Task], *, max_new_tokens: int,
                    batch_size: int) -> float:
    """Mean score of one greedy completion per task (the evaluation metric)."""
    if not tasks:
        return float("nan")
    prompts = [encode_prompt(policy, source.format_prompt(t, policy.tokenizer)) for t in tasks]
    outs = _generate_batched(policy, prompts, batch_size, max_new_tokens=max_new_tokens, greedy=True)
    scores = []
    i = 0
    for out in outs:
        for r in range(out.completion_ids.shape[0]):
            ids, _ = out.row(r)
            scores.append(float(source.score(tasks[i], decode_completion(policy, ids))))
            i += 1
    return sum(scores) / len(scores)
