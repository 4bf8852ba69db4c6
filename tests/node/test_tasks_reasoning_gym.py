"""The ``reasoning_gym`` task source: regeneration, splits, scoring with reasoning-gym's own scorers."""

from __future__ import annotations

import contextlib
import copy
import gc
import json
import os
import random
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from node.tasks import Task, TaskError, build_task_source
from node.tasks.arith import ArithTaskSource
from node.tasks.base import TaskSource
from node.tasks.prompting import ANSWER_INSTRUCTION
from node.tasks.reasoning_gym import (
    ADMITTED_DATASETS,
    EASY_DATASETS,
    INDEX_LIMIT,
    SAPO_DATASETS,
    ReasoningGymTaskSource,
    dataset_seed,
)
from protocol.taskref import TaskRef
from tests.node.test_tasks import CHAT_TEMPLATE, _tiny_tokenizer

WITH_ANSWER = [d for d in ADMITTED_DATASETS if d != "propositional_logic"]
PER_DATASET = 12


def _rg(seed: int = 5, **options: Any) -> ReasoningGymTaskSource:
    source = build_task_source("reasoning_gym", list(ADMITTED_DATASETS), None, seed, **options)
    assert isinstance(source, ReasoningGymTaskSource)
    return source


@pytest.fixture(scope="module")
def rg_source() -> ReasoningGymTaskSource:
    return _rg()


def _refs(source: TaskSource, dataset: str, n: int = PER_DATASET) -> list[TaskRef]:
    return [ref for ref in source.eval_refs(n * len(source.datasets)) if ref.dataset == dataset]


def _as_json(task: Task) -> str:
    body = {"ref": task.ref.key(), "prompt": task.prompt, "answer": task.answer, "metadata": task.metadata}
    return json.dumps(body, sort_keys=True, default=repr)


# Run in a fresh interpreter with another hash seed: prints the JSON of every given ref's task.
_CHILD = """
import json, sys
from node.tasks import build_task_source
from protocol.taskref import TaskRef
from tests.node.test_tasks import CHAT_TEMPLATE, _tiny_tokenizer
sources = {name: build_task_source(name, datasets, None, 0) for name, datasets in json.loads(sys.argv[1]).items()}
out = []
for fields in json.loads(sys.stdin.read()):
    task = sources[fields[0]].task(TaskRef(*fields))
    body = {"ref": task.ref.key(), "prompt": task.prompt, "answer": task.answer, "metadata": task.metadata}
    out.append(json.dumps(body, sort_keys=True, default=repr))
print(json.dumps(out))
"""


def test_regeneration_identical_across_sources_and_processes(rg_source: ReasoningGymTaskSource) -> None:
    other = _rg(seed=99)  # another node: its own seed, same settings
    arith = build_task_source("arith", ["add", "sub", "mul"], None, 5)
    refs = rg_source.sample(120, random.Random(0)) + rg_source.eval_refs(2 * len(ADMITTED_DATASETS))
    refs += arith.sample(6, random.Random(0)) + arith.eval_refs(3)
    assert {ref.dataset for ref in refs} >= set(ADMITTED_DATASETS)
    tasks = [(rg_source if ref.source == "reasoning_gym" else arith).task(ref) for ref in refs]
    for ref, task in zip(refs, tasks):
        if ref.source == "reasoning_gym":
            assert other.task(ref) == task

    datasets = {"reasoning_gym": list(ADMITTED_DATASETS), "arith": ["add", "sub", "mul"]}
    env = {**os.environ, "PYTHONHASHSEED": "12345", "OMP_NUM_THREADS": "1"}
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(datasets)],
        input=json.dumps([[r.source, r.dataset, r.config_hash, r.seed, r.index] for r in refs]),
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    assert json.loads(child.stdout) == [_as_json(task) for task in tasks]


def test_the_admitted_datasets_are_sapos_nine_and_the_easy_ones() -> None:
    assert len(SAPO_DATASETS) == 9 and "basic_arithmetic" in SAPO_DATASETS and "gcd" not in SAPO_DATASETS
    assert ADMITTED_DATASETS == SAPO_DATASETS + EASY_DATASETS and not set(SAPO_DATASETS) & set(EASY_DATASETS)
    assert ReasoningGymTaskSource.known_datasets == ADMITTED_DATASETS


