"""A run's checkpoints as policies sampling its held-out tasks (lab scripts that compare a run's stages)."""

from __future__ import annotations

from typing import Any

import torch

from node.cli.evaluate import EvalPlan, build_tasks, model_policy
from node.generation.backend import build_backend
from node.generation.base import SamplingSettings
from node.generation.rollouts import SampledGroup, sample_groups
from node.run.saved import load_policy, open_run


def held_out_tasks(run_dir: str, step: int, n: int, datasets: list[str] | None) -> tuple[Any, Any, list[Any]]:
    """``(config, task source, tasks)``: ``n`` tasks of the run's held-out evaluation, its config read at ``step``."""
    cfg = open_run(run_dir, step).cfg
    source, tasks = build_tasks(EvalPlan.of_run(cfg, datasets=datasets, n=n, samples=1, sample_seed=0))
    return cfg, source, tasks


def policy_at(run_dir: str, step: int, cfg: Any) -> Any:
    """The run's policy at checkpoint ``step``; 0: its base model."""
    if step:
        return load_policy(open_run(run_dir, step))
    return model_policy(cfg.model.name_or_path, dtype="float32", device="cpu")


def sample(policy: Any, cfg: Any, source: Any, tasks: list[Any], group_size: int, seed: int) -> list[SampledGroup]:
    """``group_size`` completions a task at the run's sampling settings, scored by the task's verifier."""
    g = cfg.generation
    backend = build_backend(policy, "hf", batch_size=32, dtype="float32", seed=0, hf=g.hf, vllm=g.vllm)
    settings = SamplingSettings(max_new_tokens=g.max_new_tokens, temperature=g.temperature, top_p=g.top_p)
    return sample_groups(backend, policy, source, tasks, group_size=group_size, settings=settings,
                         generator=torch.Generator().manual_seed(seed))
