"""Task sources: the interface, the ``arith`` source, prompt formatting and answer extraction."""

from __future__ import annotations

import hashlib
import random
import re
from collections import Counter
from dataclasses import replace

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from node.tasks import Task, TaskError, build_task_source
from node.tasks.arith import (
    ARITH_SYSTEM_PROMPT,
    ArithTaskSource,
    default_example,
    problem_order,
    score_digits,
)
from node.tasks.arith_format import DATASETS
from node.tasks.base import HELD_OUT_BUCKETS, settings_hash
from node.tasks.cache import LRUCache
from node.tasks.prompting import Example, check_examples, extract_answer, format_for_model

ARITH_DATASETS = ["add", "sub", "mul"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
NO_SYSTEM_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{{ raise_exception('no system role') }}{% endif %}"
    "{% for m in messages %}[{{ m['content'] }}]{% endfor %}"
)


def _arith(seed: int = 7, weights: list[float] | None = None) -> ArithTaskSource:
    source = build_task_source("arith", ARITH_DATASETS, weights, seed)
    assert isinstance(source, ArithTaskSource)
    return source


def _tiny_tokenizer(chat_template: str | None) -> PreTrainedTokenizerFast:
    vocab = {"[UNK]": 0, "<eos>": 1, "Question": 2}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", eos_token="<eos>")  # type: ignore[no-untyped-call]
    tokenizer.chat_template = chat_template
    return tokenizer


# ------------------------------------------------------------------------------------------ arith


def test_arith_ref_regenerates_identically_across_sources() -> None:
    first, second = _arith(), _arith()
    refs = first.sample(300, random.Random(1)) + first.eval_refs(60)
    assert {ref.dataset for ref in refs} == set(ARITH_DATASETS)
    for ref in refs:
        assert first.task(ref) == second.task(ref)


def test_arith_task_matches_its_operands() -> None:
    source = _arith()
    for ref in source.sample(200, random.Random(2)):
        task = source.task(ref)
        a, b = task.metadata["a"], task.metadata["b"]
        op = {"add": "+", "sub": "-", "mul": "*"}[ref.dataset]
        value = {"add": a + b, "sub": a - b, "mul": a * b}[ref.dataset]
        assert task.prompt == f"{a:02d}{op}{b:02d}="
        assert int(task.answer or "x") == value
        assert len(task.answer or "") == {"add": 3, "sub": 2, "mul": 4}[ref.dataset]


def test_arith_order_is_a_permutation_of_all_problems() -> None:
    add = problem_order(7, "add")
    sub = problem_order(7, "sub")
    assert len(add) == 10_000 and len(set(add)) == 10_000
    assert len(sub) == 5_050 and all(a >= b for a, b in sub) and len(set(sub)) == 5_050
    assert problem_order(8, "add") != add  # the seed decides the order
    assert problem_order(7, "add") == add


def test_arith_train_and_eval_are_disjoint_problems() -> None:
    source = _arith()
    eval_refs = source.eval_refs(600)
    train_refs = source.sample(3000, random.Random(3))
    assert all(source.is_held_out(source.task(ref)) for ref in eval_refs)
    assert not any(source.is_held_out(source.task(ref)) for ref in train_refs)
    eval_prompts = {source.task(ref).prompt for ref in eval_refs}
    train_prompts = {source.task(ref).prompt for ref in train_refs}
    assert len(eval_prompts) == 600
    assert not eval_prompts & train_prompts


