"""The fused training pass (``node.fused.decoder``) in the trainer, against the modules' path it replaces: the
same losses and updates within float tolerance, in a fraction of the operations and with one read of the
device a step; the policies it refuses train as before; optimizer state moves between the two layouts; a
``zero_grad`` from outside loses no gradient. Its log-probs and gradients on each family:
``test_fused_families.py``."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from node.config import AdapterConfig, ModelConfig
from node.fused.decoder import fused_pass_refusal
from node.policy.model import build_policy
from node.train.groups import TrainGroup
from node.train.trainer import Trainer


def _tiny(**adapter):
    return build_policy(ModelConfig(name_or_path="tiny-base", device="cpu"), AdapterConfig(**adapter), seed=0)


def _trainer(policy, fused: bool, **options) -> Trainer:
    options = {"micro_batch_size": 5, **options}
    return Trainer(policy, lr=1e-2, norm_lr=1e-2, router_lr=1e-2, weight_decay=0.01, max_grad_norm=0.5, loss="topr",
                   eps_low=0.2, eps_high=0.28, length_norm=False, temperature=1.0, fused=fused, **options)


def _groups(policy) -> list[TrainGroup]:
    tok = policy.tokenizer
    out = []
    for g, text in enumerate(["12+7=", "3+40=", "9+9="]):
        prompt = [tok.bos_token_id, *tok(text, add_special_tokens=False)["input_ids"]]
        completions = [tok(a, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
                       for a in ["19", "1", "43", "18", "99"][: 3 + g]]
        group = TrainGroup(key=str(g), peer_id="" if g != 1 else "p", epoch=0, prompt_ids=prompt,
                           completions=completions, anchor_logprobs=[[-1.5] * len(c) for c in completions],
                           rewards=[float(i % 2) for i in range(len(completions))])
        group.advantages = torch.tensor([0.7 if i % 2 else -0.4 for i in range(len(completions))])
        out.append(group)
    return out


def _profiled_step(trainer: Trainer, groups) -> tuple[dict[str, float], int, int]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        stats = trainer.step(groups)
    names = Counter(e.name for e in prof.events())
    ops = sum(c for n, c in names.items() if n.startswith("aten::"))
    return stats, ops, names["aten::_local_scalar_dense"] + names["host_read"]


def test_a_fused_step_is_the_modules_step():
    """Two optimizer updates of three micro-batches each, own and peer rows: the same figures and the same
    adapters and norms after them, within float rounding (AdamW divides each gradient entry by its own
    size, so an entry near zero moves by up to the lr of 1e-2 on a rounding difference: 2e-4 is 2% of
    that, where a wrong gradient moves entries by the lr itself)."""
    results = {}
    for fused in (False, True):
        policy = _tiny()
        trainer = _trainer(policy, fused, optimizer_steps=2)
        assert (trainer.fused is not None) == fused
        stats = [trainer.step(_groups(policy)) for _ in range(2)][-1]
        results[fused] = (stats, policy.trainable_state())
    (stats, state), (f_stats, f_state) = results[False], results[True]
    assert set(f_stats) == set(stats) and stats["optimizer_steps"] == 2.0
    for key, value in stats.items():
        assert f_stats[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    for name, value in state.items():
        torch.testing.assert_close(f_state[name], value, atol=2e-4, rtol=0)


def test_a_fused_step_runs_a_fraction_of_the_operations_and_reads_the_device_at_most_four_times():
    """One step of the node's defaults (one update, one micro-batch): the fused step's operators at most a
    quarter of the modules' step's even on this two-layer model, whose embedding, loss and optimizer weigh
    most (smollm2's thirty layers: a seventh, ``scripts/bench/profile_step.py``); its reads of device values
    (``.item()`` and the like, and the trainer's one labelled read) at most 4, where the modules' step
    read dozens (one a parameter in AdamW's loop form)."""
    counts = {}
    for fused in (False, True):
        policy = _tiny()
        trainer = _trainer(policy, fused, micro_batch_size=16)
        trainer.step(_groups(policy))  # warm-up: the optimizer's state
        counts[fused] = _profiled_step(trainer, _groups(policy))[1:]
    (ops, reads), (f_ops, f_reads) = counts[False], counts[True]
    assert f_ops * 4 <= ops, (f_ops, ops)
    assert f_reads <= 4 < reads, (f_reads, reads)


def test_optimizer_state_moves_between_the_flat_and_the_per_parameter_layout():
    """A checkpoint written by a fused trainer loads into a trainer of the modules' path and back: runs
    resume across the change, in either direction."""
    fused_policy, plain_policy = _tiny(), _tiny()
    fused, plain = _trainer(fused_policy, True), _trainer(plain_policy, False)
    fused.step(_groups(fused_policy))
    state = fused.optimizer_state()
    assert len(state["state"]) == len(plain.optimizer_state()["param_groups"][0]["params"]) + len(
        plain.optimizer_state()["param_groups"][1]["params"])
    plain_policy.load_trainable_state(fused_policy.trainable_state())
    plain.load_optimizer_state(state)
    fused.step(_groups(fused_policy))
    plain.step(_groups(plain_policy))
    for name, value in plain_policy.trainable_state().items():
        torch.testing.assert_close(fused_policy.trainable_state()[name], value, atol=2e-4, rtol=0)
    again = _trainer(_tiny(), True)
    again.load_optimizer_state(plain.optimizer_state())
    ours, theirs = again.optimizer_state(), plain.optimizer_state()
    for pid, entry in theirs["state"].items():
        for key, value in entry.items():
            torch.testing.assert_close(ours["state"][pid][key], value)


def test_what_the_fused_pass_cannot_compute_trains_through_the_modules():
    from peft import LoraConfig, get_peft_model

    assert fused_pass_refusal(_tiny().model) is None
    dropout = _tiny(dropout=0.1)
    assert "dropout" in str(fused_pass_refusal(dropout.model))
    remix = _tiny(kind="remix")
    assert _trainer(remix, True).fused is None
    checkpointed = _tiny()
    assert _trainer(checkpointed, True, gradient_checkpointing=True).fused is None
    from transformers import GPT2Config, GPT2LMHeadModel
    gpt2 = get_peft_model(GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50)),
                          LoraConfig(r=2, target_modules=["c_attn"]))
    assert fused_pass_refusal(gpt2) is not None
    stats = _trainer(dropout, True).step(_groups(dropout))  # trained as before, through the modules
    assert stats["n_tokens"] > 0 and stats["grad_norm"] > 0


def test_a_zero_grad_from_outside_between_steps_loses_no_fused_gradient():
    """The fused pass writes the adapters' gradients into views of one buffer: an optimizer's or a module's
    ``zero_grad()`` (which sets ``.grad`` to None) between two steps must not cut them off. The second step
    moves the adapters and norms exactly as without it (caught: the buffer not put back as ``flat.grad``,
    where the step stopped on an assertion, or, without it, the optimizer skipped a parameter with no
    gradient)."""
    states = []
    for outside in (False, True):
        policy = _tiny(train_norms=True)
        trainer = _trainer(policy, True)
        trainer.step(_groups(policy))
        before = policy.trainable_state()
        if outside:
            trainer.optimizer.zero_grad()
            policy.model.zero_grad()
            assert all(g.flat.grad is None for g in trainer.flat_groups)
        trainer.step(_groups(policy))
        after = policy.trainable_state()
        assert all(not torch.equal(after[n], before[n]) for n in before)
        states.append(after)
    for name, value in states[0].items():
        assert torch.equal(states[1][name], value), name
