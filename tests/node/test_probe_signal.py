"""``scripts/experiments/probe_signal.py``: its measures on hand-made groups, and the configs its prompt variants give."""

from __future__ import annotations

import argparse

from node.tasks import Task
from node.tasks.prompting import DEFAULT_SYSTEM_PROMPT
from node.train.groups import TrainGroup
from protocol.taskref import TaskRef
from tests.scripts import load_script


def _probe():
    return load_script("experiments/probe_signal")


def _group(rewards: list[float], texts: list[str]):
    ref = TaskRef("reasoning_gym", "gcd", "0" * 12, 0, 0)
    group = TrainGroup(key=ref.key(), dataset="gcd", peer_id="", epoch=0, prompt_ids=[1], completions=[[2]] * len(rewards),
                       anchor_logprobs=[[-1.0]] * len(rewards), rewards=rewards)
    return _probe().SampledGroup(task=Task(ref, "q", "4", {}), group=group, texts=texts,
                                 finish_reasons=["eos"] * len(rewards))


def test_summary_counts_signal_exact_signal_and_tags():
    greedy = [_group([1.0], ["<answer>4</answer>"]), _group([0.25], ["4 is it"]), _group([0.0], ["no"])]
    sampled = [
        _group([1.0, 0.0], ["<answer>4</answer>", "x"]),  # signal, exact signal
        _group([0.25, 0.0], ["<ANSWER>4 is it</answer>", "y"]),  # signal from partial credit only
        _group([0.0, 0.0], ["z", "<answer>5"]),  # no signal
    ]
    r = _probe().summarize(greedy, sampled)
    assert (r["tasks"], r["groups"], r["groups_with_signal"], r["groups_with_exact_signal"]) == (3, 3, 2, 1)
    assert r["greedy_reward"] == 1.25 / 3 and r["greedy_exact"] == 1 / 3 and r["greedy_tagged"] == 1 / 3
    assert r["sampled_reward"] == 1.25 / 6 and r["sampled_exact"] == 1 / 6 and r["tagged"] == 3 / 6


def test_variants_become_the_nodes_prompt_settings():
    probe = _probe()
    args = argparse.Namespace(model="smollm2-135m", dtype="float32", seed=0, source="reasoning_gym",
                              datasets="gcd,syllogism", backend="hf", max_new_tokens=64, samples=8,
                              dataset_configs="easy", overrides=[])
    options = {v: probe.node_config(args, v).tasks.source_options("auto") for v in probe.VARIANTS}
    example = [("What is 3 + 4?", "3 + 4 = 7.\n<answer>7</answer>")]
    assert options["none"] == {"chat_template": "auto", "system_prompt": None, "examples": [],
                               "dataset_configs": {"gcd": {"max_value": 50}}}
    assert "system_prompt" not in options["default"] and "examples" not in options["default"]
    assert options["example"]["examples"] == example and "system_prompt" not in options["example"]
    assert options["example-nosys"]["examples"] == example and options["example-nosys"]["system_prompt"] is None
    short = "Give your final answer inside <answer></answer> tags."
    assert options["example-short"]["answer_instruction"] == short and options["example-short"]["examples"] == example
    assert "answer_instruction" not in options["example"]
    source = probe.build_source(probe.node_config(args, "default"))
    assert source.system_prompt == DEFAULT_SYSTEM_PROMPT and source.dataset_configs == {"gcd": {"max_value": 50}}
