"""ReMix's fast paths against the reference ones: the dense, gathered and cost-picked evaluations of a
RemixLinear, the decode-time copy of B, and a prompt run once a (prompt, routing) against every row run in
full with the same routings (log-probs, LoRA and router gradients), on a tiny random Llama."""

from __future__ import annotations

from typing import Any, cast

import pytest
import torch
from transformers import LlamaForCausalLM

from node.policy.logprobs import left_pad, right_pad, sequence_logprobs
from node.policy.remix.attach import RemixAdapter, attach_remix
from node.policy.remix.logprobs import prompt_units, routed_logprobs, spread_units
from node.policy.remix.ops import LayerRouting, RemixLinear
from tests.node.test_remix import VOCAB, one_thread, tiny_llama  # noqa: F401 (one_thread: an autouse fixture)


def remix_model(seed: int, n: int = 6, k: int = 2, rank: int = 3) -> tuple[LlamaForCausalLM, RemixAdapter]:
    model = tiny_llama(seed)
    adapter = attach_remix(model, n=n, k=k, rank=rank)
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for p in adapter.trainable_parameters()["lora"]:
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
        for router in adapter.trainable_parameters()["router"]:
            router.copy_(torch.randn(router.shape, generator=gen))  # routing that depends on the prompt
    return model, adapter


def linears(adapter: RemixAdapter) -> list[RemixLinear]:
    return [lin for layer in adapter._linears for lin in layer.values()]


def test_each_path_and_the_picked_one_agree_on_every_shape() -> None:
    """Dense, gathered and auto give the same outputs and gradients for a decode-like and a prompt-like
    shape, in float32 and on a half-precision base (the update then cast and added, not fused)."""
    torch.manual_seed(0)
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        base = torch.nn.Linear(16, 24, bias=True).to(dtype)
        routing = LayerRouting()
        lin = RemixLinear(base, n=8, rank=3, omega=0.7, routing=routing)
        with torch.no_grad():
            lin.lora_B.normal_(0, 0.5)
        idx = torch.stack([torch.randperm(8)[:2] for _ in range(5)])
        routing.set(torch.zeros(5, 16), idx, n=8)
        for tokens in (1, 9):
            x = torch.randn(5, tokens, 16).to(dtype)
            a, b = lin.lora_A.detach(), lin.lora_B.detach()
            expected = base(x).float() + 0.7 * torch.stack([
                sum(x[r].float() @ a[i].t() @ b[i].t() for i in idx[r].tolist()) for r in range(5)])
            results = []
            for path in ("dense", "gathered", "auto"):
                lin.path = cast(Any, path)
                lin.zero_grad()
                y = lin(x)
                assert y.dtype == dtype
                torch.testing.assert_close(y.float(), expected, atol=tol, rtol=tol)
                y.float().square().sum().backward()
                results.append((lin.lora_A.grad.clone(), lin.lora_B.grad.clone()))  # type: ignore[union-attr]
            for grads in results[1:]:
                torch.testing.assert_close(grads[0], results[0][0], atol=tol * 10, rtol=tol)
                torch.testing.assert_close(grads[1], results[0][1], atol=tol * 10, rtol=tol)
    lin.path = "auto"
    assert lin.path_for(1, 2) == "dense" and lin.path_for(9, 2) == "gathered"  # one token: dense; a prompt: gathered
    assert lin.path_for(100, 8) == "dense"  # every LoRA selected: nothing to skip


