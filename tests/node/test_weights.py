"""The weights an engine is handed: the policy's own computation, with nothing of the policy changed."""

from __future__ import annotations

import inspect

import torch
from transformers import AutoModelForCausalLM

from node.config import AdapterConfig, ModelConfig
from node.generation.weights import effective_weights
from node.policy.model import build_policy
from node.sources.embedded.tiny import tiny_base_path


def test_merged_weights_in_a_plain_model_give_the_policys_logits_and_leave_the_policy_as_it_was():
    policy = build_policy(ModelConfig(name_or_path="tiny-base", device="cpu"), AdapterConfig(train_norms=True), seed=0)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in policy.model.parameters():
            if p.requires_grad:  # LoRA A and B and the norms, away from their initial values
                p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}

    weights = effective_weights(policy.model, torch.float32)
    assert inspect.isgenerator(weights)  # merged one layer at a time, as the engine asks
    plain = AutoModelForCausalLM.from_pretrained(str(tiny_base_path()), dtype=torch.float32)
    names = dict(plain.named_parameters())
    pushed = 0
    with torch.no_grad():
        for name, tensor in weights:
            names[name].copy_(tensor)
            pushed += 1
    # every decoder parameter and the final norm (the embeddings are never adapted, so never pushed)
    assert pushed == sum(1 for n in names if "embed" not in n and "lm_head" not in n)

    ids = torch.tensor([[1, 5, 9, 12, 7, 3, 30]])
    with torch.no_grad():
        expected = policy.model(input_ids=ids).logits
        got = plain(input_ids=ids).logits
        untrained = AutoModelForCausalLM.from_pretrained(str(tiny_base_path()), dtype=torch.float32)(input_ids=ids).logits
    allowed = torch.isfinite(expected)  # the policy masks the special tokens it never samples; a plain model does not
    assert 0 < int((~allowed).sum()) < allowed.numel() and bool(torch.isfinite(got).all())
    assert (got - expected)[allowed].abs().max() < 1e-5
    assert (untrained - expected)[allowed].abs().max() > 1e-3  # the merge is not vacuous: the adapters moved the logits
    for n, p in policy.model.named_parameters():
        assert torch.equal(p, before[n]), f"merging changed the policy's {n}"