def test_the_split_is_a_property_of_the_problem_the_same_for_every_seed() -> None:
    """Nodes with different seeds number the problems differently but hold out the same ones, so no peer's
    training task is a held-out task of ours; 3-digit datasets share the split of the 2-digit problems."""
    mine, peer = _arith(seed=1), _arith(seed=2)
    refs = [mine.make_ref("add", i) for i in range(10_000)]
    held = {(t.metadata["a"], t.metadata["b"]) for t in map(mine.task, refs) if mine.is_held_out(t)}
    peer_held = {(t.metadata["a"], t.metadata["b"]) for t in map(peer.task, (peer.make_ref("add", i)
                                                                            for i in range(10_000)))
                 if peer.is_held_out(t)}
    assert held == peer_held
    assert abs(len(held) / 10_000 - 1 / HELD_OUT_BUCKETS) < 0.01
    for ref in peer.sample(2000, random.Random(5)):  # everything a peer trains on is ours to train on too
        assert not mine.is_held_out(mine.task(ref))
    # The split depends on (op, a, b) only: hand-computed key "add/7/35".
    seven_35 = Task(ref=mine.make_ref("add", 0), prompt="07+35=", answer="042", metadata={"op": "add", "a": 7, "b": 35})
    digest = hashlib.sha256(b"held-out/arith/add/7/35").digest()
    assert mine.is_held_out(seven_35) == (int.from_bytes(digest[:8], "big") % HELD_OUT_BUCKETS == 0)
    three = build_task_source("arith", ["add3"], None, 9)
    wide = Task(ref=three.make_ref("add3", 0), prompt="007+035=", answer="0042", metadata={"op": "add", "a": 7, "b": 35})
    assert three.is_held_out(wide) == mine.is_held_out(seven_35)


def test_three_digit_datasets() -> None:
    source = build_task_source("arith", ["add3", "sub3"], None, 4)
    refs = source.sample(300, random.Random(0))
    assert {ref.dataset for ref in refs} == {"add3", "sub3"}
    for ref in refs:
        task = source.task(ref)
        a, b = task.metadata["a"], task.metadata["b"]
        assert 0 <= a <= 999 and 0 <= b <= 999
        if ref.dataset == "add3":
            assert task.prompt == f"{a:03d}+{b:03d}=" and task.answer == f"{a + b:04d}"
        else:
            assert a >= b and task.prompt == f"{a:03d}-{b:03d}=" and task.answer == f"{a - b:03d}"
    assert len({source.task(ref).prompt for ref in refs}) > 290  # a million problems: few repeats


def test_eval_refs_are_fixed_and_round_robin() -> None:
    source = _arith()
    refs = source.eval_refs(9)
    assert refs == _arith().eval_refs(9)
    assert refs[:4] == source.eval_refs(4)
    assert [ref.dataset for ref in refs] == ARITH_DATASETS * 3
    for dataset in ARITH_DATASETS:  # the first held-out indices, in order
        indices = [ref.index for ref in refs if ref.dataset == dataset]
        held = [i for i in range(indices[-1] + 1) if source.is_held_out(source.task(source.make_ref(dataset, i)))]
        assert indices == held[:3]


def test_sample_is_deterministic_and_respects_weights() -> None:
    source = _arith(weights=[0.6, 0.4, 0.0])
    refs = source.sample(4000, random.Random(11))
    assert refs == source.sample(4000, random.Random(11))
    assert refs != source.sample(4000, random.Random(12))
    counts = Counter(ref.dataset for ref in refs)
    assert counts["mul"] == 0
    assert abs(counts["add"] / 4000 - 0.6) < 0.03
    assert all(ref.seed == 7 and ref.config_hash == source.config_hash for ref in refs)


def test_peer_seed_regenerates_on_any_source() -> None:
    mine, peer = _arith(seed=1), _arith(seed=2)
    ref = peer.sample(1, random.Random(0))[0]
    assert ref.seed == 2
    assert mine.task(ref) == peer.task(ref)


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("042", 1.0),
        ("042\n", 1.0),
        ("  042  ", 1.0),
        ("\n 042\nmore text", 0.0),  # nothing may follow the answer
        ("042\n042", 0.0),
        ("42", 0.0),
        ("0420", 0.0),
        ("04 2", 0.0),
        ("043", 0.0),
        ("", 0.0),
        ("x\n042", 0.0),
    ],
)
def test_score_digits(completion: str, expected: float) -> None:
    assert score_digits("042", completion) == expected


def test_arith_score_uses_regenerated_answer_not_the_claimed_one() -> None:
    source = _arith()
    task = source.task(source.eval_refs(1)[0])
    answer = task.answer or ""
    assert source.score(task, answer + "\n") == 1.0
    forged = replace(task, answer="999")
    assert source.score(forged, "999") == 0.0
    assert source.score(forged, answer) == 1.0


def test_arith_format_prompt_is_raw_even_with_chat_template() -> None:
    source = _arith()
    task = source.task(source.eval_refs(1)[0])
    assert source.format_prompt(task, _tiny_tokenizer(CHAT_TEMPLATE)) == task.prompt
    assert source.format_prompt(task, None) == task.prompt
    never = build_task_source("arith", ARITH_DATASETS, None, 7, chat_template="never", examples=[("1+1=", "2")])
    assert never.format_prompt(task, _tiny_tokenizer(CHAT_TEMPLATE)) == task.prompt


