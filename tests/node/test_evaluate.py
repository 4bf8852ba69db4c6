"""``swarm-node eval``: the numbers the node logged for its own held-out evaluation at a step, from the
checkpoint of that step; the same for a merged export by --model; mistakes are one line each."""

from __future__ import annotations

import dataclasses
import json

import pytest

from node.api.metrics import read_metrics
from node.cli import main
from node.cli.export import export_run
from node.run.saved import open_run


def _eval(capsys, *argv: str) -> dict:
    assert main(["eval", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_eval_of_a_checkpoint_gives_the_nodes_own_evaluation_at_that_step(trained_run, capsys):
    logged = {r["step"]: r["eval_accuracy"] for r in read_metrics(trained_run.run_dir / "metrics.jsonl")
              if "eval_accuracy" in r}
    assert sorted(logged) == [2, 4]
    for step in (2, 4):
        result = _eval(capsys, "--run-dir", str(trained_run.run_dir), "--step", str(step))
        assert result["step"] == step and result["tasks"] == trained_run.cfg.tasks.eval_size
        assert result["datasets"]["all"]["greedy"]["reward"] == logged[step]
        assert result["datasets"]["add"]["greedy"]["accuracy"] == logged[step]  # 0/1 scores: the same
        sampled = result["datasets"]["all"]["sampled"]
        assert 0 <= sampled["accuracy"] <= 1 and sampled["accuracy"] == sampled["reward"]
    assert _eval(capsys, "--run-dir", str(trained_run.run_dir))["step"] == 4  # default: the newest


def test_eval_of_a_merged_export_matches_its_checkpoint(trained_run, tmp_path, capsys):
    export_run(open_run(trained_run.run_dir), tmp_path / "merged", merged=True)
    n = str(trained_run.cfg.tasks.eval_size)
    of_run = _eval(capsys, "--run-dir", str(trained_run.run_dir), "--seed", "3")
    of_model = _eval(capsys, "--model", str(tmp_path / "merged"), "--n", n, "--max-new-tokens",
                     str(trained_run.cfg.generation.max_new_tokens), "--seed", "3")
    assert of_model["datasets"]["all"]["greedy"] == of_run["datasets"]["all"]["greedy"]


def test_the_table_names_each_dataset_and_the_step(trained_run, capsys):
    assert main(["eval", "--run-dir", str(trained_run.run_dir), "--step", "2", "--no-progress", "--n", "8",
                 "--datasets", "add,sub"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "at step 2" in out[0] and out[1].split()[:3] == ["dataset", "tasks", "greedy"]
    assert [line.split()[:2] for line in out[2:]] == [["add", "4"], ["sub", "4"], ["all", "8"]]


@pytest.mark.parametrize(("argv", "expected"), [
    (["--run-dir", "{tmp}"], "is not a run dir"),
    (["--run-dir", "{run}", "--step", "3"], "--step 3"),
    (["--run-dir", "{run}", "--datasets", "nope"], "--datasets: unknown dataset(s) ['nope']"),
    (["--model", "{tmp}/no-such-model"], "model.name_or_path"),
    (["--model", "tiny-base", "--step", "2"], "--step needs --run-dir"),
    (["--run-dir", "{run}", "-c", "configs/tiny-silo.yaml"], "--config goes with --model"),
])
def test_eval_mistakes_are_one_line_errors(trained_run, tmp_path, capsys, argv, expected):
    args = [a.format(tmp=tmp_path, run=trained_run.run_dir) for a in argv]
    assert main(["eval", *args]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("swarm-node: error: ") and expected in err[0], err


def test_the_plan_of_a_run_has_its_prompt_and_dataset_settings() -> None:
    """A run with reasoning-gym dataset settings and a worked example in the chat is evaluated on the tasks and
    prompts its node evaluated on while training (the same source options), not on the library's defaults."""
    from node.cli.evaluate import EvalPlan, build_tasks
    from node.config import load_config
    from node.tasks import build_task_source

    cfg = load_config("configs/smollm2-silo.yaml", ["tasks.eval_size=6"])
    plan = EvalPlan.of_run(cfg, datasets=None, n=None, samples=1, sample_seed=0)
    t = cfg.tasks
    node_source = build_task_source(t.source, list(t.datasets), t.weights, cfg.seed,
                                    **t.source_options(cfg.model.chat_template))
    node_tasks = [node_source.task(r) for r in node_source.eval_refs(t.eval_size)]
    source, tasks = build_tasks(plan)
    assert source.config_hash == node_source.config_hash and tasks == node_tasks
    _, plain = build_tasks(dataclasses.replace(plan, options={}))
    assert plain != tasks  # without the settings: other tasks and prompts
    only = EvalPlan.of_run(cfg, datasets=["gcd"], n=2, samples=1, sample_seed=0)
    assert only.options["dataset_configs"] == {"gcd": {"max_value": 50}}


def test_a_base_model_is_evaluated_with_a_configs_settings(capsys) -> None:
    """With -c, the config's tasks (and its tasks.eval_size unless --n says otherwise), not the built-in ones."""
    result = _eval(capsys, "--model", "tiny-base", "-c", "configs/tiny-silo.yaml", "--n", "4", "--no-progress")
    assert result["tasks"] == 4 and set(result["datasets"]) == {"add", "all"}
    from node.config import load_config

    size = load_config("configs/tiny-silo.yaml").tasks.eval_size
    assert _eval(capsys, "--model", "tiny-base", "-c", "configs/tiny-silo.yaml", "--no-progress")["tasks"] == size
