"""The embedded small-base model: shipped in the package (the same weights on every machine), built by the
recipe in the code, loads like a hub model, has a byte-level BPE tokenizer with a ChatML template the node's
prompt formatting uses, and earns some (not all) reward on arith and two reasoning-gym datasets. The build is
deterministic on one machine (a shrunk recipe built twice); the full recipe, rebuilt, stays within the
measured margins of the shipped model (slow)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer

from node.config import ModelConfig, load_config
from node.generation.sampling import generate
from node.policy.model import load_base
from node.sources.embedded.catalog import embedded_model, embedded_names
from node.sources.embedded.small import CHAT_TEMPLATE, template_tokenizer, train_bpe_tokenizer
from node.sources.embedded.small_recipe import FULL
from node.sources.locate import locate_model, resolve_model_path
from node.tasks import build_task_source

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def info(small_base: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((small_base / "build_info.json").read_text())
    return loaded


@pytest.fixture(scope="module")
def tokenizer(small_base: Path) -> Any:
    return AutoTokenizer.from_pretrained(small_base)


@pytest.fixture(scope="module")
def model(small_base: Path) -> Any:
    loaded = AutoModelForCausalLM.from_pretrained(small_base, dtype=torch.float32)
    loaded.eval()
    return loaded


def test_registry_names_the_shipped_folder(small_base: Path, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    assert embedded_names()[:2] == ["tiny-base", "small-base"]
    small = embedded_model("small-base")
    assert small is not None and small.path == REPO_ROOT / "node" / "sources" / "assets" / "small-base" == small_base
    monkeypatch.setenv("SWARM_NODE_CACHE", str(tmp_path))  # nothing is built or cached on a fresh machine
    assert resolve_model_path("small-base") == str(small_base)
    where = locate_model("small-base")
    assert (where.path, where.build) == (str(small_base), None)
    assert list(tmp_path.iterdir()) == []
    assert resolve_model_path("tiny-base") == resolve_model_path("embedded") != str(small_base)
    assert resolve_model_path("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"
    assert (REPO_ROOT / small.build_script).is_file()


def test_shipped_model_follows_the_recipe_in_the_code(info: dict[str, Any]) -> None:
    """Editing the recipe without rebuilding and shipping the model fails here, not silently."""
    assert info["recipe_key"] == FULL.key() and info["recipe"]["steps"] == FULL.steps
    assert len(info["loss_curve"]) == 20 and info["loss_curve"][0] > 2 * info["loss_curve"][-1]


def test_built_folder_is_a_small_bf16_llama(small_base: Path, model: Any, info: dict[str, Any]) -> None:
    assert sum(f.stat().st_size for f in small_base.iterdir()) < 12_500_000
    assert json.loads((small_base / "config.json").read_text())["dtype"] == "bfloat16"
    n_params = sum(p.numel() for p in model.parameters())
    assert n_params == info["parameters"] and 5_000_000 <= n_params <= 30_000_000
    assert model.config.model_type == "llama" and model.config.tie_word_embeddings is True


def test_tokenizer_is_byte_level_bpe_without_bos(tokenizer: Any, info: dict[str, Any]) -> None:
    assert len(tokenizer) == info["vocab_size"] == FULL.vocab_size
    assert tokenizer.bos_token_id is None
    assert (tokenizer.pad_token, tokenizer.eos_token) == ("<|endoftext|>", "<|im_end|>")
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id) == (0, 2)
    for text in ["07+35=", "<answer>(P ∧ ¬Q)</answer>", "  Friday,\n\tété 🙂", "x<unk>y"]:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(ids) == text
    digits = tokenizer("2022", add_special_tokens=False)["input_ids"]
    assert tokenizer.convert_ids_to_tokens(digits) == ["2", "0", "2", "2"]


def test_loaded_tokenizer_splits_text_as_trained(small_base: Path, tokenizer: Any, info: dict[str, Any]) -> None:
    """AutoTokenizer keeps the trained pre-tokenizer (it would swap in Qwen2's for a ``qwen2`` model), so a
    formatted prompt has the ids and the short length the model was pretrained on: phrases every prompt
    repeats (the system prompt, the answer instruction) are a few tokens."""
    trained = Tokenizer.from_file(str(small_base / "tokenizer.json"))
    source = build_task_source("reasoning_gym", ["calendar_arithmetic"], None, 0)
    for ref in source.eval_refs(4):
        text = source.format_prompt(source.task(ref), tokenizer)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert ids == trained.encode(text, add_special_tokens=False).ids
        assert len(ids) < info["mean_tokens"]["reasoning_gym/calendar_arithmetic"] * 2 < len(text) / 5


def test_tokenizer_training_is_deterministic() -> None:
    corpus = [f"{a:02d}+{b:02d}=" for a in range(40) for b in range(40)] + ["<answer>Friday</answer>\n"] * 9
    first, second = train_bpe_tokenizer(corpus, 300), train_bpe_tokenizer(list(corpus), 300)
    assert first.backend_tokenizer.to_str() == second.backend_tokenizer.to_str()
    assert first.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [0, 1, 2]
    assert 256 + 3 < len(first) <= 300  # bytes and specials, then merges (fewer where pairs run out)


def test_node_formats_prompts_through_the_chat_template(tokenizer: Any) -> None:
    assert tokenizer.chat_template == CHAT_TEMPLATE == template_tokenizer().chat_template
    source = build_task_source("reasoning_gym", ["calendar_arithmetic"], None, 0)
    task = source.task(source.eval_refs(1)[0])
    text = source.format_prompt(task, tokenizer)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert f"<|im_start|>user\n{task.prompt}<|im_end|>" in text
    arith = build_task_source("arith", ["add"], None, 0)
    assert arith.format_prompt(arith.task(arith.eval_refs(1)[0]), tokenizer).endswith("=")  # raw, no template


def test_load_base_by_name_pads_left_and_ends_on_im_end(small_base: Path) -> None:
    model, tokenizer = load_base(ModelConfig(name_or_path="small-base"))
    assert tokenizer.padding_side == "left" and tokenizer.pad_token_id == 0
    assert model.config.eos_token_id == tokenizer.eos_token_id
    assert next(model.parameters()).dtype == torch.float32  # bf16 on disk, the config's dtype in memory


def test_greedy_addition_is_well_formed(model: Any, tokenizer: Any, info: dict[str, Any]) -> None:
    source = build_task_source("arith", ["add"], None, 0)
    tasks = [source.task(r) for r in source.eval_refs(64)]
    prompts = [tokenizer(t.prompt, add_special_tokens=False)["input_ids"] for t in tasks]
    out = generate(model, tokenizer, prompts, max_new_tokens=5, greedy=True)
    texts = [tokenizer.decode(out.row(i)[0], skip_special_tokens=True) for i in range(len(tasks))]
    assert sum(len(t) == 3 and t.isdigit() for t in texts) >= 60
    assert sum(out.finish_reasons[i] == "eos" for i in range(len(tasks))) >= 60
    reward = sum(source.score(task, text) for task, text in zip(tasks, texts)) / len(tasks)
    assert reward == pytest.approx(info["greedy"]["arith/add"]["reward"], abs=0.2)  # 64 of the same tasks


def test_shipped_model_earns_some_reward_short_of_mastery(info: dict[str, Any]) -> None:
    """The shipped model's figures (its build measured them on the node's 100 held-out tasks per dataset,
    generating and scoring as the node does; the same on every machine, since every machine runs these
    weights): sampled at temperature 1, as the node trains, it earns reward on arith and both reasoning-gym
    datasets, so RL has signal, and it is short of mastery."""
    rg = [k for k in info["sampled_t1"] if k.startswith("reasoning_gym/")]
    assert "arith/add" in info["sampled_t1"] and len(rg) >= 2
    for key in ["arith/add", *rg]:
        assert 0 < info["sampled_t1"][key]["reward"] <= 0.9, key
        assert info["greedy"][key]["reward"] < 0.95, key


@pytest.mark.parametrize("config", ["configs/small-silo.yaml", "configs/small-swarm.yaml"])
def test_configs_use_small_base_on_tasks_it_was_built_for(config: str) -> None:
    cfg = load_config(REPO_ROOT / config)
    assert cfg.model.name_or_path == "small-base"
    assert {f"{cfg.tasks.source}/{d}" for d in cfg.tasks.datasets} <= set(FULL.datasets)


BUILT_FILES = ("model.safetensors", "tokenizer.json", "tokenizer_config.json", "config.json",
               "generation_config.json")
# The same build, shrunk (a narrow model, a few steps, small reasoning-gym pools and no arith pool), so
# building it twice takes seconds.
MICRO = replace(FULL, name="small-base-micro", steps=6, pool_size=60, eval_tasks=4, vocab_size=600,
                hidden_size=64, intermediate_size=128, num_layers=2, num_heads=2, num_kv_heads=1,
                mix=(("reasoning_gym/calendar_arithmetic", 0.5), ("reasoning_gym/propositional_logic", 0.5)))


def test_build_is_deterministic_on_one_machine(tmp_path: Path) -> None:
    """Two builds of a recipe in one environment write the same bytes and measure the same figures."""
    from scripts.lib.small_build import build
    first = build(MICRO, tmp_path / "first", echo=lambda _line: None)
    second = build(MICRO, tmp_path / "second", echo=lambda _line: None)
    for name in BUILT_FILES:
        assert (tmp_path / "first" / name).read_bytes() == (tmp_path / "second" / name).read_bytes(), name
    for field in ("greedy", "sampled_t1", "final_loss", "loss_curve"):
        assert first[field] == second[field], field
    assert len(first["loss_curve"]) == MICRO.steps  # fewer steps than windows: one step a window


@pytest.mark.slow
def test_rebuild_from_the_recipe_is_the_shipped_model_within_measured_margins(tmp_path: Path,
                                                                               info: dict[str, Any]) -> None:
    """The recipe has not rotted: rebuilt here (about 7 minutes on 2 cores), its loss curve and sampled
    reward fall within the margins measured across builds (``small_build.compare_builds``)."""
    from scripts.lib import small_build
    build, compare_builds = small_build.build, small_build.compare_builds
    rebuilt = build(FULL, tmp_path / "rebuilt", echo=lambda _line: None)
    assert compare_builds(info, rebuilt) == []
    assert compare_builds(info, {**rebuilt, "loss_curve": [x + 0.5 for x in rebuilt["loss_curve"]]})  # can fail
