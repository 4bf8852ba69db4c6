"""The shipped tiny base model: loads like a hub model, has the expected size, tokenizer and accuracy."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from node.sources.embedded.tiny import CHAR_VOCAB, TINY_BASE_NAME, build_char_tokenizer, tiny_base_path
from node.sources.locate import resolve_model_path
from node.tasks.arith_format import make_problem
from scripts.lib import tiny_bases
from tests.scripts import load_script

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(tiny_base_path())


@pytest.fixture(scope="module")
def model() -> Any:
    torch.manual_seed(0)
    loaded = AutoModelForCausalLM.from_pretrained(tiny_base_path())
    loaded.eval()  # type: ignore[no-untyped-call]
    return loaded


def _add_problems(n: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    return [make_problem("add", rng.randrange(100), rng.randrange(100)) for _ in range(n)]


def _completions(model: Any, tokenizer: Any, prompts: list[str], **generate_kwargs: Any) -> list[str]:
    """Batched generation from bos + prompt with left padding; text of each completion up to eos."""
    tokenizer.padding_side = "left"
    rows = [[tokenizer.bos_token_id, *tokenizer.encode(p)] for p in prompts]
    batch = tokenizer.pad({"input_ids": rows}, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(
            **batch,
            max_new_tokens=5,
            use_cache=True,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            **generate_kwargs,
        )
    texts = []
    for row in out[:, batch["input_ids"].shape[1] :].tolist():
        if tokenizer.eos_token_id in row:
            row = row[: row.index(tokenizer.eos_token_id)]
        texts.append(tokenizer.decode(row))
    return texts


def test_resolve_model_path_maps_embedded_names() -> None:
    assert TINY_BASE_NAME == "tiny-base"
    assert resolve_model_path("tiny-base") == str(tiny_base_path())
    assert resolve_model_path("embedded") == str(tiny_base_path())
    assert resolve_model_path("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"
    assert (tiny_base_path() / "model.safetensors").is_file()


def test_shipped_folder_is_small_and_has_build_info() -> None:
    size = sum(f.stat().st_size for f in tiny_base_path().iterdir())
    assert size < 4_000_000
    info = json.loads((tiny_base_path() / "build_info.json").read_text())
    assert info["reached_target"] is True
    assert 0.4 <= info["greedy_add_accuracy"] <= 0.75
    assert info["sampled_add_accuracy_t1"] < info["greedy_add_accuracy"]


def test_model_architecture_and_parameter_count(model: Any, tokenizer: Any) -> None:
    assert model.config.model_type == "llama"
    assert model.config.tie_word_embeddings is True
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert model.config.vocab_size == len(tokenizer) == len(CHAR_VOCAB) + 4
    n_params = sum(p.numel() for p in model.parameters())
    # Tied embedding 53 x 128; per layer q, k, v, o (4 x 128 x 128), MLP (3 x 128 x 384) and 2 norms; final norm.
    assert n_params == 53 * 128 + 2 * (4 * 128 * 128 + 3 * 128 * 384 + 2 * 128) + 128 == 433_408


def test_tokenizer_one_id_per_char_and_round_trip(tokenizer: Any) -> None:
    text = "".join(CHAR_VOCAB) + "  07+35= 042 \n(a/b), x: ok?"
    ids = tokenizer.encode(text)
    assert len(ids) == len(text)
    assert tokenizer.decode(ids) == text
    assert tokenizer.encode(" ") != tokenizer.encode("  ")
    assert tokenizer.decode(tokenizer.encode("1 2")) == "1 2"
    assert tokenizer.convert_ids_to_tokens(tokenizer.encode("a b")) == ["a", " ", "b"]


def test_tokenizer_special_tokens_not_added_automatically(tokenizer: Any) -> None:
    assert (tokenizer.pad_token, tokenizer.bos_token, tokenizer.eos_token) == ("<pad>", "<bos>", "<eos>")
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1, 2)
    assert tokenizer.encode("12") == tokenizer.convert_tokens_to_ids(["1", "2"])
    assert tokenizer("12")["input_ids"] == tokenizer.encode("12")
    assert tokenizer.encode("A") == [tokenizer.unk_token_id]
    assert tokenizer.decode([1, *tokenizer.encode("7 "), 2], skip_special_tokens=True) == "7 "


def test_padding_side_is_settable(tokenizer: Any) -> None:
    tokenizer.padding_side = "right"
    right = tokenizer(["1", "123"], padding=True)["input_ids"]
    tokenizer.padding_side = "left"
    left = tokenizer(["1", "123"], padding=True)["input_ids"]
    one = tokenizer.convert_tokens_to_ids("1")
    assert right[0] == [one, 0, 0]
    assert left[0] == [0, 0, one]


def test_built_tokenizer_matches_shipped(tokenizer: Any) -> None:
    built = build_char_tokenizer()
    assert built.get_vocab() == tokenizer.get_vocab()
    assert built.all_special_tokens == tokenizer.all_special_tokens
    assert built.encode("09+91=100\n") == tokenizer.encode("09+91=100\n")


def test_greedy_accuracy_is_imperfect_base(model: Any, tokenizer: Any) -> None:
    problems = _add_problems(100, seed=1234)
    completions = _completions(model, tokenizer, [p for p, _ in problems], do_sample=False)
    accuracy = sum(c == a for c, (_, a) in zip(completions, problems)) / len(problems)
    assert 0.3 <= accuracy <= 0.75
    # Answers are well formed even when wrong: three digits then eos.
    assert sum(len(c) == 3 and c.isdigit() for c in completions) >= 90


def test_left_padding_does_not_change_greedy_answers(model: Any, tokenizer: Any) -> None:
    prompts = [p for p, _ in _add_problems(8, seed=7)]
    # "5+5=" is shorter than the others, so it is the one row that gets left padding.
    batched = _completions(model, tokenizer, [*prompts, "5+5="], do_sample=False)
    alone = [_completions(model, tokenizer, [p], do_sample=False)[0] for p in [*prompts[:3], "5+5="]]
    assert [*batched[:3], batched[-1]] == alone


def _rebuild(out: Path, shipped: dict[str, Any]) -> dict[str, Any]:
    script = REPO_ROOT / "scripts" / "build" / "build_tiny_base.py"
    result = subprocess.run(
        [sys.executable, str(script), "--out", str(out), "--seed", str(shipped["seed"]),
         "--target-acc", str(shipped["target_acc"]), "--threads", str(shipped["threads"])],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "greedy add acc" in result.stdout
    info: dict[str, Any] = json.loads((out / "build_info.json").read_text())
    return info


SHIPPED_FILES = ("model.safetensors", "tokenizer.json", "tokenizer_config.json", "config.json")


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_build_script_rebuilds_deterministically_to_the_shipped_quality(tmp_path: Path) -> None:
    """Two rebuilds on one machine write the same bytes. The shipped bytes are not reproduced elsewhere, even
    with the same library versions (another machine's kernels round differently: the rebuild of docs/results/tiny-base-build.md on
    this project's machine took 250 steps, not 300), so a rebuild is held to the shipped quality instead:
    the same target reached, greedy accuracy within the target's band."""
    shipped = json.loads((tiny_base_path() / "build_info.json").read_text())
    info = _rebuild(tmp_path / "a", shipped)
    again = _rebuild(tmp_path / "b", shipped)
    for name in SHIPPED_FILES:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert (info["steps"], info["greedy_add_accuracy"]) == (again["steps"], again["greedy_add_accuracy"])
    assert info["reached_target"] is True and shipped["target_acc"] <= info["greedy_add_accuracy"] <= 0.8
    assert info["sampled_add_accuracy_t1"] < info["greedy_add_accuracy"]
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "a")
    assert sum(p.numel() for p in reloaded.parameters()) == shipped["parameters"]


