"""A centred ReMix router (``adapter.remix.centre``): it reads a prompt's pooled layer input less a running
mean of the training batches' pooled inputs, worked out by hand on layer 0 (whose input is the embeddings)."""

from __future__ import annotations

from typing import Any, cast

import pytest
import torch

from node.policy.remix.adapter import CENTRE_MOMENTUM
from node.policy.remix.attach import RemixError, attach_remix
from tests.node.test_remix import VOCAB, one_thread, randomise_loras, tiny_llama

__all__ = ["one_thread"]  # the fixture, used here by name

PROMPT = 4  # prompt tokens of each 6-token row


def _batch(seed: int, rows: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, VOCAB, (rows, 6), generator=torch.Generator().manual_seed(seed))
    mask = torch.zeros(rows, 6, dtype=torch.bool)
    mask[:, :PROMPT] = True
    return ids, mask


def _pooled(model: Any, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return cast(torch.Tensor, model.model.embed_tokens(ids)[:, :PROMPT].float().mean(1))


def _centred_adapter(seed: int = 2) -> Any:
    model = tiny_llama(seed=seed)
    adapter = attach_remix(model, n=6, k=2, rank=2, centre=True)
    with torch.no_grad():
        for router in adapter._routers:
            router.weight.normal_(0, 5.0)
    return adapter


def test_the_running_mean_follows_training_batches_only_and_the_router_reads_the_input_less_it():
    adapter = _centred_adapter()
    model, layer0 = adapter.model, adapter._layers[0]
    ids0, mask0 = _batch(1)
    # Before any training batch the mean is zero: routing as without centring.
    adapter.deterministic().set_prompt_mask(mask0)
    with torch.no_grad():
        model(ids0)
    expected = torch.topk(adapter._routers[0](_pooled(model, ids0)), 2, dim=-1).indices
    assert torch.equal(adapter.last_routing()[:, 0], expected)
    assert not layer0.remix_centre.any() and int(layer0.remix_centre_n) == 0
    # Training batches (two routings a prompt, routing-major): an equal average of the first ones.
    adapter.sampled(2, torch.Generator().manual_seed(0))
    want = torch.zeros(model.config.hidden_size)
    for i, seed in enumerate((2, 3, 4)):
        ids, mask = _batch(seed)
        rows = ids.repeat(2, 1)
        adapter.set_prompt_mask(mask.repeat(2, 1))
        with torch.no_grad():
            model(rows)
        want = want + (1.0 / (i + 1)) * (_pooled(model, rows).mean(0) - want)
        assert torch.allclose(layer0.remix_centre, want, atol=1e-6) and int(layer0.remix_centre_n) == i + 1
        stored = adapter._routings[0].x_pool  # what the router scored, and what its log-prob is recomputed from
        assert torch.allclose(stored, _pooled(model, rows) - want, atol=1e-6)
    # Generation and evaluation read the mean without moving it.
    adapter.deterministic().set_prompt_mask(mask0)
    with torch.no_grad():
        model(ids0)
    expected = torch.topk(adapter._routers[0](_pooled(model, ids0) - want), 2, dim=-1).indices
    assert torch.equal(adapter.last_routing()[:, 0], expected)
    assert torch.allclose(layer0.remix_centre, want, atol=1e-6) and int(layer0.remix_centre_n) == 3
    # Once many batches are in, a batch moves the mean 1 - momentum of the way.
    layer0.remix_centre_n.fill_(10_000)
    before = layer0.remix_centre.clone()
    ids, mask = _batch(5)
    adapter.sampled(2, torch.Generator().manual_seed(1)).set_prompt_mask(mask.repeat(2, 1))
    with torch.no_grad():
        model(ids.repeat(2, 1))
    step = (1 - CENTRE_MOMENTUM) * (_pooled(model, ids).mean(0) - before)
    assert torch.allclose(layer0.remix_centre, before + step, atol=1e-6)


def test_the_running_mean_is_saved_and_restored_and_an_uncentred_state_does_not_fit():
    adapter = _centred_adapter(seed=3)
    randomise_loras(adapter, seed=4)
    adapter.sampled(2, torch.Generator().manual_seed(0))
    for seed in (6, 7):
        ids, mask = _batch(seed)
        adapter.set_prompt_mask(mask.repeat(2, 1))
        with torch.no_grad():
            adapter.model(ids.repeat(2, 1))
    state = adapter.state_dict_for_save()
    assert {"layers.0.router.centre", "layers.1.router.centre_n"} <= set(state)
    assert int(state["layers.1.router.centre_n"]) == 2 and state["layers.0.router.centre"].abs().sum() > 0
    loaded = attach_remix(tiny_llama(seed=3), n=6, k=2, rank=2, centre=True)
    loaded.load_saved_state(state)
    ids, mask = _batch(8, rows=3)
    outputs, routings = [], []
    for a in (adapter, loaded):
        a.deterministic().set_prompt_mask(mask)
        with torch.no_grad():
            outputs.append(a.model(ids).logits)
        routings.append(a.last_routing())
    assert torch.equal(outputs[0], outputs[1]) and torch.equal(routings[0], routings[1])
    plain = attach_remix(tiny_llama(seed=3), n=6, k=2, rank=2).state_dict_for_save()
    assert not [name for name in plain if "centre" in name]  # an uncentred adapter saves what it always did
    with pytest.raises(RemixError, match="missing="):
        attach_remix(tiny_llama(seed=3), n=6, k=2, rank=2, centre=True).load_saved_state(plain)


def test_the_config_key_reaches_the_adapter():
    from node.config import load_config
    from node.policy.model import build_policy

    cfg = load_config("configs/tiny-silo.yaml", ["adapter.kind=remix", "adapter.remix.centre=true"])
    policy = build_policy(cfg.model, cfg.adapter, cfg.seed)
    assert policy.remix is not None and policy.remix.spec.centre
    assert not load_config("configs/tiny-silo.yaml", ["adapter.kind=remix"]).adapter.remix.centre
