"""ReMix across devices and inference mode: a generation (under ``torch.inference_mode``) followed by a
training step, with the model placed on its device after the adapter was attached.

On CUDA the node attaches ReMix on the CPU and then moves the model; the selection counts used to follow it
lazily, inside the first forward, which is generation's, under inference mode, and the next training step's
in-place update failed (``Inplace update to inference tensor outside InferenceMode is not allowed``). The CPU
test takes the same path with the only other device a CPU machine has: the adapter attached on ``meta`` (as a
lazily loaded model is), the model materialised on the CPU afterwards.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from node.generation.sampling import generate
from node.policy.logprobs import sequence_logprobs
from node.policy.remix.attach import RemixAdapter, attach_remix

VOCAB = 64


def _model() -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                         tie_word_embeddings=True)
    return LlamaForCausalLM(config).eval()


def _reference() -> tuple[LlamaForCausalLM, RemixAdapter]:
    torch.manual_seed(0)
    model = _model()
    adapter = attach_remix(model, n=4, k=2, rank=2)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for group in adapter.trainable_parameters().values():
            for p in group:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return model, adapter


def _generate_then_train(model: LlamaForCausalLM, adapter: RemixAdapter, device: torch.device) -> torch.Tensor:
    """A generation, then one sampled-routing training step with a backward pass; the selection counts."""
    tok = cast(Any, SimpleNamespace(eos_token_id=None, pad_token_id=0))
    prompts = [[1, 5, 9, 13], [2, 6, 10]]
    out = generate(model, tok, prompts, max_new_tokens=4, device=device, remix=adapter,
                   generator=torch.Generator(device=device).manual_seed(2))
    assert torch.is_inference_mode_enabled() is False
    model.train()
    adapter.sampled(2, torch.Generator(device=device).manual_seed(3))
    ids = torch.tensor([[1, 5, 9, 13], [0, 2, 6, 10]], device=device).repeat(2, 1)
    mask = (ids != 0)
    completion = out.completion_ids.to(device).repeat(2, 1)
    logprobs = sequence_logprobs(model, ids, mask, completion, torch.ones_like(completion, dtype=torch.bool),
                                 remix=adapter)
    per_sequence = -logprobs.sum(-1)
    (per_sequence.mean() + adapter.router_loss(per_sequence, 2)).backward()
    adapter.deterministic()
    model.eval()
    return adapter.selection_counts()


def test_a_model_placed_on_its_device_after_attach_generates_then_trains_with_the_same_counts() -> None:
    model, adapter = _reference()
    expected = _generate_then_train(model, adapter, torch.device("cpu"))
    assert int(expected.sum()) == 2 * 2 * (2 + 4)  # k per row and layer: 2 rows generating, 4 training

    state = model.state_dict()
    with torch.device("meta"):
        lazy = _model()
        lazy_adapter = attach_remix(lazy, n=4, k=2, rank=2)
    lazy.to_empty(device="cpu")
    lazy.load_state_dict(state)
    with torch.no_grad():  # buffers outside the state dict (the rotary inv_freq) hold whatever memory held
        for name, buffer in model.named_buffers():
            lazy.get_buffer(name).copy_(buffer)
    lazy_adapter.reset_selection_counts()  # as the reference's counts were before its run
    assert torch.equal(_generate_then_train(lazy, lazy_adapter, torch.device("cpu")), expected)


def test_no_adapter_state_made_in_generation_is_an_inference_tensor_that_training_updates() -> None:
    model, adapter = _reference()
    _generate_then_train(model, adapter, torch.device("cpu"))
    tok = cast(Any, SimpleNamespace(eos_token_id=None, pad_token_id=0))
    generate(model, tok, [[1, 2, 3]], max_new_tokens=3, remix=adapter)
    for name, buffer in model.named_buffers():
        assert not buffer.is_inference(), name
    assert not any(p.is_inference() for p in model.parameters())
    counts = adapter.selection_counts()
    adapter.reset_selection_counts()  # outside inference mode, after a generation
    assert int(counts.sum()) > 0 and int(adapter.selection_counts().sum()) == 0


@pytest.mark.gpu
def test_remix_attached_on_the_cpu_generates_then_trains_on_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    model, adapter = _reference()
    expected = _generate_then_train(model, adapter, torch.device("cpu"))
    adapter.reset_selection_counts()
    cuda_model, cuda_adapter = _reference()
    cuda_model.to("cuda")
    counts = _generate_then_train(cuda_model, cuda_adapter, torch.device("cuda"))
    assert int(counts.sum()) == int(expected.sum())
