"""Tests of the ReMix routed-LoRA adapter (node/policy/remix/attach.py) on a tiny random Llama."""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Iterator
from typing import Any, cast

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, LlamaForCausalLM

from node.policy.families import MLP as MLP_PROJECTIONS
from node.policy.remix.attach import (
    RemixAdapter,
    RemixError,
    attach_remix,
    gumbel_topk,
    plackett_luce_logprob,
)
from node.policy.remix.ops import LayerRouting, RemixLinear

VOCAB = 64


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """These tensors are tiny: one thread avoids OpenMP waits on a busy shared machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_llama(seed: int = 0, layers: int = 2) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config)
    model.train(False)
    return model


def randomise_loras(adapter: RemixAdapter, seed: int, std: float = 0.3) -> None:
    """Give every LoRA non-zero A and B so each one changes the output."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in adapter.trainable_parameters()["lora"]:
            p.copy_(torch.randn(p.shape, generator=gen) * std)


def set_router_logits(adapter: RemixAdapter, layer: int, logits: torch.Tensor) -> None:
    """Make the router of ``layer`` output exactly ``logits`` [n] for the stored pooled input of row 0."""
    x_pool = adapter._routings[layer].x_pool
    assert x_pool is not None
    x = x_pool[0]
    with torch.no_grad():
        adapter._routers[layer].weight.copy_(torch.outer(logits, x) / x.dot(x))


def ordered_subsets(n: int, k: int) -> list[tuple[int, ...]]:
    return list(itertools.permutations(range(n), k))


def pl_prob_contains(q: torch.Tensor, target: int, k: int) -> torch.Tensor:
    """P(target among k Plackett-Luce draws from probabilities q [R, n]), by enumeration: [R]."""
    n = q.shape[-1]
    logits = q.log()
    total = torch.zeros(q.shape[0])
    for subset in ordered_subsets(n, k):
        if target in subset:
            idx = torch.tensor(subset).expand(q.shape[0], k)
            total = total + plackett_luce_logprob(logits, idx).exp()
    return total


# ----- pure functions ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("n", "k"), [(3, 1), (3, 3), (4, 2), (5, 3), (6, 2)])
def test_plackett_luce_sums_to_one_over_ordered_subsets(n: int, k: int) -> None:
    logits = torch.randn(3, n, generator=torch.Generator().manual_seed(n * 10 + k)) * 2
    total = torch.zeros(3, dtype=torch.float64)
    for subset in ordered_subsets(n, k):
        idx = torch.tensor(subset).expand(3, k)
        total += plackett_luce_logprob(logits.double(), idx).exp()
    torch.testing.assert_close(total, torch.ones(3, dtype=torch.float64), atol=1e-12, rtol=0)


def test_plackett_luce_hand_value() -> None:
    # weights 1, 2, 3: draw 2 (p = 3/6), then 1 (p = 2/3 of what is left) -> 1/3
    logits = torch.tensor([[0.0, math.log(2.0), math.log(3.0)]])
    value = plackett_luce_logprob(logits, torch.tensor([[2, 1]]))
    torch.testing.assert_close(value, torch.tensor([math.log(1 / 3)]))


def test_gumbel_topk_draws_plackett_luce_frequencies() -> None:
    logits = torch.tensor([1.0, 0.0, -0.5, 0.5])
    draws = 40_000
    idx = gumbel_topk(logits.expand(draws, 4), 2, torch.Generator().manual_seed(1))
    assert (idx[:, 0] != idx[:, 1]).all()
    for subset in ordered_subsets(4, 2):
        expected = plackett_luce_logprob(logits[None], torch.tensor([subset])).exp().item()
        freq = ((idx[:, 0] == subset[0]) & (idx[:, 1] == subset[1])).float().mean().item()
        assert abs(freq - expected) < 4.5 * math.sqrt(expected * (1 - expected) / draws)


