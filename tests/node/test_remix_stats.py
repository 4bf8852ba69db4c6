"""The routing diagnostics (node/policy/remix/stats.py) against values worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from node.policy.remix.attach import attach_remix
from node.policy.remix.stats import balance, drift, lora_norms, routing_usage, specialisation
from tests.node.test_remix_fast import tiny_llama


def test_usage_counts_each_datasets_selections_per_layer() -> None:
    routing = torch.tensor([[[0, 1], [2, 3]], [[1, 0], [2, 0]], [[3, 2], [3, 2]]])  # [P=3, L=2, k=2]
    usage = routing_usage(routing, ["a", "b", "a"], n=4)
    assert usage == {"a": [[1, 1, 1, 1], [0, 0, 2, 2]], "b": [[1, 1, 0, 0], [1, 0, 1, 0]]}
    with pytest.raises(ValueError, match="3 routings for 2 prompts"):
        routing_usage(routing, ["a", "b"], n=4)


def test_balance_is_one_when_even_and_k_over_n_when_collapsed() -> None:
    assert balance({"a": [[5, 5, 5, 5]], "b": [[1, 1, 1, 1]]}) == pytest.approx(1.0)
    assert balance({"a": [[6, 6, 0, 0]], "b": [[2, 2, 0, 0]]}) == pytest.approx(2 / 4)  # two of four carry it all
    # one layer even, the other on one LoRA: the mean of 1 and 1/4
    assert balance({"a": [[1, 1, 1, 1], [4, 0, 0, 0]]}) == pytest.approx((1 + 1 / 4) / 2)


def test_specialisation_is_the_share_of_routing_entropy_the_dataset_explains() -> None:
    alike = {"a": [[2, 2, 2, 2]], "b": [[1, 1, 1, 1]]}
    assert specialisation(alike) == pytest.approx(0.0)
    apart = {"a": [[3, 3, 0, 0]], "b": [[0, 0, 3, 3]]}  # H(LoRA) = ln 4, H(LoRA | dataset) = ln 2
    assert specialisation(apart) == pytest.approx((math.log(4) - math.log(2)) / math.log(4))
    # a: LoRAs 0, 1 evenly; b (twice the prompts): 1, 2 evenly. p(LoRA) = (1/6, 1/2, 1/3, 0).
    mixed = {"a": [[2, 2, 0, 0]], "b": [[0, 4, 4, 0]]}
    marginal = -sum(p * math.log(p) for p in (1 / 6, 1 / 2, 1 / 3))
    assert specialisation(mixed) == pytest.approx((marginal - math.log(2)) / marginal)
    assert specialisation({"a": [[4, 0, 0, 0]]}) == 0.0  # no entropy to explain


def test_drift_counts_changed_sets_not_orders() -> None:
    before = torch.tensor([[[0, 1], [2, 3]], [[1, 2], [0, 3]]])
    after = torch.tensor([[[1, 0], [2, 3]], [[1, 2], [0, 1]]])  # only prompt 1, layer 1 changed its set
    assert drift(before, after) == pytest.approx(1 / 4)
    assert drift(before, before) == 0.0


def test_lora_norms_are_the_mean_size_of_each_loras_update() -> None:
    model = tiny_llama(seed=0)
    adapter = attach_remix(model, n=3, k=1, rank=2)
    assert lora_norms(adapter) == [0.0, 0.0, 0.0]  # B = 0
    expected = torch.zeros(3, dtype=torch.float64)
    linears = [lin for layer in adapter._linears for lin in layer.values()]
    with torch.no_grad():
        for lin in linears:
            lin.lora_B[1].normal_()
            for i in range(3):
                expected[i] += (lin.lora_B[i].double() @ lin.lora_A[i].double()).norm() * lin.omega
    got = lora_norms(adapter)
    assert got[0] == 0.0 and got[2] == 0.0
    assert got[1] == pytest.approx(float(expected[1]) / len(linears), rel=1e-9)