def test_arith_under_always_is_chat_formatted_with_an_example_of_its_dataset() -> None:
    source = build_task_source("arith", ARITH_DATASETS, None, 7, chat_template="always")
    tokenizer = _tiny_tokenizer(CHAT_TEMPLATE)
    for dataset, example in [("add", "08+45=|053"), ("sub", "45-08=|37"), ("mul", "08*45=|0360")]:
        task = source.task(source.eval_refs(3)[ARITH_DATASETS.index(dataset)])
        user, assistant = example.split("|")
        assert source.format_prompt(task, tokenizer) == (
            f"<|system|>{ARITH_SYSTEM_PROMPT}\n<|user|>{user}\n<|assistant|>{assistant}\n"
            f"<|user|>{task.prompt}\n<|assistant|>")
    custom = build_task_source("arith", ["add"], None, 7, chat_template="always", system_prompt=None,
                               examples=[])
    task = custom.task(custom.eval_refs(1)[0])
    assert custom.format_prompt(task, tokenizer) == f"<|user|>{task.prompt}\n<|assistant|>"
    assert custom.config_hash == _arith().config_hash  # chat formatting still shares tasks with raw nodes
    with pytest.raises(TaskError, match="always"):
        custom.format_prompt(task, _tiny_tokenizer(None))


def test_arith_default_examples_are_training_problems() -> None:
    source = build_task_source("arith", list(DATASETS), None, 0)
    for dataset in DATASETS:
        example = default_example(dataset)
        op, digits = DATASETS[dataset]
        operands = re.fullmatch(r"(\d+)\D(\d+)=", example.user)
        assert operands is not None
        a, b = int(operands[1]), int(operands[2])
        task = Task(source.make_ref(dataset, 0), example.user, example.assistant, {"op": op, "a": a, "b": b})
        assert not source.is_held_out(task), dataset
        assert len(example.user) == 2 * digits + 2 and example.assistant.isdigit()


def test_arith_takes_no_dataset_configs() -> None:
    with pytest.raises(TaskError, match="takes no dataset_configs"):
        build_task_source("arith", ["add"], None, 0, dataset_configs={"add": {"digits": 3}})
    assert build_task_source("arith", ["add"], None, 0, dataset_configs={}).config_hash == _arith().config_hash


# ------------------------------------------------------------------------------------------ errors


def test_ref_checks_raise_task_error() -> None:
    source = _arith()
    good = source.eval_refs(1)[0]
    source.task(good)
    bad_refs = [
        replace(good, config_hash="000000000000"),
        replace(good, source="reasoning_gym"),
        replace(good, dataset="div"),
        replace(good, index=-1),
        replace(good, index=10_000),
        replace(good, dataset="sub", index=5_050),
    ]
    for ref in bad_refs:
        with pytest.raises(TaskError):
            source.task(ref)
    with pytest.raises(TaskError, match="config hash"):
        source.score(Task(bad_refs[0], "x", "1", {}), "1")


def test_bad_settings_raise_task_error() -> None:
    with pytest.raises(TaskError, match="unknown dataset"):
        build_task_source("arith", ["add", "div"], None, 0)
    with pytest.raises(TaskError, match="weights"):
        build_task_source("arith", ["add", "sub"], [1.0], 0)
    with pytest.raises(TaskError, match="weights"):
        build_task_source("arith", ["add", "sub"], [0.0, 0.0], 0)
    with pytest.raises(TaskError, match="unknown task source"):
        build_task_source("gsm8k", ["main"], None, 0)
    with pytest.raises(TaskError, match="bad options"):
        build_task_source("arith", ["add"], None, 0, temperature=1.0)
    with pytest.raises(TaskError, match="chat_template"):
        build_task_source("arith", ["add"], None, 0, chat_template="sometimes")
    with pytest.raises(TaskError, match="at least one"):
        build_task_source("arith", [], None, 0)


def test_config_hash_is_short_stable_and_seed_independent() -> None:
    assert _arith(seed=1).config_hash == _arith(seed=2).config_hash
    assert len(_arith().config_hash) == 12
    assert settings_hash({"b": 1, "a": [1, 2]}) == hashlib.sha256(b'{"a":[1,2],"b":1}').hexdigest()[:12]


