"""The HF backend's merged copy (``generation.hf.weights=merged``) against the adapter as trained, and the
sampling loop's GPU schedule (the live-row count read every few steps) against the CPU's, on the CPU.

A training step on the merged backend's own samples: adapter weights change, base weights do not, the
merged copy follows (with or without ``sync``), and the behaviour log-probs it records are the trainer's
(float32: the gap under 1e-4) or within bfloat16 rounding of them, as the adapter as trained is.
"""

from __future__ import annotations

import pytest
import torch

import node.generation.sampling as generation
from node.config import AdapterConfig, ModelConfig
from node.generation.base import SamplingSettings
from node.generation.hf import HFBackend
from node.policy.logprobs import left_pad, sequence_logprobs
from node.policy.model import Policy, build_policy
from node.train.groups import TrainGroup, assign_advantages
from node.train.trainer import Trainer

PROMPTS = ["07+35=", "1+2=", "99+9=", "5+50="]


def _policy(name: str, dtype: str = "float32", train_norms: bool = True) -> Policy:
    policy = build_policy(ModelConfig(name_or_path=name, dtype=dtype, device="cpu"),
                          AdapterConfig(train_norms=train_norms), seed=0)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # adapters and norms away from their initial values: B = 0 would merge to nothing
        for p in policy.model.parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=gen).to(p.dtype) * 0.02)
    return policy


def _prompts(policy: Policy, copies: int = 4) -> list[list[int]]:
    tok = policy.tokenizer
    bos = [] if tok.bos_token_id is None else [tok.bos_token_id]
    return [[*bos, *tok(t, add_special_tokens=False)["input_ids"]] for t in PROMPTS] * copies


def _gap(policy: Policy, prompts: list[list[int]], out) -> float:
    p_ids, p_mask = left_pad(prompts, policy.tokenizer.pad_token_id)
    with torch.no_grad():
        lps = sequence_logprobs(policy.model, p_ids, p_mask, out.completion_ids, out.completion_mask)
    m = out.completion_mask
    return float((lps[m].float() - out.behavior_logprobs[m]).abs().mean())


def _groups(policy: Policy, prompts: list[list[int]], out) -> list[TrainGroup]:
    groups = []
    for g, prompt in enumerate(prompts[: len(PROMPTS)]):
        rows = [out.row(i) for i in range(g, len(prompts), len(PROMPTS))]
        group = TrainGroup(key=str(g), peer_id="", epoch=0, prompt_ids=prompt, completions=[r[0] for r in rows],
                           anchor_logprobs=[r[1] for r in rows], rewards=[float(i % 2) for i in range(len(rows))])
        groups.extend(assign_advantages([group], "rloo"))
    return groups


def _trainer(policy: Policy, **options) -> Trainer:
    return Trainer(policy, lr=1e-2, norm_lr=1e-2, router_lr=1e-2, weight_decay=0.0, max_grad_norm=1.0, loss="topr",
                   eps_low=0.2, eps_high=0.28, length_norm=False, micro_batch_size=8, temperature=1.0, **options)


def test_the_merged_copy_samples_what_the_adapter_does_and_shares_all_but_the_adapted_weights():
    policy = _policy("tiny-base")
    prompts = _prompts(policy)
    merged, adapter = HFBackend(policy, batch_size=64), HFBackend(policy, batch_size=64, weights="adapter")
    assert merged.weights == "merged" and adapter.weights == "adapter"
    settings = SamplingSettings(max_new_tokens=6)
    a = merged.generate(prompts, settings, torch.Generator().manual_seed(0))
    b = adapter.generate(prompts, settings, torch.Generator().manual_seed(0))
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.completion_mask, b.completion_mask)
    torch.testing.assert_close(a.behavior_logprobs, b.behavior_logprobs, atol=1e-4, rtol=0)  # float32 rounding
    assert _gap(policy, prompts, a) < 1e-5

    copy = merged.merged
    assert copy is not None
    theirs = {t.data_ptr() for t in policy.model.parameters()}
    ours = {id(m.weight) for _, m in copy._pairs}
    new = [p for p in copy.module.parameters() if id(p) not in ours]
    assert new and all(p.data_ptr() in theirs for p in new)  # embeddings, norms (trained ones too): shared
    assert all(p.data_ptr() not in theirs for _, m in copy._pairs for p in [m.weight])
    assert copy.extra_bytes() == sum(m.weight.numel() * 4 for _, m in copy._pairs) > 0


@pytest.mark.parametrize("name", ["tiny-base", "small-base"])
def test_a_training_step_on_merged_samples_moves_the_adapters_and_the_copy_and_never_the_base(name):
    policy = _policy(name)
    backend = HFBackend(policy, batch_size=64)
    trainer = _trainer(policy)
    prompts = _prompts(policy)
    settings = SamplingSettings(max_new_tokens=6)
    frozen = {n: p.detach().clone() for n, p in policy.model.named_parameters() if not p.requires_grad}
    trained = {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}
    for step in range(2):
        out = backend.generate(prompts, settings, torch.Generator().manual_seed(step))
        stats = trainer.step(_groups(policy, prompts, out))
        assert stats["logprob_gap_abs"] < 1e-4, stats  # the trainer's own check, on the merged samples
        if step == 0:
            backend.sync()  # the node's order; at step 1 the copy must notice the update by itself
    after = dict(policy.model.named_parameters())
    assert all(torch.equal(after[n], v) for n, v in frozen.items())
    assert all(not torch.equal(after[n], v) for n, v in trained.items() if "lora_B" in n)
    out = backend.generate(prompts, settings, torch.Generator().manual_seed(9))
    assert _gap(policy, prompts, out) < 1e-4  # sampled from the updated policy, not the one before


