from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from node.config import ConfigError, NodeConfig, apply_overrides, load_config


@pytest.mark.parametrize("path", sorted(str(p) for p in Path("configs").glob("*.yaml")))
def test_every_shipped_config_validates(path):
    if Path(path).name == "host.yaml":  # swarm-node host's own settings, no model
        from node.config import load_config_data
        from node.config.host import validate_host_config

        validate_host_config(load_config_data(path, []))
    else:
        load_config(path)


def test_tiny_silo_defaults():
    cfg = load_config("configs/tiny-silo.yaml")
    assert cfg.model.name_or_path == "tiny-base"
    assert cfg.train.loss == "topr" and cfg.train.advantage == "rloo"


def test_overrides_are_typed_and_nested():
    cfg = load_config("configs/tiny-silo.yaml", ["train.steps=150", "seed=3", "tasks.datasets=[add, sub]"])
    assert cfg.train.steps == 150 and cfg.seed == 3
    assert cfg.tasks.datasets == ["add", "sub"]


def test_override_creates_missing_sections():
    assert apply_overrides({}, ["a.b.c=1"]) == {"a": {"b": {"c": 1}}}


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("train.loss=ppo", "train.loss"),
        ("train.steps=-1", "train.steps"),
        ("train.stpes=3", "train.stpes"),
        ("adapter.remix.k=9", "adapter.remix"),
        ("generation.top_p=1.5", "generation.top_p"),
        ("train.micro_batch_size=fast", "train.micro_batch_size"),
        ("train.logits_memory_mb=0", "train.logits_memory_mb"),
    ],
)
def test_bad_values_name_the_field(override, field):
    with pytest.raises(ConfigError) as err:
        load_config("configs/tiny-silo.yaml", [override])
    assert field in str(err.value)
    assert "\n" not in str(err.value)


def test_auto_training_sizes_follow_the_device():
    """``auto``: 16 rows a pass and 1,024 MB of logits on the CPU; on a GPU 256 rows and 1/16 of its memory
    (an 80 GB H100: 81,559 MB -> 5,097), never under the CPU's budget; a number given is kept everywhere."""
    train = load_config("configs/smollm2-silo.yaml").train
    assert train.micro_batch_size == "auto" and train.logits_memory_mb == "auto"
    assert (train.micro_batch_rows("cpu"), train.logits_budget_mb("cpu", None)) == (16, 1024)
    assert (train.micro_batch_rows("cuda"), train.logits_budget_mb("cuda", 81559)) == (256, 5097)
    assert train.logits_budget_mb("cuda", 8192) == 1024 and train.logits_budget_mb("cuda", None) == 1024
    fixed = load_config("configs/smollm2-silo.yaml", ["train.micro_batch_size=8", "train.logits_memory_mb=300"]).train
    assert (fixed.micro_batch_rows("cuda"), fixed.logits_budget_mb("cuda", 81559)) == (8, 300)


def test_all_errors_reported_at_once():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["train.loss=nope", "sapo.local_groups=0"])
    assert "train.loss" in str(err.value) and "sapo.local_groups" in str(err.value)


def test_malformed_override_and_missing_file():
    with pytest.raises(ConfigError, match="key=value"):
        load_config(None, ["train.steps"])
    with pytest.raises(ConfigError, match="not found"):
        load_config("configs/does-not-exist.yaml")


def test_defaults_are_valid():
    NodeConfig()


def test_cli_bad_config_exits_2_with_one_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "node.cli", "silo", "-c", "configs/tiny-silo.yaml", "--run-dir", str(tmp_path),
         "train.loss=foo"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert "train.loss" in lines[0] and lines[0].startswith("swarm-node: error:")


@pytest.mark.parametrize(
    ("overrides", "fields"),
    [
        (["generation.backend=vllm", "adapter.kind=remix"], ["generation.backend=vllm", "adapter.kind=remix"]),
        (["generation.backend=vllm", "generation.vllm.sync=lora"], ["generation.vllm.sync=lora", "train_norms"]),
        (["generation.backend=vllm", "generation.temperature=2.5"], ["generation.temperature=2.5", "backend=hf"]),
    ],
)
def test_backend_and_adapter_that_cannot_work_together_are_one_line_errors(overrides, fields):
    with pytest.raises(ConfigError) as err:
        load_config("configs/tiny-silo.yaml", overrides)
    message = str(err.value)
    assert all(f in message for f in fields) and "\n" not in message and "<root>" not in message
    # the same adapters are fine where they can run
    load_config("configs/tiny-silo.yaml", [o for o in overrides if not o.startswith("generation.backend")])


def test_cli_remix_with_vllm_exits_2_with_one_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "node.cli", "silo", "-c", "configs/tiny-silo.yaml", "--run-dir", str(tmp_path),
         "generation.backend=vllm", "adapter.kind=remix"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "set generation.backend=hf or adapter.kind=lora" in lines[0], proc.stderr