# ------------------------------------------------------------------------------------------ prompting


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("think <answer>1</answer> more <answer> 2 </answer> tail", "2"),
        ("<ANSWER>x</ANSWER>", "x"),
        ("<answer>1 0\n0 1</answer>", "1 0\n0 1"),
        ("reasoning\n<answer> 17", "17"),
        ("so the Answer: 12\n", "12"),
        ("first line\nlast line\n\n", "last line"),
        ("   \n", None),
        ("", None),
    ],
)
def test_extract_answer(completion: str, expected: str | None) -> None:
    assert extract_answer(completion) == expected


def test_chat_template_formatting() -> None:
    tokenizer = _tiny_tokenizer(CHAT_TEMPLATE)
    text = format_for_model("What is 2+2?", tokenizer, "auto", "Be brief.")
    assert text == "<|system|>Be brief.\n<|user|>What is 2+2?\n<|assistant|>"
    assert format_for_model("Q?", tokenizer, "always", None) == "<|user|>Q?\n<|assistant|>"
    assert format_for_model("Q?", tokenizer, "never", "S") == "Question: Q?\nAnswer:"


def test_template_without_system_role_gets_it_merged() -> None:
    tokenizer = _tiny_tokenizer(NO_SYSTEM_TEMPLATE)
    assert format_for_model("Q?", tokenizer, "auto", "S.") == "[S.\n\nQ?]"
    shots = [Example("1+1?", "2")]
    assert format_for_model("Q?", tokenizer, "auto", "S.", shots) == "[S.\n\n1+1?][2][Q?]"


def test_examples_come_before_the_question_in_chat_and_plain_prompts() -> None:
    shots = check_examples([("What is 3 + 4?", "3 + 4 = 7.\n<answer>7</answer>"), {"user": "U", "assistant": "A"}])
    chat = format_for_model("Q?", _tiny_tokenizer(CHAT_TEMPLATE), "auto", None, shots)
    assert chat == ("<|user|>What is 3 + 4?\n<|assistant|>3 + 4 = 7.\n<answer>7</answer>\n<|user|>U\n<|assistant|>A\n"
                    "<|user|>Q?\n<|assistant|>")
    plain = format_for_model("Q?", _tiny_tokenizer(None), "auto", "S", shots)
    assert plain == ("Question: What is 3 + 4?\nAnswer: 3 + 4 = 7.\n<answer>7</answer>\n\nQuestion: U\nAnswer: A\n\n"
                     "Question: Q?\nAnswer:")
    for bad in (["just text"], [("q",)], [("q", 1)], [{"user": "q"}], [(" ", "a")]):
        with pytest.raises(TaskError, match="prompt example 0"):
            check_examples(bad)


def test_a_template_that_rejects_assistant_turns_names_the_examples() -> None:
    only_users = ("{% for m in messages %}{% if m['role'] == 'assistant' %}{{ raise_exception('no') }}{% endif %}"
                  "{{ m['content'] }}{% endfor %}")
    with pytest.raises(TaskError, match="tasks.prompt.examples"):
        format_for_model("Q?", _tiny_tokenizer(only_users), "auto", None, [Example("U", "A")])


def test_plain_formatting_without_chat_template() -> None:
    tokenizer = _tiny_tokenizer(None)
    assert format_for_model("Q?", tokenizer, "auto", "S") == "Question: Q?\nAnswer:"
    assert format_for_model("Q?", None, "auto", "S") == "Question: Q?\nAnswer:"
    with pytest.raises(TaskError, match="always"):
        format_for_model("Q?", tokenizer, "always", "S")


def test_lru_cache_evicts_least_recently_used() -> None:
    cache: LRUCache[str, int] = LRUCache(2)
    assert cache.get_or_create("a", lambda: 1) == 1
    assert cache.get_or_create("b", lambda: 2) == 2
    assert cache.get_or_create("a", lambda: -1) == 1  # hit, "a" is now the most recent
    assert cache.get_or_create("c", lambda: 3) == 3  # evicts "b"
    assert cache.get_or_create("b", lambda: 4) == 4
    assert (cache.hits, cache.misses, len(cache)) == (1, 4, 2)