def test_in_bfloat16_merged_samples_differ_from_the_trainer_by_rounding_as_the_adapters_do():
    """The merged weight is rounded to bfloat16 once; the trainer's forward rounds elsewhere. Both backends'
    samples are within bfloat16 rounding of the trainer (tiny-base: about 1e-2), not a different policy, and
    the engine correction trains on them."""
    policy = _policy("tiny-base", dtype="bfloat16")
    prompts = _prompts(policy)
    settings = SamplingSettings(max_new_tokens=6)
    gaps = {w: _gap(policy, prompts, HFBackend(policy, batch_size=64, weights=w).generate(  # type: ignore[arg-type]
        prompts, settings, torch.Generator().manual_seed(0))) for w in ("merged", "adapter")}
    assert 0 < gaps["merged"] < max(3 * gaps["adapter"], 0.02), gaps
    base = build_policy(ModelConfig(name_or_path="tiny-base", dtype="bfloat16", device="cpu"),
                        AdapterConfig(train_norms=True), seed=0)
    out = HFBackend(policy, batch_size=64).generate(prompts, settings, torch.Generator().manual_seed(0))
    assert _gap(base, prompts, out) > 5 * gaps["merged"]  # the adapters' own change is far above the rounding
    stats = _trainer(policy, engine_is_cap=2.0).step(_groups(policy, prompts, out))
    assert stats["skipped_steps"] == 0 and 0 < stats["logprob_gap_abs"] < 0.05


def test_a_generation_under_inference_mode_leaves_a_copy_that_refreshes_after_training():
    policy = _policy("tiny-base")
    backend = HFBackend(policy, batch_size=64)
    prompts = _prompts(policy, copies=2)
    with torch.inference_mode():  # as a caller may wrap an evaluation
        out = backend.generate(prompts, SamplingSettings(max_new_tokens=4), torch.Generator().manual_seed(0))
    assert backend.merged is not None
    assert not any(p.is_inference() for p in backend.merged.module.parameters())
    _trainer(policy).step(_groups(policy, prompts, out))
    backend.sync()
    with torch.inference_mode():
        out = backend.generate(prompts, SamplingSettings(max_new_tokens=4), torch.Generator().manual_seed(1))
    assert _gap(policy, prompts, out) < 1e-4


def test_remix_and_a_plain_model_generate_from_their_own_modules():
    remix = build_policy(ModelConfig(device="cpu"), AdapterConfig(kind="remix", rank=2), seed=0)
    assert HFBackend(remix, batch_size=8).weights == "adapter"


@pytest.mark.parametrize("greedy", [False, True])
def test_reading_the_live_rows_every_eight_steps_changes_nothing_but_the_work(monkeypatch, greedy):
    """The GPU schedule (a host read every 8 steps) on the CPU, on the same weights: the same tokens,
    log-probs, masks and finish reasons as a read every step, with rows ending at EOS and at the model's
    context, and exactly the forward passes each schedule runs. (Sampling draws one number a computed row, so
    the two schedules draw alike only where neither drops finished rows.)"""
    if not greedy:
        monkeypatch.setattr(generation, "_COMPACT_AT", -1.0)
    policy = _policy("tiny-base")
    prompts = _prompts(policy) + [[policy.tokenizer.bos_token_id, *range(5, 50)]]  # 46 of 64 positions
    settings = SamplingSettings(max_new_tokens=30, greedy=greedy)

    def sample(interval: int) -> tuple[generation.Completions, int]:
        monkeypatch.setattr(generation, "live_check_interval", lambda device: interval)
        calls: list[int] = []
        hook = policy.model.get_base_model().model.embed_tokens.register_forward_hook(  # type: ignore[operator]
            lambda *_: calls.append(1))
        try:
            out = HFBackend(policy, batch_size=64, weights="adapter").generate(prompts, settings,
                                                                              torch.Generator().manual_seed(3))
        finally:
            hook.remove()
        return out, len(calls)

    (every, every_calls), (eighth, eighth_calls) = sample(1), sample(8)
    assert every.finish_reasons == eighth.finish_reasons and "eos" in every.finish_reasons
    assert every.finish_reasons[-1] == "length" and every.completion_mask[-1].sum() == 64 - 46
    assert every.completion_mask[:-1].sum(1).max() < 64 - 46  # the row at the context is the last to end
    assert torch.equal(every.completion_ids, eighth.completion_ids)
    assert torch.equal(every.completion_mask, eighth.completion_mask)
    torch.testing.assert_close(every.behavior_logprobs, eighth.behavior_logprobs, atol=1e-5, rtol=0)
    # The last row ends at its 18th token. Read every step, the loop stops right there: the prefill and 17
    # decode steps. Read every 8 steps, the first read after it is after the 24th token: 23 decode steps.
    assert (every_calls, eighth_calls) == (1 + 17, 1 + 23)


def test_the_node_builds_its_backend_with_the_configured_weights(fast_config, tmp_path):
    from node.run.node import Node

    for weights in ("merged", "adapter"):
        cfg = fast_config(f"generation.hf.weights={weights}", f"run_dir={tmp_path / weights}")
        node = Node(cfg, cfg.run_dir, show_progress=False)
        node.setup()
        try:
            assert node.generator.weights == weights  # type: ignore[attr-defined]
        finally:
            node.close()
