"""Sampling never draws a special token other than the model's end-of-sequence ids, and ends a completion at
any of those (``node.policy.special``): a model pushed towards its special tokens still writes completions
its peers accept, and a second eos id declared by the generation config ends a completion as the first
does, for the sampler, the scorer's text and a receiver."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch
from torch import nn

import node.generation.static as generation_static
from node.config import AdapterConfig, ModelConfig
from node.generation.sampling import generate
from node.policy.model import build_policy, load_base
from node.policy.special import banned_ids, stop_ids
from node.run.node import Node
from swarm.memory import InMemoryHub


@contextlib.contextmanager
def _pushed(vocab: int, ids: list[int], boost: float = 30.0, device: str = "cpu") -> Iterator[None]:
    """Every output layer of ``vocab`` logits (the policy's, a merged copy's) adds ``boost`` to ``ids`` (held on
    ``device``: a captured decode step copies nothing from the host)."""
    index = torch.tensor(ids, device=device)

    def hook(module: nn.Module, _inputs: tuple, out: torch.Tensor) -> torch.Tensor | None:
        if isinstance(module, nn.Linear) and module.out_features == vocab:
            out = out.clone()
            out[..., index if index.device == out.device else index.to(out.device)] += boost
            return out
        return None

    handle = nn.modules.module.register_module_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def _policy(device: str = "cpu"):
    return build_policy(ModelConfig(name_or_path="tiny-base", device=device), AdapterConfig(), seed=0)


CUDA = pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                       reason="no CUDA device")])


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
@pytest.mark.parametrize("greedy", [False, True])
def test_a_model_pushed_towards_its_special_tokens_never_samples_them(greedy, static, device):
    """The dynamic loop and the static cache's (``generation.hf.cuda_graphs``: on CUDA each decode step a
    captured graph, with the mask inside it), on the CPU and on CUDA."""
    generation_static._warned.clear()
    policy = _policy(device)
    tok = policy.tokenizer
    stops = stop_ids(policy.model, tok)
    banned = banned_ids(tok, stops)
    assert stops == (tok.eos_token_id,) and set(banned) == {tok.bos_token_id, tok.pad_token_id, tok.unk_token_id}
    prompts = [[tok.bos_token_id, *tok("12+7=", add_special_tokens=False)["input_ids"]]] * 8
    with _pushed(len(tok), list(banned), device=device):
        out = generate(policy.model, tok, prompts, max_new_tokens=12, greedy=greedy, device=policy.device,
                       generator=torch.Generator(device=policy.device).manual_seed(0), cuda_graphs=static)
    assert not generation_static._warned, generation_static._warned  # on CUDA: captured, not fallen back
    with _pushed(len(tok), list(banned)):
        # without the mask the push wins: the base model's argmax after the prompt is a special token
        raw, _ = load_base(ModelConfig(name_or_path="tiny-base", device="cpu"))
        logits = raw(input_ids=torch.tensor(prompts[:1])).logits[0, -1]
        assert int(logits.argmax()) in banned
    drawn = out.completion_ids[out.completion_mask]
    assert drawn.numel() > 0 and not any(int(i) in banned for i in drawn)
    assert torch.isfinite(out.behavior_logprobs[out.completion_mask]).all()


def test_a_second_eos_id_of_the_generation_config_ends_a_completion():
    policy = _policy()
    tok = policy.tokenizer
    second = tok("7", add_special_tokens=False)["input_ids"][0]
    policy.model.generation_config.eos_token_id = [tok.eos_token_id, second]
    assert stop_ids(policy.model, tok) == (tok.eos_token_id, second)
    prompts = [[tok.bos_token_id, *tok("12+7=", add_special_tokens=False)["input_ids"]]] * 4
    with _pushed(len(tok), [second]):
        out = generate(policy.model, tok, prompts, max_new_tokens=12, generator=torch.Generator().manual_seed(0))
    assert out.finish_reasons == ["eos"] * 4
    for i in range(4):
        ids, _ = out.row(i)
        assert ids[-1] == second and second not in ids[:-1]

    from node.generation.rollouts import decode_completion
    assert decode_completion(policy, [*tok("12", add_special_tokens=False)["input_ids"], second]) == "12"


def test_two_nodes_of_a_special_happy_model_reject_none_of_each_others_rollouts(tmp_path):
    """Two tiny-base nodes in memory whose models are pushed towards bos, pad and unk: before the mask a
    receiver rejected such completions (``special_token``); now every rollout passes its peer's checks."""
    from tests.node.conftest import FAST

    common = [*FAST, "sapo.local_groups=2", "sapo.generated_groups=2", "sapo.external_groups=2",
              "train.steps=100", "generation.max_new_tokens=6"]
    hub = InMemoryHub()
    nodes = []
    try:
        from node.config import load_config
        for i in range(2):
            cfg = load_config("configs/tiny-swarm.yaml", [*common, f"run_dir={tmp_path / str(i)}", f"seed={i + 1}"])
            node = Node(cfg, show_progress=False, transport=hub.join)
            node.setup()
            nodes.append(node)
        tok = nodes[0].policy.tokenizer
        with _pushed(len(tok), list(banned_ids(tok, stop_ids(nodes[0].policy.model, tok))), boost=8.0):
            for _ in range(3):
                for node in nodes:
                    node.train_step()
                hub.epoch += 1
        accepted = 0
        for node in nodes:
            ingestor = node.exchange.ingestor  # type: ignore[union-attr]
            assert not ingestor.rejected, dict(ingestor.rejected)
            accepted += ingestor.accepted_groups
        assert accepted > 0
    finally:
        for node in nodes:
            node.close()