def _build_script() -> Any:
    return load_script("build/build_tiny_base")


def test_build_options_leave_the_default_draws_unchanged_and_key_the_cache() -> None:
    build = _build_script()
    # The default mix draws exactly what the shipped base was trained on: the original two-digit sampler.
    gen_a, gen_b = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    ops = list(build.OP_MIX)
    op_ids = torch.multinomial(torch.tensor([build.OP_MIX[o] for o in ops]), 64, replacement=True, generator=gen_b)
    operands = torch.randint(0, 100, (64, 2), generator=gen_b).tolist()
    original = [make_problem(ops[i], a, b) for i, (a, b) in zip(op_ids.tolist(), operands)]
    assert build.sample_problems(64, gen_a, build.OP_MIX) == original
    assert build.seq_len(build.OP_MIX) == build.SEQ_LEN == 12
    # Three-digit problems fit: bos + "123+456=" + "0579" + eos.
    assert build.seq_len({"add": 0.5, "add3": 0.5}) == 14
    mixed = build.sample_problems(200, torch.Generator().manual_seed(0), {"add": 0.5, "add3": 0.5})
    assert {len(p) for p, _ in mixed} == {6, 8}
    assert build.parse_mix("add=0.2,sub3=0.8") == {"add": 0.2, "sub3": 0.8}
    for bad in ("add", "div=1", "add=-1"):
        with pytest.raises(Exception, match="expected|weights"):
            build.parse_mix(bad)
    key = tiny_bases.cache_key(["--op-mix", "add=0.5,sub=0.5", "--steps", "150"])
    assert key == tiny_bases.cache_key(["--op-mix", "add=0.5,sub=0.5", "--steps", "150"])
    assert key != tiny_bases.cache_key(["--op-mix", "add=0.5,sub=0.5", "--steps", "151"])


@pytest.mark.slow
def test_cached_base_is_built_once_outside_the_package(tmp_path: Path) -> None:
    options = ["--op-mix", "add=0.5,add3=0.5", "--eval-ops", "add3", "--steps", "2"]
    first = tiny_bases.cached_base(options, name="probe", cache_root=tmp_path)
    assert first.parent == tmp_path and first.name.startswith("probe-")
    info = json.loads((first / "build_info.json").read_text())
    assert info["fixed_steps"] == 2 and info["eval_ops"] == ["add3"] and "greedy_add3_accuracy" in info
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert tiny_bases.cached_base(options, name="probe", cache_root=tmp_path) == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp  # not rebuilt
    AutoModelForCausalLM.from_pretrained(first)