# ----- the adapted linear ----------------------------------------------------------------------------------


PATHS = pytest.mark.parametrize("path", ["dense", "gathered"])


@PATHS
def test_remix_linear_adds_exactly_k_loras_with_weight_omega(path: Any) -> None:
    torch.manual_seed(3)
    base = torch.nn.Linear(3, 2, bias=False)
    routing = LayerRouting()
    lin = RemixLinear(base, n=4, rank=1, omega=0.25, routing=routing)
    lin.path = path
    with torch.no_grad():
        for i in range(4):  # LoRA i: A_i = [i+1, 0, 0], B_i = [1, 10]^T -> B_i A_i x = (i+1) x_0 [1, 10]
            lin.lora_A[i] = torch.tensor([[i + 1.0, 0.0, 0.0]])
            lin.lora_B[i] = torch.tensor([[1.0], [10.0]])
    x = torch.tensor([[[2.0, 1.0, -1.0]], [[1.0, 0.0, 0.0]]])  # [R=2, T=1, 3]
    routing.set(torch.zeros(2, 3), torch.tensor([[0, 3], [2, 1]]), n=4)
    y = lin(x)
    # row 0: LoRAs 1 and 4 (1-based): 0.25 * (1 + 4) * 2 = 2.5; row 1: 0.25 * (3 + 2) * 1 = 1.25
    expected_delta = torch.tensor([[[2.5, 25.0]], [[1.25, 12.5]]])
    torch.testing.assert_close(y, base(x) + expected_delta)


def test_dense_and_gathered_paths_agree_in_outputs_and_gradients(monkeypatch: pytest.MonkeyPatch) -> None:
    ids = torch.randint(0, VOCAB, (6, 5), generator=torch.Generator().manual_seed(12))
    results = []
    for path in ("dense", "gathered"):
        monkeypatch.setattr(RemixLinear, "path", path)
        model = tiny_llama(seed=11)
        adapter = attach_remix(model, n=6, k=2, rank=3).sampled(2, torch.Generator().manual_seed(13))
        randomise_loras(adapter, seed=6)
        adapter.set_prompt_mask(torch.ones(6, 5, dtype=torch.bool))
        logits = model(ids).logits
        logits.square().mean().backward()
        results.append((logits.detach(), [p.grad for p in adapter.trainable_parameters()["lora"]]))
    torch.testing.assert_close(results[0][0], results[1][0], atol=1e-5, rtol=1e-5)
    for dense_grad, gathered_grad in zip(results[0][1], results[1][1]):
        assert dense_grad is not None and gathered_grad is not None
        torch.testing.assert_close(dense_grad, gathered_grad, atol=1e-6, rtol=1e-4)


def test_linear_without_routing_raises() -> None:
    lin = RemixLinear(torch.nn.Linear(3, 2), n=2, rank=1, omega=1.0, routing=LayerRouting())
    with pytest.raises(RemixError, match="set_prompt_mask"):
        lin(torch.zeros(1, 1, 3))


# ----- the adapter on a model -----------------------------------------------------------------------------


def test_omega_scales() -> None:
    assert attach_remix(tiny_llama(), n=4, k=2, rank=4).spec.omega == pytest.approx(0.5)
    assert attach_remix(tiny_llama(), n=4, k=2, rank=4, alpha=8).spec.omega == pytest.approx(1.0)
    rs = attach_remix(tiny_llama(), n=4, k=2, rank=4, scale="rslora", alpha=8)
    assert rs.spec.omega == pytest.approx(8 / 2 / 2)