def test_far_index_is_generated_directly_and_cached(rg_source: ReasoningGymTaskSource) -> None:
    ref = rg_source.make_ref("basic_arithmetic", INDEX_LIMIT - 1)
    rg_source.task(replace(ref, index=0))  # the dataset object built first (about 1 s of CPU): not what is timed
    started = time.thread_time()  # CPU time of this thread: neither a busy machine nor another test's threads count
    first = rg_source.task(ref)
    assert time.thread_time() - started < 1.0  # one item, not the 2**32 - 1 before it
    hits = rg_source._entries.hits
    assert rg_source.task(ref) == first
    assert rg_source._entries.hits == hits + 1
    with pytest.raises(TaskError, match="outside"):
        rg_source.task(replace(ref, index=INDEX_LIMIT))


def test_prompt_asks_for_answer_tags(rg_source: ReasoningGymTaskSource) -> None:
    for ref in rg_source.eval_refs(len(ADMITTED_DATASETS)):
        task = rg_source.task(ref)
        assert task.prompt.endswith(ANSWER_INSTRUCTION)
        assert task.metadata["source_dataset"] == ref.dataset


def test_train_and_eval_splits_are_disjoint(rg_source: ReasoningGymTaskSource) -> None:
    eval_refs = rg_source.eval_refs(90)
    train_refs = rg_source.sample(400, random.Random(4))
    assert all(rg_source.is_held_out(rg_source.task(ref)) for ref in eval_refs)
    assert not any(rg_source.is_held_out(rg_source.task(ref)) for ref in train_refs)
    eval_questions = {rg_source.content_key(rg_source.task(ref)) for ref in eval_refs}
    assert not eval_questions & {rg_source.content_key(rg_source.task(ref)) for ref in train_refs}
    assert eval_refs == _rg().eval_refs(90)


def test_the_split_follows_the_question_text_not_the_seed(rg_source: ReasoningGymTaskSource) -> None:
    other_seed = _rg(seed=rg_source.seed + 1)
    for ref in other_seed.eval_refs(18) + other_seed.sample(40, random.Random(1)):
        task = rg_source.task(ref)  # a peer's ref, regenerated here
        assert rg_source.is_held_out(task) == other_seed.is_held_out(other_seed.task(ref))
        question = task.prompt.removesuffix(ANSWER_INSTRUCTION).rstrip()
        assert rg_source.content_key(task) == f"{ref.dataset}/{question}"


def test_sample_deterministic_and_weighted() -> None:
    source = build_task_source("reasoning_gym", ["basic_arithmetic", "bf"], [3.0, 1.0], 1)
    refs = source.sample(400, random.Random(8))
    assert refs == source.sample(400, random.Random(8))
    share = sum(ref.dataset == "basic_arithmetic" for ref in refs) / len(refs)
    assert 0.68 < share < 0.82


@pytest.mark.parametrize("dataset", WITH_ANSWER)
def test_reference_answer_scores_one_and_wrong_less(rg_source: ReasoningGymTaskSource, dataset: str) -> None:
    for ref in _refs(rg_source, dataset):
        task = rg_source.task(ref)
        assert task.answer
        assert rg_source.score(task, f"Let me work it out.\n<answer>{task.answer}</answer>") == 1.0
        assert rg_source.score(task, f"<answer>{task.answer}") == 1.0  # generation stopped at the tag
        wrong = ["<answer>definitely wrong</answer>", "<answer></answer>", ""]
        with contextlib.suppress(ValueError):
            wrong.append(f"<answer>{float(task.answer) + 1}</answer>")
        for completion in wrong:
            assert 0.0 <= rg_source.score(task, completion) < 1.0, completion


def _library_score(dataset: Any, answer: str, entry: dict[str, Any]) -> float:
    try:
        value = float(dataset.score_answer(answer, copy.deepcopy(entry)))
    except Exception:
        return 0.0
    return min(1.0, max(0.0, value))


