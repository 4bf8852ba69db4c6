"""The fused training pass (``node.fused.decoder``) on every family it takes, against the modules' path of
transformers and peft on a tiny random model of that family, biases and norms included: the same log-probs
and gradients to float rounding, on the CPU and (gpu-marked) on CUDA, in float32 and bfloat16; and every
family it refuses trains through the modules instead.

The random models are perturbed where transformers initialises a tensor to a constant that would hide a
mistake: the adapters' B (zero: the adapters' part of every gradient but B's own would vanish), the q, k
and v biases (zero: a pass that dropped them, or used ``mm`` for ``addmm``, would agree), and every norm
weight (one: a pass that dropped a norm's weight would agree).
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from node.fused.decoder import FusedPass, fused_pass_refusal
from node.policy.families import FAMILIES, family_named
from node.policy.logprobs import right_pad, shared_prompt_logprobs
from node.policy.model import Policy
from node.train.flat import FlatGroup
from node.train.groups import TrainGroup
from node.train.losses import policy_loss
from node.train.trainer import Trainer

VOCAB = 256
FUSED = ["llama", "mistral", "qwen2", "qwen3"]
REFUSED = ["mistral-window", "gemma2", "gemma3", "phi3"]
CUDA = pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                       reason="no CUDA device")])


def _config(kind: str):
    from transformers import AutoConfig

    sizes = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 num_hidden_layers=2, vocab_size=VOCAB, max_position_embeddings=256, tie_word_embeddings=False,
                 pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if kind == "mistral":
        return AutoConfig.for_model("mistral", **sizes, sliding_window=None)
    if kind == "mistral-window":
        return AutoConfig.for_model("mistral", **sizes, sliding_window=8)
    return AutoConfig.for_model(family_named(kind).model_types[0], **sizes)


def _random_lm(kind: str, *, dtype: torch.dtype = torch.float32, norms: bool = False, device: str = "cpu"):
    """A peft LoRA model over a two-layer random ``kind``, every adapter on (``family.targets``), with the
    norms trained (peft ``modules_to_save``, as ``adapter.train_norms`` does) where ``norms``."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    lm = AutoModelForCausalLM.from_config(_config(kind)).to(dtype).requires_grad_(False)
    with torch.no_grad():
        for p in lm.parameters():
            if p.dim() == 1:  # biases and norm weights
                p.add_(torch.randn_like(p) * 0.2)
    norm_names = sorted({n.rsplit(".", 1)[-1] for n, m in lm.named_modules() if type(m).__name__.endswith("RMSNorm")})
    targets = list(family_named(kind.split("-")[0]).targets)
    model = get_peft_model(lm, LoraConfig(r=4, lora_alpha=8, target_modules=targets,
                                          modules_to_save=norm_names if norms else None))
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.05)
    return model.to(device)


