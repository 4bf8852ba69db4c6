"""Operations a decode position costs in the node's HF sampling loop: ``bench_generation.py --count-ops``.

On a GPU a small model's decode step is launch-bound: its time is the number of operations the host
dispatches, not their arithmetic. The CPU proxy counted here is the number of torch.profiler events
(operators, nested ones included) per decode position: the loop generates 8 rows with EOS ignored, once
with ``FIRST`` and once with ``LAST`` new tokens, and the difference is divided by the positions between
(``LAST - FIRST``), so the prompt's prefill and the loop's set-up cancel out. Each position is one forward
of one token a row plus the sampling of the next token.
"""

from __future__ import annotations

import dataclasses
from typing import Any
from unittest import mock

import torch
from torch.profiler import ProfilerActivity, profile

from node.generation.base import SamplingSettings
from node.generation.hf import HFBackend
from node.modes import HfWeights
from node.policy.model import Policy

ROWS = 8
FIRST, LAST = 5, 20  # decode positions 5 to 20


class _NoEos:
    """The tokenizer's ids as the sampling loop reads them, with no EOS: every row runs every position."""

    eos_token_id = None

    def __init__(self, tokenizer: Any) -> None:
        self.pad_token_id = tokenizer.pad_token_id


def profiler_events(backend: HFBackend, prompts: list[list[int]], tokens: int) -> int:
    gen = torch.Generator(device=backend.policy.device).manual_seed(0)
    # no stop id either (the model's generation config declares its eos too): every row runs every position
    with mock.patch("node.generation.sampling.stop_ids", lambda model, tokenizer: ()), \
            profile(activities=[ProfilerActivity.CPU]) as prof:
        backend.generate(prompts, SamplingSettings(max_new_tokens=tokens), gen)
    return len(prof.events())


def events_per_position(policy: Policy, prompt: list[int], weights: HfWeights, batch_size: int) -> float:
    """Profiler events a decode position costs with the HF backend set up as the node sets it up."""
    quiet = dataclasses.replace(policy, tokenizer=_NoEos(policy.tokenizer))
    backend = HFBackend(quiet, batch_size=batch_size, weights=weights)
    prompts = [prompt] * ROWS
    profiler_events(backend, prompts, 3)  # warm-up: lazy initialisations stay out of the counts
    first, last = profiler_events(backend, prompts, FIRST), profiler_events(backend, prompts, LAST)
    backend.close()
    return (last - first) / (LAST - FIRST)


def count_ops(policy: Policy, prompt: list[int], weights: HfWeights, batch_size: int) -> None:
    """Print the node's figure and, beside it, the adapter-as-trained one (one line each)."""
    node = events_per_position(policy, prompt, weights, batch_size)
    print(f"events per decode position: {node:.0f}")
    if weights != "adapter":
        unmerged = events_per_position(policy, prompt, "adapter", batch_size)
        print(f"events per decode position with the adapter as trained (generation.hf.weights=adapter): "
              f"{unmerged:.0f} ({node / unmerged:.2f}x)")
    print(f"({ROWS} rows, decode positions {FIRST} to {LAST}, {next(policy.model.parameters()).dtype}, "
          f"{policy.device}; generation.hf.weights={weights})", flush=True)
