"""GPU memory options, checked on CPU: gradient checkpointing changes memory, not the update; bf16 trains."""

from __future__ import annotations

import math

import pytest
import torch

from node.run.node import Node


def _one_step(cfg) -> tuple[dict, dict[str, torch.Tensor], set[torch.dtype]]:
    node = Node(cfg, cfg.run_dir, show_progress=False)
    node.setup()
    try:
        record = node.train_step()
        frozen = {p.dtype for p in node.policy.model.parameters() if not p.requires_grad}
        return record, node.policy.trainable_state(), frozen
    finally:
        node.close()


@pytest.mark.parametrize("kind", ["lora", "remix", "remix-spread"])  # ReMix: its routing hooks run again
def test_gradient_checkpointing_gives_the_same_update(fast_config, tmp_path, kind):
    common = ("train.eval_every=100", f"adapter.kind={kind.split('-')[0]}",
              f"adapter.remix.spread={str(kind == 'remix-spread').lower()}")
    plain, plain_state, _ = _one_step(fast_config(*common, f"run_dir={tmp_path / 'a'}"))
    ckpt, ckpt_state, _ = _one_step(fast_config(*common, "train.gradient_checkpointing=true", f"run_dir={tmp_path / 'b'}"))
    assert plain["train/n_sequences"] > 0 and ckpt["reward_mean"] == plain["reward_mean"]
    assert abs(ckpt["loss"] - plain["loss"]) < 1e-6 and abs(ckpt["grad_norm"] - plain["grad_norm"]) < 1e-5
    # Spread ReMix's routers are left out: at the first step every LoRA's B is 0 and no routing matters, so
    # their gradient is the noise of the baseline (other completions' values), small, and AdamW's first step
    # turns any gradient, however small, into a step of about the learning rate (1e-2): the rounding between
    # the two paths moves them by up to 2e-3.
    compared = [k for k in plain_state if not (kind == "remix-spread" and "router" in k)]
    assert len(compared) > len(plain_state) // 2
    moved = max((plain_state[k] - ckpt_state[k]).abs().max().item() for k in compared)
    # A checkpointed model returns no KV cache in training, so its rows run in full where the plain step runs
    # a group's prompt once (``shared_prompt_logprobs``; ReMix: once a routing, ``routed_logprobs``): the
    # same update up to float rounding.
    assert moved < 1e-5


def test_bfloat16_policy_trains_with_gradient_checkpointing(fast_config):
    record, state, frozen = _one_step(fast_config("model.dtype=bfloat16", "train.gradient_checkpointing=true",
                                                  "train.eval_every=100"))
    assert math.isfinite(record["loss"]) and record["grad_norm"] > 0
    assert frozen == {torch.bfloat16} and all(torch.isfinite(t).all() for t in state.values())


def test_a_memory_cap_holds_the_process_to_it_and_the_auto_sizes_read_it(monkeypatch):
    """``model.memory_mb``: the CUDA allocator's limit for the process, and the memory ``auto`` sizes read
    instead of the card's (checked with the device's properties faked: no GPU here)."""
    from node.config import load_config
    from node.policy import model as policy_model

    class Card:
        total_memory = 80 * 2**30

    fractions: list[float] = []
    indices: list[int] = []

    def set_fraction(fraction: float, device: object) -> None:  # as torch's: a device without an index fails
        if not isinstance(device, int):
            raise ValueError(f"Expected a torch.device with a specified index or an integer, but got:{device}")
        fractions.append(fraction)
        indices.append(device)

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: Card())
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", set_fraction)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    cuda = torch.device("cuda")  # model.device=cuda names no index: the current device's
    assert policy_model.device_memory_mb(cuda) == 81920 and policy_model.device_memory_mb(cuda, 12000) == 12000
    assert policy_model.device_memory_mb(cuda, 10**6) == 81920 and policy_model.device_memory_mb(torch.device("cpu")) is None
    policy_model.cap_device_memory(cuda, 12000)
    policy_model.cap_device_memory(cuda, None)
    policy_model.cap_device_memory(torch.device("cpu"), 12000)
    policy_model.cap_device_memory(torch.device("cuda:1"), 40000)
    assert fractions == [pytest.approx(12000 / 81920), pytest.approx(40000 / 81920)] and indices == [0, 1]
    train = load_config("configs/smollm2-gpu.yaml", ["model.memory_mb=40000"]).train
    assert train.logits_budget_mb("cuda", policy_model.device_memory_mb(cuda)) == 5120
    assert train.logits_budget_mb("cuda", policy_model.device_memory_mb(cuda, 40000)) == 2500
