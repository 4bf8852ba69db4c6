"""Routing diagnostics of a ReMix adapter: which LoRAs each dataset's prompts use, how evenly the load
spreads, how much the dataset decides the routing, how much the routing moved, how far each LoRA moved.

The node computes them at each evaluation from the held-out prompts' deterministic (top-k) routing, the
routing inference uses, on the same prompts every time (``node.run.node.Node.evaluate``); they are the
``routing_*`` metrics of ``docs/algorithms.md`` (section ReMix). Pure functions of the routing tensors, so
they are tested by hand.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from node.policy.remix.adapter import RemixAdapter


def routing_usage(routing: torch.Tensor, datasets: Sequence[str], n: int) -> dict[str, list[list[int]]]:
    """``{dataset: usage[L][n]}``: how often each LoRA of each layer was selected by the prompts of each
    dataset; ``routing`` is ``LongTensor[P, L, k]`` for the prompts, ``datasets`` one name a prompt."""
    if routing.shape[0] != len(datasets):
        raise ValueError(f"{routing.shape[0]} routings for {len(datasets)} prompts")
    out: dict[str, list[list[int]]] = {}
    for name in dict.fromkeys(datasets):
        rows = routing[[i for i, d in enumerate(datasets) if d == name]]  # [P_d, L, k]
        one_hot = torch.nn.functional.one_hot(rows.long(), n).sum(dim=(0, 2))  # [L, n]
        out[name] = one_hot.tolist()
    return out


def _entropy(p: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of each row of ``p`` (non-negative, summing to 1), ``0 log 0 = 0``."""
    return -(p * torch.where(p > 0, p.log(), torch.zeros_like(p))).sum(-1)


def balance(usage: dict[str, list[list[int]]]) -> float:
    """The load's spread over the n LoRAs, mean over layers: ``exp(H(load)) / n``, all datasets pooled.
    1 when every LoRA carries the same share; ``k/n`` when the same k carry all of it (collapse)."""
    counts = torch.tensor(list(usage.values()), dtype=torch.float64).sum(0)  # [L, n]
    load = counts / counts.sum(-1, keepdim=True).clamp(min=1)
    return float((_entropy(load).exp() / counts.shape[-1]).mean())


def specialisation(usage: dict[str, list[list[int]]]) -> float:
    """How much the dataset decides the routing, mean over layers: ``I(dataset; LoRA) / H(LoRA)`` over the
    selections (each dataset weighted by its prompts). 0 when every dataset is routed alike; with 4
    datasets each on its own 2 of 8 LoRAs, ``(ln 8 - ln 2) / ln 8 = 0.67``."""
    counts = torch.tensor(list(usage.values()), dtype=torch.float64)  # [D, L, n]
    per_dataset = counts.sum(-1, keepdim=True)  # [D, L, 1]
    weight = (per_dataset / per_dataset.sum(0, keepdim=True).clamp(min=1)).squeeze(-1)  # [D, L]
    conditional = (weight * _entropy(counts / per_dataset.clamp(min=1))).sum(0)  # H(LoRA | dataset), [L]
    pooled = counts.sum(0)
    marginal = _entropy(pooled / pooled.sum(-1, keepdim=True).clamp(min=1))  # H(LoRA), [L]
    share = torch.where(marginal > 0, (marginal - conditional) / marginal.clamp(min=1e-12), torch.zeros_like(marginal))
    return float(share.mean())


def drift(before: torch.Tensor, after: torch.Tensor) -> float:
    """The share of (prompt, layer) routings whose set of k LoRAs changed: ``[P, L, k]`` each."""
    if before.shape != after.shape:
        raise ValueError(f"routings of shapes {tuple(before.shape)} and {tuple(after.shape)}")
    same = (before.sort(-1).values == after.sort(-1).values).all(-1)
    return float(1.0 - same.double().mean())


def lora_norms(adapter: RemixAdapter) -> list[float]:
    """Per LoRA i: ``omega * ||B_i A_i||_F``, the size of the update it adds, mean over layers and
    projections (0 for a fresh adapter): how far each one has learned."""
    totals = torch.zeros(adapter.spec.n, dtype=torch.float64)
    count = 0
    with torch.no_grad():
        for linears in adapter._linears:
            for lin in linears.values():
                a, b = lin.lora_A.double(), lin.lora_B.double()  # ||B A||^2 = trace(B^T B A A^T): r x r products
                squared = (b.transpose(1, 2) @ b * (a @ a.transpose(1, 2))).sum(dim=(1, 2))
                totals += squared.clamp(min=0).sqrt().cpu() * lin.omega
                count += 1
    return (totals / max(count, 1)).tolist()


def routing_metrics(adapter: RemixAdapter, routing: torch.Tensor, datasets: Sequence[str],
                    previous: torch.Tensor | None) -> dict[str, Any]:
    """The ``routing_*`` metrics of one evaluation (``routing``: ``[P, L, k]`` of the held-out prompts, in
    the same order every time; ``previous``: the last evaluation's, or None)."""
    usage = routing_usage(routing, datasets, adapter.spec.n)
    out: dict[str, Any] = {
        "routing_balance": balance(usage),
        "routing_specialisation": specialisation(usage),
        "routing_lora_norm": {str(i): v for i, v in enumerate(lora_norms(adapter))},
        "routing_usage": usage,
    }
    if previous is not None and previous.shape == routing.shape:
        out["routing_drift"] = drift(previous, routing)
    return out
