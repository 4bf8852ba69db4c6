"""The generation-backend interface and the settings of one generate call."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from node.generation.sampling import Completions


@dataclass(frozen=True)
class SamplingSettings:
    """How to sample: ``greedy`` ignores temperature and top-p (evaluation)."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    greedy: bool = False


class GenerationBackend(Protocol):
    """Samples completions from the node's *current* policy.

    ``generate`` returns one completion per prompt (token-id lists, formatted, BOS included), with the
    behaviour log-probs of the distribution each token was drawn from (after temperature and top-p).
    ``sync`` is called after every optimizer step and after a checkpoint restore: once it returns, the next
    ``generate`` samples from the updated policy. It returns timing stats for the metrics.

    ``max_len`` is the longest prompt plus completion the backend runs (None: no limit known). Every prompt
    must be shorter; a completion that reaches it ends there with finish reason ``length``.
    """

    name: str
    max_len: int | None

    def generate(self, prompts: list[list[int]], settings: SamplingSettings,
                 generator: torch.Generator | None = None) -> Completions: ...

    def sync(self) -> dict[str, float]: ...

    def close(self) -> None: ...


def request_seeds(generator: torch.Generator | None, n: int) -> list[int] | None:
    """``n`` per-request sampling seeds drawn from ``generator`` (on its own device), or None without one."""
    if generator is None:
        return None
    return torch.randint(0, 2**62, (n,), generator=generator, device=generator.device).tolist()


def check_prompts_fit(prompts: list[list[int]], max_len: int | None) -> None:
    """Raise ``ValueError`` when a prompt leaves no room for a completion within ``max_len`` tokens; callers
    set such tasks aside first (``node.generation.rollouts.split_by_fit``)."""
    longest = max((len(p) for p in prompts), default=0)
    if max_len is not None and longest >= max_len:
        raise ValueError(f"a prompt of {longest} tokens leaves no room for a completion within {max_len} tokens")