def test_model_output_equals_merged_weights_of_selected_loras() -> None:
    model = tiny_llama(seed=1)
    merged = copy.deepcopy(model)
    adapter = attach_remix(model, n=4, k=2, rank=2)
    randomise_loras(adapter, seed=2)
    ids = torch.randint(0, VOCAB, (3, 7), generator=torch.Generator().manual_seed(4))
    adapter.set_prompt_mask(torch.ones(3, 7, dtype=torch.bool))
    model(ids)  # routing with zero routers: top-k of ties, the same for every row
    routing = adapter.last_routing()  # [3, L, 2]
    assert (routing == routing[:1]).all() and routing.shape == (3, 2, 2)
    omega = adapter.spec.omega
    with torch.no_grad():
        for layer_index, layer in enumerate(merged.model.layers):
            for name in MLP_PROJECTIONS:
                remix_linear = getattr(model.model.layers[layer_index].mlp, name)
                for i in routing[0, layer_index].tolist():
                    delta = remix_linear.lora_B[i] @ remix_linear.lora_A[i]
                    getattr(layer.mlp, name).weight += omega * delta
        adapter.set_prompt_mask(torch.ones(3, 7, dtype=torch.bool))
        torch.testing.assert_close(model(ids).logits, merged(ids).logits, atol=1e-5, rtol=1e-5)


def test_deterministic_routing_is_top_k_of_prompt_pooled_router_scores() -> None:
    model = tiny_llama(seed=2)
    adapter = attach_remix(model, n=6, k=3, rank=2)
    with torch.no_grad():
        for router in adapter._routers:
            router.weight.normal_(0, 5.0)
    ids = torch.randint(0, VOCAB, (4, 6), generator=torch.Generator().manual_seed(5))
    prompt_mask = torch.ones(4, 6, dtype=torch.bool)
    prompt_mask[:, 4:] = False  # the last two tokens are "completion"
    prompt_mask[0, :2] = False  # row 0 has a left-padded prompt
    runs = []
    for _ in range(2):
        adapter.set_prompt_mask(prompt_mask)
        model(ids)
        runs.append(adapter.last_routing())
    assert torch.equal(runs[0], runs[1])
    # layer 0 reads the embeddings: pool them over the prompt by hand
    emb = model.model.embed_tokens(ids)
    pooled = torch.stack([emb[b][prompt_mask[b]].mean(0) for b in range(4)])
    expected = torch.topk(adapter._routers[0](pooled), 3, dim=-1).indices
    assert torch.equal(runs[0][:, 0], expected)
    counts = adapter.selection_counts()
    assert counts.shape == (2, 6) and counts.sum().item() == 2 * 2 * 4 * 3


def test_base_is_frozen_and_unchanged_by_an_optimizer_step() -> None:
    model = tiny_llama(seed=3)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    adapter = attach_remix(model, n=4, k=2, rank=2)
    groups = adapter.trainable_parameters()
    trainable = {id(p) for group in groups.values() for p in group}
    assert len(groups["lora"]) == 2 * 3 * 2 and len(groups["router"]) == 2
    base_params = [p for p in model.parameters() if id(p) not in trainable]
    assert base_params and not any(p.requires_grad for p in base_params)
    randomise_loras(adapter, seed=1)
    optimizer = torch.optim.SGD([p for group in groups.values() for p in group], lr=0.1)
    adapter.sampled(2, torch.Generator().manual_seed(0))
    ids = torch.randint(0, VOCAB, (4, 5))
    adapter.set_prompt_mask(torch.ones(4, 5, dtype=torch.bool))
    per_seq = model(ids).logits.square().mean(dim=(1, 2))
    (per_seq.mean() + adapter.router_loss(per_seq, 2)).backward()
    optimizer.step()
    assert all(p.grad is None for p in base_params)
    after = dict(model.named_parameters())
    for name, value in before.items():
        key = name.replace(".mlp.gate_proj.", ".mlp.gate_proj.base.")
        key = key.replace(".mlp.up_proj.", ".mlp.up_proj.base.").replace(
            ".mlp.down_proj.", ".mlp.down_proj.base."
        )
        assert torch.equal(after[key], value), name
    assert any(p.grad is not None and p.grad.abs().max().item() > 0 for p in groups["router"])