RG = ["tasks.source=reasoning_gym", "tasks.datasets=[gcd, syllogism]"]


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["tasks.dataset_configs={gcd: {max_value: 0}}"], "tasks: dataset_configs.gcd is invalid: AssertionError("),
        (["tasks.dataset_configs={gcd: {max_val: 50}}"], "dataset_configs.gcd has unknown setting(s) ['max_val']"),
        (["tasks.dataset_configs={gcd: {seed: 1}}"], "dataset_configs.gcd must not set ['seed']"),
        (["tasks.dataset_configs={gsm8k: {}}"], "dataset_configs names unknown dataset 'gsm8k'"),
        (["tasks.dataset_configs={gcd: 50}"], "tasks.dataset_configs.gcd"),
        (["tasks.source=arith", "tasks.datasets=[add]", "tasks.dataset_configs={add: {}}"],
         "source 'arith' takes no dataset_configs"),
        (["tasks.prompt.examples=[{user: a}]"], "tasks.prompt.examples: example 0: assistant: Field required"),
        (["tasks.prompt.examples=sometimes"], "tasks.prompt.examples: must be 'default', [] (none) or a list"),
        (["tasks.prompt.system=[a]"], "tasks.prompt.system"),
        (["tasks.source=arith", "tasks.datasets=[add]", "tasks.prompt.answer_instruction=null"],
         "tasks: prompt.answer_instruction applies to source reasoning_gym"),
    ],
)
def test_task_settings_errors_are_one_line_naming_the_field(overrides, expected):
    with pytest.raises(ConfigError) as err:
        load_config(None, [*RG, *overrides])
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_task_source_options_follow_the_config():
    cfg = load_config(None, [*RG, "tasks.dataset_configs={gcd: {max_value: 50}}"])
    assert cfg.tasks.source_options("auto") == {"chat_template": "auto", "dataset_configs": {"gcd": {"max_value": 50}}}
    cfg = load_config(None, [*RG, "tasks.prompt.system=null", "tasks.prompt.examples=[{user: Q, assistant: A}]",
                             "tasks.prompt.answer_instruction=null"])
    assert cfg.tasks.source_options("always") == {"chat_template": "always", "system_prompt": None,
                                                  "examples": [("Q", "A")], "answer_instruction": None}
    assert load_config(None, ["tasks.prompt.examples=[]"]).tasks.source_options("never") == {
        "chat_template": "never", "examples": []}


def test_the_node_builds_its_sources_and_scoring_child_with_the_task_settings(tmp_path):
    from node.run.node import Node
    from node.tasks.prompting import DEFAULT_SYSTEM_PROMPT

    overrides = [*RG, "tasks.eval_datasets=[gcd]", "tasks.dataset_configs={gcd: {max_value: 20}}",
                 "tasks.prompt.examples=[{user: 'What is 3 + 4?', assistant: '<answer>7</answer>'}]"]
    node = Node(load_config(None, overrides), tmp_path, show_progress=False)
    node.source = node._build_task_source()
    assert node.source.dataset_configs == {"gcd": {"max_value": 20}}  # type: ignore[attr-defined]
    assert node.source.system_prompt == DEFAULT_SYSTEM_PROMPT  # type: ignore[attr-defined]
    assert [(e.user, e.assistant) for e in node.source.examples] == [  # type: ignore[attr-defined]
        ("What is 3 + 4?", "<answer>7</answer>")]
    ref = node.source.eval_refs(1)[0]
    task = node.source.task(ref)
    assert max(task.metadata["numbers"]) <= 20
    scorer = node._build_scorer()  # the child rebuilds the source: the same settings, so the same config hash
    assert scorer is not None
    try:
        outcomes = scorer.score([(ref, f"<answer>{task.answer}</answer>"), (ref, "<answer>x</answer>")], wait=60)
    finally:
        scorer.close()
    assert [(o.status, o.reward) for o in outcomes] == [("ok", 1.0), ("ok", 0.0)]


@pytest.mark.parametrize("path", ["configs/smollm2-silo.yaml", "configs/smollm2-swarm.yaml"])
def test_smollm2_configs_name_admitted_datasets_and_prompt_with_an_example(path):
    from node.tasks import build_task_source
    from node.tasks.reasoning_gym import ADMITTED_DATASETS, EASY_DATASETS
    from tests.node.test_tasks import CHAT_TEMPLATE, _tiny_tokenizer

    cfg = load_config(path)
    t = cfg.tasks
    assert cfg.model.name_or_path == "smollm2-135m" and t.source == "reasoning_gym"
    assert set(t.datasets) <= set(ADMITTED_DATASETS) and set(t.datasets) & set(EASY_DATASETS)
    assert set(t.dataset_configs) <= set(t.datasets)
    source = build_task_source(t.source, list(t.datasets), t.weights, 0, **t.source_options(cfg.model.chat_template))
    task = source.task(source.eval_refs(1)[0])
    text = source.format_prompt(task, _tiny_tokenizer(CHAT_TEMPLATE))
    assert "<|assistant|>3 + 4 = 7.\n<answer>7</answer>" in text and "e.g. <answer>42</answer>" not in text
    assert text.endswith("Give your final answer inside <answer></answer> tags.\n<|assistant|>")


def test_a_renamed_key_is_named_in_a_users_config_and_read_in_a_recorded_one(tmp_path):
    """A user's config with a key renamed since is told the new name (exit 2 at the command line); a run dir's
    recorded config.yaml, written by an older version, loads with the key under its new name, so its checkpoints
    stay usable (``adapter.init_from``, ``swarm-node evaluate --run-dir``). Mutation caught: recorded configs
    validated as a user's (a run dir of the last version could no longer start a run)."""
    from node.config import load_recorded_config

    path = tmp_path / "config.yaml"
    path.write_text("ingest:\n  screen_ban_share: 0.3\n  screen_ban_window: 32\nswarm:\n  staleness_epochs: 3\n")
    with pytest.raises(ConfigError, match="ingest.screen_ban_share: renamed to ingest.screen_pause_share"):
        load_config(path)
    cfg = load_recorded_config(path, ["api.token=null"])
    assert (cfg.ingest.screen_pause_share, cfg.ingest.screen_pause_window, cfg.swarm.read_epochs) == (0.3, 32, 3)
