from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from node.config import ConfigError, NodeConfig, apply_overrides, load_config


@pytest.mark.parametrize("path", sorted(str(p) for p in Path("configs").glob("*.yaml")))
def test_every_shipped_config_validates(path):
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
    ],
)
def test_bad_values_name_the_field(override, field):
    with pytest.raises(ConfigError) as err:
        load_config("configs/tiny-silo.yaml", [override])
    assert field in str(err.value)
    assert "\n" not in str(err.value)


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