def _rows(seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    """Three prompts, eight rows (groups of unequal size), completions of 1 to 6 tokens."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, VOCAB) for _ in range(rng.randint(3, 9))] for _ in range(3)]
    rows = [prompts[i % 3] for i in range(7)] + [prompts[0]]
    completions = [[rng.randrange(3, VOCAB) for _ in range(rng.randint(1, 6))] for _ in range(8)]
    return rows, completions


def logprobs_and_grads(model, fused: bool, rows, completions) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The completions' log-probs (at temperature 0.9) and every trainable parameter's gradient of a clipped
    policy loss over them, through the fused pass or the modules'; float32, on the CPU."""
    device = next(model.parameters()).device
    ids, mask = (t.to(device) for t in right_pad(completions, 0, torch.long))
    params = [p for p in model.parameters() if p.requires_grad]
    model.train()
    if fused:
        pass_ = FusedPass(model)
        group = FlatGroup(pass_.layout.params, pass_.layout.flat, pass_.layout.mask)
        lps = pass_.logprobs(rows, completions, pad_id=0, temperature=0.9)
    else:
        lps = shared_prompt_logprobs(model, rows, ids, mask, pad_id=0, temperature=0.9)
    advantages = torch.linspace(-1, 1, len(rows), device=device)
    loss, _ = policy_loss(lps, lps.detach() - 0.1, advantages, mask, "topr")
    loss.backward()
    if fused:
        group.masked_grad()
    return lps.detach().float()[mask].cpu(), [p.grad.detach().float().cpu().clone() for p in params]


def _differences(kind: str, **options) -> tuple[float, float]:
    """The largest log-prob difference between the two paths, and the largest gradient difference relative
    to its parameter's largest gradient entry."""
    rows, completions = _rows()
    ref_lps, ref_grads = logprobs_and_grads(_random_lm(kind, **options), False, rows, completions)
    lps, grads = logprobs_and_grads(_random_lm(kind, **options), True, rows, completions)
    assert len(grads) == len(ref_grads) and all(float(g.abs().max()) > 0 for g in ref_grads)
    grad_gap = max(float((g - ref).abs().max()) / float(ref.abs().max()) for g, ref in zip(grads, ref_grads))
    return float((lps - ref_lps).abs().max()), grad_gap


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("norms", [False, True], ids=["base-norms", "trained-norms"])
@pytest.mark.parametrize("kind", FUSED)
def test_the_fused_pass_gives_the_modules_log_probs_and_gradients(kind, norms, device):
    """float32: log-probs within 1e-5, every parameter's gradient within 1e-4 of its largest entry (every
    one nonzero). Caught: q/k/v biases dropped or ``mm`` for ``addmm`` (qwen2), a norm's weight dropped or
    the q/k norms skipped (qwen3), Mistral taken with a window."""
    assert fused_pass_refusal(_random_lm(kind)) is None
    lp_gap, grad_gap = _differences(kind, norms=norms, device=device)
    assert lp_gap <= 1e-5 and grad_gap <= 1e-4, (lp_gap, grad_gap)


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_in_bfloat16_the_fused_pass_stays_within_rounding_of_the_modules(kind, device):
    """bfloat16 keeps 8 significant bits: each rounding moves a value by up to 2^-9 of itself, and each path
    rounds every layer's activations in its own order (one product for q, k and v against three; attention
    over a packed row against a copied cache; on CUDA other attention kernels). Measured on the CPU (three
    sets of rows, llama, qwen2 and qwen3): log-probs within 2.2e-3 and each parameter's gradient within 2.7%
    of its largest entry. The bounds, 0.05 and 10%, leave CUDA's kernels a margin of four to twenty times
    that, and stay far below a wrong function: a dropped q/k/v bias moves them by 0.57 and 290%."""
    lp_gap, grad_gap = _differences(kind, dtype=torch.bfloat16, device=device)
    assert lp_gap <= 0.05 and grad_gap <= 0.1, (lp_gap, grad_gap)


def test_the_family_table_says_which_families_the_fused_pass_takes():
    assert sorted(f.name for f in FAMILIES if f.fused) == sorted(FUSED)


class _Tokens(SimpleNamespace):
    """What the trainer reads of a tokenizer: the pad id."""

    pad_token_id = 0


def _policy(model) -> Policy:
    groups: dict[str, list[torch.nn.Parameter]] = {"adapter": [], "norm": []}
    for name, p in model.named_parameters():
        if p.requires_grad:
            groups["norm" if any("norm" in part for part in name.split(".")) else "adapter"].append(p)
    return Policy(model=model, tokenizer=_Tokens(), device=torch.device("cpu"), name_or_path="random",  # type: ignore[arg-type]
                  tokenizer_fingerprint="", model_fingerprint="", param_groups={k: v for k, v in groups.items() if v})


def _groups() -> list[TrainGroup]:
    rows, completions = _rows(1)
    out = []
    for g in range(3):
        mine = [c for c, p in zip(completions, rows) if p == rows[g]]
        group = TrainGroup(key=str(g), peer_id="", epoch=0, prompt_ids=rows[g], completions=mine,
                           anchor_logprobs=[[-5.5] * len(c) for c in mine], rewards=[float(i % 2) for i in range(len(mine))])
        group.advantages = torch.tensor([0.7 if i % 2 else -0.4 for i in range(len(mine))])
        out.append(group)
    return out


def _trainer(policy: Policy, fused: bool) -> Trainer:
    return Trainer(policy, lr=1e-2, norm_lr=1e-2, router_lr=1e-2, weight_decay=0.0, max_grad_norm=1.0, loss="topr",
                   eps_low=0.2, eps_high=0.28, length_norm=False, micro_batch_size=8, temperature=1.0, fused=fused)


@pytest.mark.parametrize("kind", ["qwen2", "qwen3"])
def test_a_fused_trainer_step_is_the_modules_step(kind):
    """Two steps of the trainer with the norms trained (Qwen3's q/k norms among them, in the flat norm group
    the fused pass reads): the same adapters and norms as the modules' trainer, within what AdamW makes of
    float rounding (it divides each entry's gradient by its own size: an entry near zero moves by up to the
    lr of 1e-2 on a rounding difference; 2e-4 is 2% of that)."""
    states = []
    for fused in (False, True):
        policy = _policy(_random_lm(kind, norms=True))
        trainer = _trainer(policy, fused)
        assert (trainer.fused is not None) == fused
        for _ in range(2):
            trainer.step(_groups())
        states.append(policy.trainable_state())
    assert any("q_norm" in n for n in states[0]) == (kind == "qwen3")
    for name, value in states[0].items():
        torch.testing.assert_close(states[1][name], value, atol=2e-4, rtol=0, msg=name)


@pytest.mark.parametrize("kind", REFUSED)
def test_a_family_the_fused_pass_refuses_trains_through_the_modules(kind):
    """Gemma 2 and 3 (their norm form, GELU gate, scaled embeddings, windows), Phi-3 (q, k and v in one
    projection) and Mistral with a sliding window: refused with a reason, and the trainer, asked for the
    fused pass, trains through the modules: the adapters move, the base does not."""
    model = _random_lm(kind, norms=True)
    reason = fused_pass_refusal(model)
    assert reason and ("sliding" in reason) == (kind == "mistral-window"), reason
    policy = _policy(model)
    base = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    before = policy.trainable_state()
    trainer = _trainer(policy, True)
    assert trainer.fused is None and not trainer.flat_groups
    stats = trainer.step(_groups())
    assert stats["n_tokens"] > 0 and stats["grad_norm"] > 0
    after = policy.trainable_state()
    assert all(not torch.equal(after[n], before[n]) for n in before if "lora_A" in n or "lora_B" in n)
    assert all(torch.equal(p, base[n]) for n, p in model.named_parameters() if not p.requires_grad)