def test_the_decode_copy_of_b_follows_every_update(monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside autograd the dense path keeps B side by side between calls; an optimizer step or a load
    (each bumps B's version) must be seen by the next call."""
    model, adapter = remix_model(seed=1)
    ids = torch.randint(3, VOCAB, (3, 1), generator=torch.Generator().manual_seed(2))
    monkeypatch.setattr(RemixLinear, "path", "dense")
    outs = []
    for change in range(3):
        adapter.set_prompt_mask(torch.ones(3, 1, dtype=torch.bool))
        with torch.inference_mode():
            outs.append(model(ids).logits)
        with torch.no_grad():
            if change == 0:
                for lin in linears(adapter):
                    lin.lora_B.mul_(2.0)  # in place, as AdamW updates it
            else:
                adapter.load_saved_state({k: v * 0 if "lora_B" in k else v
                                          for k, v in adapter.state_dict_for_save().items()})
    for lin in linears(adapter):
        lin._b_flat = None
    adapter.set_prompt_mask(torch.ones(3, 1, dtype=torch.bool))
    with torch.no_grad():
        reference = model(ids).logits  # B made afresh from the loaded (zero) state
    assert not torch.allclose(outs[0], outs[1]) and not torch.allclose(outs[1], outs[2])
    torch.testing.assert_close(outs[2], reference)


def _batch(seed: int) -> tuple[list[list[int]], torch.Tensor, torch.Tensor]:
    """Two groups of three completions and one group of one, prompts of different lengths."""
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in (5, 8, 3)]
    rows = [prompts[0]] * 3 + [prompts[1]] * 3 + [prompts[2]]
    completions = [torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in (4, 2, 5, 1, 3, 4, 2)]
    ids, mask = right_pad(completions, 0, torch.long)
    return rows, ids, mask


def test_deterministic_rows_share_their_prompt_as_exactly_as_run_in_full() -> None:
    model, adapter = remix_model(seed=3)
    prompts, ids, mask = _batch(4)
    adapter.deterministic()
    with torch.no_grad():
        shared = routed_logprobs(model, adapter, prompts, ids, mask, pad_id=0)
        routing = adapter.last_routing()
        p_ids, p_mask = left_pad(prompts, 0)
        full = sequence_logprobs(model, p_ids, p_mask, ids, mask, remix=adapter)
    assert torch.equal(adapter.last_routing(), routing)
    assert not torch.equal(routing[0], routing[3])  # the prompts are routed differently
    torch.testing.assert_close(shared[mask], full[mask], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("m", [2, 3])
def test_sampled_routings_with_shared_prompts_equal_full_rows_with_the_same_draws(
        m: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Training's pass: each distinct prompt run once a routing, then the completions, each linear on the
    path its cost picks; against the reference, every row repeated M times and run in full through the
    dense path, its draws shared by unit: equal routings, log-probs, and gradients of the policy loss plus
    the router's RLOO loss for every LoRA and router."""
    prompts, ids, mask = _batch(5)
    advantages = torch.tensor([1.0, -0.5, 0.3, -1.0, 0.7, 0.2, -0.4]).repeat(m)
    results = []
    for shared in (True, False):
        model, adapter = remix_model(seed=6)
        adapter.sampled(m, torch.Generator().manual_seed(7))
        if shared:
            logprobs = routed_logprobs(model, adapter, prompts, ids, mask, pad_id=0, m=m)
        else:
            monkeypatch.setattr(RemixLinear, "path", "dense")
            _, units = prompt_units(prompts, m)
            p_ids, p_mask = left_pad(prompts, 0)
            rep = [t.repeat(m, 1) for t in (p_ids, p_mask, ids, mask)]
            prompt_only = torch.cat([rep[1].bool(), torch.zeros_like(rep[3])], dim=1)
            adapter.set_prompt_mask(prompt_only, units=units)
            logits = model(input_ids=torch.cat([rep[0], rep[2]], 1), attention_mask=torch.cat([rep[1], rep[3].long()], 1),
                           position_ids=(torch.cat([rep[1], rep[3].long()], 1).cumsum(-1) - 1).clamp(min=0)).logits
            logits = logits[:, rep[0].shape[1] - 1 : -1].float()
            logprobs = torch.log_softmax(logits, -1).gather(-1, rep[2][..., None]).squeeze(-1)
        rmask = mask.repeat(m, 1)
        per_seq = -(advantages * (logprobs * rmask).sum(-1) / rmask.sum(-1))
        (per_seq.mean() + adapter.router_loss(per_seq, m)).backward()
        grads = [p.grad.clone() for group in adapter.trainable_parameters().values()  # type: ignore[union-attr]
                 for p in group]
        results.append((adapter.last_routing(), logprobs.detach()[rmask], grads))
    (routing, lps, grads), (ref_routing, ref_lps, ref_grads) = results
    assert torch.equal(routing, ref_routing)
    groups = routing.reshape(m, 7, *routing.shape[1:])
    assert all(torch.equal(groups[j, 0], groups[j, 2]) for j in range(m))  # a group's rows share a draw
    assert not torch.equal(groups[0], groups[1])  # the M draws differ
    torch.testing.assert_close(lps, ref_lps, atol=1e-5, rtol=1e-5)
    assert len(grads) == len(ref_grads) and any(g.abs().max() > 0 for g in grads[-2:])  # the routers learn
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_without_a_cache_to_copy_every_row_runs_in_full_with_its_prompts_routing() -> None:
    """Gradient checkpointing returns no KV cache in training: the rows then run in full, routed as their
    prompt's pass just routed them, with the same log-probs."""
    prompts, ids, mask = _batch(8)
    out = []
    for checkpointing in (False, True):
        model, adapter = remix_model(seed=9)
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.train()
        adapter.sampled(2, torch.Generator().manual_seed(10))
        lps = routed_logprobs(model, adapter, prompts, ids, mask, pad_id=0, m=2)
        (lps * mask.repeat(2, 1)).sum().backward()  # padding positions are not compared
        out.append((adapter.last_routing(), lps.detach()[mask.repeat(2, 1)],
                    linears(adapter)[0].lora_B.grad.clone()))  # type: ignore[union-attr]
    assert torch.equal(out[0][0], out[1][0])
    torch.testing.assert_close(out[0][1], out[1][1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[0][2], out[1][2], atol=1e-5, rtol=1e-4)


def test_spread_units_deal_a_prompts_rows_over_its_routings_in_turn() -> None:
    distinct, units, routing_of = spread_units([[1], [2], [1], [1], [2], [3]], 2)
    assert distinct == [[1], [2], [3]]
    assert routing_of.tolist() == [0, 0, 1, 0, 1, 0]
    assert units.tolist() == [0, 1, 3, 0, 4, 2]  # routing j of distinct prompt p is unit j * 3 + p


def test_spread_rows_are_the_m_routing_rows_each_completion_under_its_own_routing() -> None:
    """Spread training scores completion b under routing ``j_b`` only: its log-probs are row ``j_b * B + b`` of
    the M-routing pass with the same draws, and the gradients of a policy loss plus the spread router loss are
    those of the same loss written by hand on those rows of the M-routing pass (the baseline of a row: the mean
    loss of its prompt's rows under the other routing)."""
    prompts, ids, mask = _batch(5)
    b, m = ids.shape[0], 2
    advantages = torch.tensor([1.0, -0.5, 0.3, -1.0, 0.7, 0.2, -0.4])
    _, units, routing_of = spread_units(prompts, m)
    prompt_of = torch.tensor([0, 0, 0, 1, 1, 1, 2])
    assert torch.equal(units - routing_of * 3, prompt_of)
    picked = routing_of * b + torch.arange(b)
    results = []
    for spread in (True, False):
        model, adapter = remix_model(seed=6)
        adapter.sampled(m, torch.Generator().manual_seed(7))
        logprobs = routed_logprobs(model, adapter, prompts, ids, mask, pad_id=0, m=m, spread=spread)
        if spread:
            per_seq = -(advantages * (logprobs * mask).sum(-1) / mask.sum(-1))
            router = adapter.router_loss_spread(per_seq, prompt_of, routing_of)
            routing = adapter.last_routing()
        else:
            logprobs = logprobs[picked]
            per_seq = -(advantages * (logprobs * mask).sum(-1) / mask.sum(-1))
            logq = adapter.routing_logprob()[picked]
            values = per_seq.detach()
            # by hand: prompt 0's rows take routings 0, 1, 0 and prompt 1's the same; prompt 2 has one row
            baselines = torch.stack([values[1], (values[0] + values[2]) / 2, values[1],
                                     values[4], (values[3] + values[5]) / 2, values[4], values[6]])
            centred = (values - baselines) * torch.tensor([1.0] * 6 + [0.0])
            router = (centred * logq).sum() / b
            routing = adapter.last_routing()[picked]
        (per_seq.mean() + router).backward()
        grads = [p.grad.clone() for group in adapter.trainable_parameters().values()  # type: ignore[union-attr]
                 for p in group]
        results.append((routing, logprobs.detach()[mask], float(router.detach()), grads))
    (routing, lps, router, grads), (ref_routing, ref_lps, ref_router, ref_grads) = results
    assert torch.equal(routing, ref_routing) and not torch.equal(routing[0], routing[1])  # rows 0, 1: other draws
    torch.testing.assert_close(lps, ref_lps, atol=1e-5, rtol=1e-5)
    assert router == pytest.approx(ref_router, abs=1e-6)
    assert any(g.abs().max() > 0 for g in grads[-2:])  # the routers learn
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