@PATHS
def test_never_selected_lora_gets_no_gradient(
    path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(RemixLinear, "path", path)
    model = tiny_llama(seed=4)
    adapter = attach_remix(model, n=5, k=2, rank=2)
    randomise_loras(adapter, seed=3)
    ids = torch.randint(0, VOCAB, (1, 6)).expand(3, 6)
    for layer in range(2):  # routers that pick LoRAs 1 and 3 (layer 1's input depends on layer 0's routing)
        adapter.set_prompt_mask(torch.ones(3, 6, dtype=torch.bool))
        with torch.no_grad():
            model(ids)
        set_router_logits(adapter, layer, torch.tensor([-5.0, 5.0, -5.0, 4.0, -5.0]))
    adapter.set_prompt_mask(torch.ones(3, 6, dtype=torch.bool))
    model(ids).logits.square().mean().backward()
    assert torch.equal(adapter.last_routing(), torch.tensor([1, 3]).expand(3, 2, 2))
    for lin in (lin for linears in adapter._linears for lin in linears.values()):
        for p in (lin.lora_A, lin.lora_B):
            assert p.grad is not None
            assert p.grad[[0, 2, 4]].abs().max().item() == 0.0
            assert p.grad[1].abs().max().item() > 0 and p.grad[3].abs().max().item() > 0


def test_kv_cached_generate_equals_no_cache_forward() -> None:
    model = tiny_llama(seed=5)
    model.generation_config.eos_token_id = None
    adapter = attach_remix(model, n=4, k=2, rank=2)
    randomise_loras(adapter, seed=4)
    with torch.no_grad():
        for router in adapter._routers:
            router.weight.normal_(0, 5.0)
    ids = torch.randint(3, VOCAB, (3, 6), generator=torch.Generator().manual_seed(6))
    attention = torch.ones(3, 6, dtype=torch.long)
    attention[0, :2] = 0  # left padding
    attention[1, :1] = 0
    ids[attention == 0] = 0
    adapter.set_prompt_mask(attention.bool())
    new = 5
    out = cast(Any, model).generate(
        ids,
        attention_mask=attention,
        max_new_tokens=new,
        do_sample=False,
        pad_token_id=0,
        output_scores=True,
        return_dict_in_generate=True,
    )
    cached_routing = adapter.last_routing()
    full_attention = torch.cat([attention, torch.ones(3, new, dtype=torch.long)], dim=1)
    prompt_mask = torch.cat([attention.bool(), torch.zeros(3, new, dtype=torch.bool)], dim=1)
    position_ids = (full_attention.cumsum(-1) - 1).clamp(min=0)
    adapter.set_prompt_mask(prompt_mask)
    with torch.no_grad():
        logits = model(out.sequences, attention_mask=full_attention, position_ids=position_ids).logits
    assert torch.equal(adapter.last_routing(), cached_routing)
    scores = torch.stack(out.scores, dim=1)  # [3, new, V]
    torch.testing.assert_close(scores, logits[:, 5 : 5 + new], atol=1e-5, rtol=1e-5)


def test_missing_or_mismatched_prompt_mask_raises() -> None:
    model = tiny_llama(seed=6)
    adapter = attach_remix(model, n=3, k=1, rank=1)
    with pytest.raises(RemixError, match="set_prompt_mask"):
        model(torch.zeros(2, 4, dtype=torch.long))
    adapter.set_prompt_mask(torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(RemixError, match="prompt_mask has shape"):
        model(torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(RemixError, match="multiple of m"):
        adapter.sampled(2).set_prompt_mask(torch.ones(3, 4, dtype=torch.bool))


def test_sampled_routing_logprob_and_router_loss_by_hand() -> None:
    model = tiny_llama(seed=7)
    adapter = attach_remix(model, n=8, k=2, rank=2).sampled(3, torch.Generator().manual_seed(2))
    ids = torch.randint(0, VOCAB, (4, 5)).repeat(3, 1)  # B=4 sequences, M=3 routings
    adapter.set_prompt_mask(torch.ones(12, 5, dtype=torch.bool))
    with torch.no_grad():
        model(ids)
    routing = adapter.last_routing()
    assert (routing[:, :, 0] != routing[:, :, 1]).all()
    assert len({tuple(r.flatten().tolist()) for r in routing}) > 6  # rows draw independently
    logq = adapter.routing_logprob()
    torch.testing.assert_close(logq, torch.full((12,), 2 * math.log(1 / 8 * 1 / 7)))  # uniform routers
    loss = torch.arange(12.0, requires_grad=True)
    surrogate = adapter.router_loss(loss, 3)
    centred = loss.detach().reshape(3, 4) - loss.detach().reshape(3, 4).mean(0)
    torch.testing.assert_close(surrogate, (centred * logq.reshape(3, 4)).sum(0).mean() / 2)
    surrogate.backward()  # type: ignore[no-untyped-call]
    assert loss.grad is None  # the per-sequence loss is detached inside
    assert adapter.router_entropy() == pytest.approx(math.log(8))
    again = attach_remix(tiny_llama(seed=7), n=8, k=2, rank=2).sampled(3, torch.Generator().manual_seed(2))
    again.set_prompt_mask(torch.ones(12, 5, dtype=torch.bool))
    with torch.no_grad():
        again.model(ids)
    assert torch.equal(again.last_routing(), routing)  # seeded generator: reproducible draws


@pytest.mark.parametrize("m", [2, 4])
def test_router_gradient_estimator_is_unbiased(m: int) -> None:
    """One layer, n=4, k=2, a fixed loss per ordered routing: MC mean of the RLOO gradient vs enumeration."""
    model = tiny_llama(seed=8, layers=1)
    adapter = attach_remix(model, n=4, k=2, rank=1)
    prompt = torch.randint(0, VOCAB, (1, 4), generator=torch.Generator().manual_seed(7))
    adapter.set_prompt_mask(torch.ones(1, 4, dtype=torch.bool))
    with torch.no_grad():
        model(prompt)
    target_logits = torch.tensor([0.5, -0.3, 1.0, 0.0])
    set_router_logits(adapter, 0, target_logits)
    table = torch.rand(4, 4, generator=torch.Generator().manual_seed(8)) * 4  # L(first, second)
    router = adapter._routers[0]
    x_pool = adapter._routings[0].x_pool[0]  # type: ignore[index]

    # exact gradient of E_Q[L] w.r.t. the logits, by enumerating all 12 ordered routings
    logits = target_logits.clone().requires_grad_(True)
    subsets = torch.tensor(ordered_subsets(4, 2))
    expected_loss = (
        plackett_luce_logprob(logits.expand(12, 4), subsets).exp() * table[subsets[:, 0], subsets[:, 1]]
    ).sum()
    (exact,) = torch.autograd.grad(expected_loss, logits)

    adapter.sampled(m, torch.Generator().manual_seed(9))
    per_chunk = 64 * 2 // m  # sequences per batch, the same number of routings for every m
    estimates: list[torch.Tensor] = []
    for _ in range(60):
        adapter.set_prompt_mask(torch.ones(m * per_chunk, 4, dtype=torch.bool))
        with torch.no_grad():
            model(prompt.expand(m * per_chunk, 4))
        routing = adapter.last_routing()[:, 0]
        router.weight.grad = None
        adapter.router_loss(table[routing[:, 0], routing[:, 1]], m).backward()  # type: ignore[no-untyped-call]
        grad = router.weight.grad
        assert grad is not None
        estimates.append(grad @ x_pool / x_pool.dot(x_pool))  # back to logit space
    stacked = torch.stack(estimates)  # [chunks, n], each the mean over per_chunk sequences
    mean = stacked.mean(0)
    stderr = stacked.std(0) / math.sqrt(stacked.shape[0])
    assert stderr.max() < 0.2 * exact.abs().max()  # the check has power
    assert ((mean - exact).abs() <= 4 * stderr + 1e-6).all(), (mean, exact, stderr)


def test_router_learns_to_select_the_lora_that_fits() -> None:
    """Only LoRA 3 carries the update the target needs; the router alone is trained."""
    model = tiny_llama(seed=9)
    merged = copy.deepcopy(model)
    adapter = attach_remix(model, n=4, k=2, rank=4)
    gen = torch.Generator().manual_seed(10)
    with torch.no_grad():
        for layer_index, layer in enumerate(merged.model.layers):
            for name in MLP_PROJECTIONS:
                lin = getattr(model.model.layers[layer_index].mlp, name)
                lin.lora_A[3] = torch.randn(lin.lora_A[3].shape, generator=gen) * 0.3
                lin.lora_B[3] = torch.randn(lin.lora_B[3].shape, generator=gen) * 0.3
                getattr(layer.mlp, name).weight += adapter.spec.omega * lin.lora_B[3] @ lin.lora_A[3]
    batch, m = 8, 2
    prefix = torch.randint(0, VOCAB, (1, 6), generator=gen).expand(batch, 6)
    ids = torch.cat([prefix, torch.randint(0, VOCAB, (batch, 2), generator=gen)], dim=1)
    with torch.no_grad():
        target = merged(ids).logits.repeat(m, 1, 1)
    optimizer = torch.optim.Adam(adapter.trainable_parameters()["router"], lr=0.05)
    adapter.sampled(m, torch.Generator().manual_seed(11))
    for _ in range(200):
        adapter.set_prompt_mask(torch.ones(m * batch, 8, dtype=torch.bool))
        with torch.no_grad():
            per_seq = (model(ids.repeat(m, 1)).logits - target).square().mean(dim=(1, 2))
        optimizer.zero_grad()
        adapter.router_loss(per_seq, m).backward()  # type: ignore[no-untyped-call]
        optimizer.step()
    for layer in range(2):
        q = torch.softmax(adapter._routers[layer](adapter._routings[layer].x_pool), dim=-1)
        assert pl_prob_contains(q.detach(), 3, 2).min() > 0.9
    adapter.deterministic().set_prompt_mask(torch.ones(batch, 8, dtype=torch.bool))
    with torch.no_grad():
        model(ids)
    assert (adapter.last_routing() == 3).any(dim=-1).all()


def test_save_load_roundtrip_gives_identical_outputs(tmp_path: object) -> None:
    model = tiny_llama(seed=10)
    adapter = attach_remix(model, n=4, k=2, rank=2)
    randomise_loras(adapter, seed=5)
    with torch.no_grad():
        for router in adapter._routers:
            router.weight.normal_(0, 3.0)
    path = f"{tmp_path}/remix.safetensors"
    save_file(adapter.state_dict_for_save(), path)
    assert sorted(adapter.state_dict_for_save())[:3] == [
        "layers.0.mlp.down_proj.lora_A",
        "layers.0.mlp.down_proj.lora_B",
        "layers.0.mlp.gate_proj.lora_A",
    ]
    fresh = tiny_llama(seed=10)
    loaded = attach_remix(fresh, n=4, k=2, rank=2)
    loaded.load_saved_state(load_file(path))
    ids = torch.randint(0, VOCAB, (3, 6))
    mask = torch.ones(3, 6, dtype=torch.bool)
    outputs = []
    for a in (adapter, loaded):
        a.set_prompt_mask(mask)
        with torch.no_grad():
            outputs.append(a.model(ids).logits)
    assert torch.equal(outputs[0], outputs[1])
    assert torch.equal(adapter.last_routing(), loaded.last_routing())


def test_load_rejects_a_state_of_another_shape() -> None:
    state = attach_remix(tiny_llama(), n=4, k=2, rank=2).state_dict_for_save()
    other = attach_remix(tiny_llama(), n=5, k=2, rank=2)
    with pytest.raises(RemixError, match="wrong shapes"):
        other.load_saved_state(state)
    del state["layers.1.router.weight"]
    with pytest.raises(RemixError, match=r"missing=\['layers.1.router.weight'\]"):
        attach_remix(tiny_llama(), n=4, k=2, rank=2).load_saved_state(state)


def test_half_precision_base_keeps_float32_adapter() -> None:
    model = cast(Any, tiny_llama(seed=12)).to(torch.bfloat16)
    adapter = attach_remix(model, n=4, k=2, rank=2).sampled(2)
    assert all(p.dtype == torch.float32 for group in adapter.trainable_parameters().values() for p in group)
    randomise_loras(adapter, seed=7)
    adapter.set_prompt_mask(torch.ones(4, 5, dtype=torch.bool))
    logits = model(torch.randint(0, VOCAB, (4, 5))).logits
    assert logits.dtype == torch.bfloat16
    per_seq = logits.float().square().mean(dim=(1, 2))
    (per_seq.mean() + adapter.router_loss(per_seq, 2)).backward()
    assert all(p.grad is not None for group in adapter.trainable_parameters().values() for p in group)


def test_the_sampling_loop_shares_a_groups_prompt_and_drops_finished_rows_with_their_routing() -> None:
    """The node's loop runs a group's prompt once and copies its routing with its cache, and drops finished
    rows' routing with their cache: each row gets the tokens, log-probs and routing it gets alone."""
    from types import SimpleNamespace

    from node.generation.sampling import generate

    model = tiny_llama(seed=7)
    adapter = attach_remix(model, n=4, k=2, rank=2)
    randomise_loras(adapter, seed=8)
    with torch.no_grad():
        for router in adapter._routers:
            router.weight.normal_(0, 5.0)
    gen = torch.Generator().manual_seed(9)
    prompts = [torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in (5, 7, 4)]

    def alone(prompt: list[int], eos: int | None) -> Any:
        tok = SimpleNamespace(eos_token_id=eos, pad_token_id=0)
        return generate(model, cast(Any, tok), [prompt], max_new_tokens=8, greedy=True, remix=adapter)

    eos = alone(prompts[0], None).completion_ids[0, 2].item()  # the first group ends after 3 tokens
    rows = [prompts[0]] * 3 + [prompts[1]] * 3 + [prompts[2]]
    tok = SimpleNamespace(eos_token_id=eos, pad_token_id=0)
    batch_rows: list[int] = []
    hook = model.model.embed_tokens.register_forward_hook(lambda _m, inp, _o: batch_rows.append(inp[0].shape[0]))
    try:
        batch = generate(model, cast(Any, tok), rows, max_new_tokens=8, greedy=True, remix=adapter)
    finally:
        hook.remove()
    assert batch_rows[0] == 3 and batch_rows[1] == 7 and batch_rows[-1] == 4  # 3 prompts; 7 rows, then 4 left
    assert batch.routing is not None and int(batch.completion_mask[0].sum()) == 3
    assert any(int(m.sum()) > 3 for m in batch.completion_mask)  # the others go on with the first group dropped
    for i, prompt in enumerate(rows):
        own = alone(prompt, eos)
        n = int(own.completion_mask[0].sum())
        assert batch.completion_ids[i, :n].tolist() == own.completion_ids[0, :n].tolist()
        assert int(batch.completion_mask[i].sum()) == n
        torch.testing.assert_close(batch.behavior_logprobs[i, :n], own.behavior_logprobs[0, :n], atol=1e-5, rtol=0)
        assert own.routing is not None and torch.equal(batch.routing[i], own.routing[0])
    assert not torch.equal(batch.routing[0], batch.routing[3])  # the prompts are routed differently