@pytest.mark.parametrize("dataset", ADMITTED_DATASETS)
def test_tasks_and_scores_agree_with_the_library(rg_source: ReasoningGymTaskSource, dataset: str) -> None:
    import reasoning_gym

    library = reasoning_gym.create_dataset(dataset, seed=dataset_seed(rg_source.seed, dataset), size=INDEX_LIMIT)
    for ref in _refs(rg_source, dataset, 4):
        task, entry = rg_source.task(ref), library[ref.index]
        assert task.prompt == f"{str(entry['question']).rstrip()}\n\n{ANSWER_INSTRUCTION}"
        assert task.answer == (None if entry.get("answer") is None else str(entry["answer"]))
        answers = ["0", "1 2", "[1, 2]", "Yes"] + ([task.answer, task.answer + "0"] if task.answer else [])
        for answer in answers:
            guarded = dataset in ("binary_matrix", "coin_flip") and answer == "Yes"  # guards refuse words
            expected = 0.0 if guarded else _library_score(library, answer, entry)
            assert rg_source.score(task, f"<answer>{answer}</answer>") == expected, answer


def _adversarial_answers(reference: str) -> list[str]:
    n = 4000
    return ["1" * n, "a" * n, "[" * n, "[" * (n // 2) + "]" * (n // 2), "1e999999999", "-1e-999999999",
            "9" * (n // 2) + "/" + "7" * (n // 2 - 1), ", " * (n // 2), "[" + ",".join(["1e308"] * 600) + "]",
            (reference + " ") * (n // (len(reference) + 1)), "٣" * n, "¬(" * (n // 2)]


@pytest.mark.parametrize("dataset", EASY_DATASETS)
def test_easy_scorers_take_bounded_time_on_adversarial_answers(
    rg_source: ReasoningGymTaskSource, dataset: str
) -> None:
    task = rg_source.task(_refs(rg_source, dataset, 1)[0])
    for answer in _adversarial_answers(task.answer or "x"):
        gc.collect()  # a collection of the whole test session's heap would land in the call timed
        gc.disable()
        try:
            started = time.thread_time()  # this thread's CPU time (the scorer runs in it): what a blow-up costs,
            score = rg_source.score(task, f"<answer>{answer}</answer>")  # whatever the load or other threads
            spent = time.thread_time() - started
        finally:
            gc.enable()
        assert spent < 0.25, answer[:40]
        assert 0.0 <= score < 1.0, answer[:40]


def test_coin_flip_guard_keeps_exponents_small_but_scores_real_answers() -> None:
    settings = {"coin_flip": {"min_trials": 15, "max_trials": 15, "allow_at_least": False}}
    source = build_task_source("reasoning_gym", ["coin_flip"], None, 0, dataset_configs=settings)
    tasks = [source.task(source.make_ref("coin_flip", i)) for i in range(100)]
    tiny = [t for t in tasks if "e-" in (t.answer or "")]
    assert tiny  # exactly 0 or 15 heads in 15 flips: 3.051757812e-05
    for task in tiny[:3]:
        assert source.score(task, f"<answer>{task.answer}</answer>") == 1.0
        assert source.score(task, "<answer>1/32768</answer>") == 1.0  # a fraction is the same number
    started = time.thread_time()  # this thread's CPU time: the scorer runs in it
    assert source.score(tasks[0], "<answer>1e999999999</answer>") == 0.0  # Fraction() would expand 10**999999999
    assert source.score(tasks[0], "<answer>1e-99999/3</answer>") == 0.0
    assert time.thread_time() - started < 0.25


def test_number_sorting_scorer_never_evals_peer_text(rg_source: ReasoningGymTaskSource, tmp_path: Path) -> None:
    task = rg_source.task(_refs(rg_source, "number_sorting", 1)[0])
    marker = tmp_path / "pwned"
    for code in (f"[open({str(marker)!r}, 'w')]", f"__import__('pathlib').Path({str(marker)!r}).touch()"):
        assert rg_source.score(task, f"<answer>{code}</answer>") == 0.0
    assert not marker.exists()
    assert rg_source.score(task, f"<answer>{task.answer}</answer>") == 1.0


def test_binary_matrix_scorer_never_evals_peer_text(
    rg_source: ReasoningGymTaskSource, tmp_path: Path
) -> None:
    task = rg_source.task(_refs(rg_source, "binary_matrix", 1)[0])
    marker = tmp_path / "pwned"
    assert rg_source.score(task, f"<answer>open({str(marker)!r}, 'w')</answer>") == 0.0
    assert not marker.exists()
    rows = [[int(x) for x in row.split()] for row in (task.answer or "").split("\n")]
    assert rg_source.score(task, f"<answer>{rows}</answer>") == 0.1  # its partial credit for a list literal


def test_propositional_logic_scorer_checks_the_conclusion(rg_source: ReasoningGymTaskSource) -> None:
    full_marks = 0
    refs = _refs(rg_source, "propositional_logic", 20)
    for ref in refs:
        task = rg_source.task(ref)
        assert task.answer is None
        # The conjunction of all premises follows from them; it is non-trivial unless they are tautologies.
        conjunction = " ∧ ".join(f"({p})" for p in task.metadata["premises"])
        score = rg_source.score(task, f"<answer>{conjunction}</answer>")
        assert score >= 0.25
        full_marks += score == 1.0
        for garbage in ["<answer>Z ∧ ¬Z</answer>", "<answer>(((</answer>", "no idea", ""]:
            assert rg_source.score(task, garbage) < 1.0
    assert full_marks >= 18


def test_propositional_logic_rejects_a_non_consequence(rg_source: ReasoningGymTaskSource) -> None:
    checked = 0
    for ref in _refs(rg_source, "propositional_logic", 20):
        task = rg_source.task(ref)
        premises = task.metadata["premises"]
        # "¬(premise 1)" cannot follow unless the premises are contradictory (then anything follows).
        negation = f"¬({premises[0]})"
        if rg_source.score(task, "<answer>(P ∧ ¬P)</answer>") == 1.0:
            continue  # contradictory premises
        assert rg_source.score(task, f"<answer>{negation}</answer>") < 1.0
        checked += 1
    assert checked >= 10


def test_config_hash_covers_settings_and_version(monkeypatch: pytest.MonkeyPatch) -> None:
    base = _rg().config_hash
    assert _rg(seed=1).config_hash == base
    assert _rg(chat_template="never").config_hash == base  # formatting does not change the task
    assert _rg(system_prompt=None, examples=[("What is 3 + 4?", "<answer>7</answer>")]).config_hash == base
    assert _rg(dataset_configs={"bf": {"difficulty": 2}}).config_hash != base
    assert _rg(max_prompt_chars=500).config_hash != base
    monkeypatch.setattr("node.tasks.reasoning_gym.reasoning_gym_version", lambda: "9.9.9")
    assert _rg().config_hash != base


def test_dataset_config_overrides_apply_and_are_checked() -> None:
    source = _rg(dataset_configs={"bf": {"difficulty": 2}})
    ref = source.eval_refs(len(ADMITTED_DATASETS))[ADMITTED_DATASETS.index("bf")]
    assert source.task(ref).metadata["difficulty"] == {"difficulty": 2}
    with pytest.raises(TaskError, match="dataset_configs"):
        _rg(dataset_configs={"bf": {"difficulty": 9}})
    with pytest.raises(TaskError, match="dataset_configs"):
        _rg(dataset_configs={"bf": {"seed": 1}})
    with pytest.raises(TaskError, match="dataset_configs"):
        _rg(dataset_configs={"gsm8k": {}})
    with pytest.raises(TaskError, match=r"dataset_configs.spell_backward must not set \['data_file'\]"):
        _rg(dataset_configs={"spell_backward": {"data_file": "/etc/hostname"}})
    with pytest.raises(TaskError, match=r"unknown setting\(s\) \['max_val'\]; gcd takes .*'max_value'"):
        _rg(dataset_configs={"gcd": {"max_val": 50}})
    with pytest.raises(TaskError, match="must map setting names"):
        _rg(dataset_configs={"gcd": 50})  # type: ignore[dict-item]


def test_easy_dataset_configs_make_easy_tasks() -> None:
    source = _rg(dataset_configs={"gcd": {"max_value": 50}, "spell_backward": {"max_word_len": 5},
                                  "leg_counting": {"min_animals": 1, "max_animals": 2, "max_instances": 3}})
    for ref in _refs(source, "gcd", 8):
        assert max(source.task(ref).metadata["numbers"]) <= 50
    for ref in _refs(source, "spell_backward", 8):
        assert len(source.task(ref).metadata["word"]) <= 5
    for ref in _refs(source, "leg_counting", 8):
        assert 1 <= len(source.task(ref).metadata["animals"]) <= 2


def test_mismatched_refs_raise(rg_source: ReasoningGymTaskSource) -> None:
    ref = rg_source.eval_refs(1)[0]
    with pytest.raises(TaskError, match="config hash"):
        rg_source.task(replace(ref, config_hash="ffffffffffff"))
    with pytest.raises(TaskError, match="unknown dataset"):
        rg_source.task(replace(ref, dataset="gsm_symbolic"))
    with pytest.raises(TaskError, match="source"):
        rg_source.task(replace(ref, source="arith"))
    arith = build_task_source("arith", ["add"], None, 0)
    assert isinstance(arith, ArithTaskSource)
    with pytest.raises(TaskError):
        arith.task(ref)


def test_prompt_cap_skips_long_tasks() -> None:
    capped = build_task_source("reasoning_gym", ["arc_1d"], None, 0, max_prompt_chars=800)
    uncapped = build_task_source("reasoning_gym", ["arc_1d"], None, 0)
    refs = capped.eval_refs(20) + capped.sample(20, random.Random(0))
    assert all(len(capped.task(ref).prompt) <= 800 for ref in refs)
    long_refs = [uncapped.make_ref("arc_1d", i) for i in range(100)]
    long_refs = [ref for ref in long_refs if len(uncapped.task(ref).prompt) > 800]
    assert long_refs  # default arc_1d prompts run to about 900 characters
    with pytest.raises(TaskError, match="max_prompt_chars"):
        capped.task(replace(long_refs[0], config_hash=capped.config_hash))


def test_format_prompt_modes(rg_source: ReasoningGymTaskSource) -> None:
    task = rg_source.task(rg_source.eval_refs(1)[0])
    chat = rg_source.format_prompt(task, _tiny_tokenizer(CHAT_TEMPLATE))
    assert chat.startswith("<|system|>") and f"<|user|>{task.prompt}\n<|assistant|>" in chat
    assert rg_source.format_prompt(task, _tiny_tokenizer(None)) == f"Question: {task.prompt}\nAnswer:"
    never = _rg(chat_template="never")
    assert never.format_prompt(task, _tiny_tokenizer(CHAT_TEMPLATE)) == f"Question: {task.prompt}\nAnswer:"
    quiet = _rg(system_prompt=None)
    assert (
        quiet.format_prompt(task, _tiny_tokenizer(CHAT_TEMPLATE)) == f"<|user|>{task.prompt}\n<|assistant|>"
    )


def test_format_prompt_with_worked_examples(rg_source: ReasoningGymTaskSource) -> None:
    task = rg_source.task(rg_source.eval_refs(1)[0])
    shown = _rg(system_prompt="Be brief.", examples=[{"user": "What is 3 + 4?", "assistant": "<answer>7</answer>"}])
    assert shown.format_prompt(task, _tiny_tokenizer(CHAT_TEMPLATE)) == (
        "<|system|>Be brief.\n<|user|>What is 3 + 4?\n<|assistant|><answer>7</answer>\n"
        f"<|user|>{task.prompt}\n<|assistant|>")
    assert shown.format_prompt(task, _tiny_tokenizer(None)) == (
        f"Question: What is 3 + 4?\nAnswer: <answer>7</answer>\n\nQuestion: {task.prompt}\nAnswer:")
    with pytest.raises(TaskError, match="prompt example 0"):
        _rg(examples=[("What is 3 + 4?", "")])


def test_the_answer_instruction_the_model_sees_is_the_nodes_own(rg_source: ReasoningGymTaskSource) -> None:
    task = rg_source.task(rg_source.eval_refs(1)[0])
    question = task.prompt.removesuffix(ANSWER_INSTRUCTION).rstrip()
    plain = _tiny_tokenizer(None)
    short = _rg(answer_instruction="Answer inside <answer></answer> tags.")
    assert short.format_prompt(task, plain) == f"Question: {question}\n\nAnswer inside <answer></answer> tags.\nAnswer:"
    assert _rg(answer_instruction=None).format_prompt(task, plain) == f"Question: {question}\nAnswer:"
    assert _rg(answer_instruction="").format_prompt(task, plain) == f"Question: {question}\nAnswer:"
    assert short.task(task.ref) == task and short.config_hash == rg_source.config_hash  # the task is unchanged
