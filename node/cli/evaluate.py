"""``swarm-node eval``: held-out accuracy and mean reward per dataset, greedy and sampled, of a run's
checkpoint or of any model the node can load.

The tasks are the node's own evaluation tasks: the same held-out split (one task in eight, by a hash of
its content) and, for a run, the same source, datasets, weights, seed and count (``tasks.eval_size``), so
``swarm-node eval --run-dir R --step N`` gives the greedy number the node logged as ``eval_accuracy`` at
step N (the greedy mean reward; ``accuracy`` below is the share of tasks solved outright, reward >= 1,
which is the same number on tasks scored 0 or 1 such as arithmetic). Greedy completions are generated in
batches of ``generation.batch_size`` prompts, as the node's own evaluation does. Sampled completions use
the run's temperature and top-p, ``samples`` a task, from a generator seeded with ``seed``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from node.cli.common import quiet_loading, setup_logging
from node.config import ModelConfig, NodeConfig, load_config
from node.errors import ConfigError, PolicyError, TaskError
from node.sources.locate import locate_model
from node.tasks import Task, TaskSource, build_task_source

if TYPE_CHECKING:  # torch, transformers and the backends load only once the command's inputs are checked
    from node.generation.base import GenerationBackend
    from node.policy.model import Policy

logger = logging.getLogger(__name__)

__all__ = ["EvalPlan", "evaluate", "model_policy", "render_table"]


@dataclass(frozen=True)
class EvalPlan:
    """What to evaluate on and how: the tasks' source and the generation settings."""

    source: str
    datasets: list[str]
    weights: list[float] | None
    seed: int
    n: int
    options: dict[str, Any]  # the task source's options: chat template, prompt, dataset settings
    max_new_tokens: int
    temperature: float
    top_p: float
    batch_size: int
    samples: int = 1
    sample_seed: int = 0

    @classmethod
    def of_run(cls, cfg: NodeConfig, *, datasets: list[str] | None, n: int | None, samples: int,
               sample_seed: int) -> EvalPlan:
        """The node's own evaluation of ``cfg``: its eval datasets (or its datasets, with their weights), with
        its prompt and dataset settings, so a run is scored on the tasks it was evaluated on while training."""
        t, g = cfg.tasks, cfg.generation
        own = list(t.eval_datasets or t.datasets)
        weights = t.weights if not t.eval_datasets and datasets is None else None
        options = t.source_options(cfg.model.chat_template)
        if datasets is not None and "dataset_configs" in options:
            options["dataset_configs"] = {k: v for k, v in options["dataset_configs"].items() if k in datasets}
        return cls(source=t.source, datasets=datasets or own, weights=weights, seed=cfg.seed,
                   n=n if n is not None else t.eval_size, options=options,
                   max_new_tokens=g.max_new_tokens, temperature=g.temperature, top_p=g.top_p,
                   batch_size=g.batch_size, samples=samples, sample_seed=sample_seed)


def build_tasks(plan: EvalPlan) -> tuple[TaskSource, list[Task]]:
    try:
        source = build_task_source(plan.source, plan.datasets, plan.weights, plan.seed, **plan.options)
        return source, [source.task(ref) for ref in source.eval_refs(plan.n)]
    except TaskError as exc:
        raise ConfigError(f"--datasets: {exc}") from None


def model_policy(name_or_path: str, *, dtype: str = "float32", device: str = "cpu",
                 trust_remote_code: bool = False) -> Policy:
    """A model by name or path, without the node's adapters: a base model, a merged export, or a PEFT
    adapter folder (``adapter_config.json``: loaded onto the base it names)."""
    from node.policy.model import Policy, load_base, model_fingerprint, pick_device, tokenizer_fingerprint

    folder = Path(name_or_path).expanduser()
    adapter = folder / "adapter_config.json"
    base_name = name_or_path
    if adapter.is_file():
        base_name = str(json.loads(adapter.read_text()).get("base_model_name_or_path") or "")
        if not base_name:
            raise ConfigError(f"--model {name_or_path!r}: adapter_config.json names no base_model_name_or_path")
    cfg = ModelConfig.model_validate({"name_or_path": base_name, "dtype": dtype, "device": device,
                                      "trust_remote_code": trust_remote_code})
    base, tokenizer = load_base(cfg)
    model: Any = base
    if adapter.is_file():
        from peft import PeftModel

        try:
            model = PeftModel.from_pretrained(model, str(folder))
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            raise PolicyError(f"--model {name_or_path!r}: peft could not load the adapter "
                              f"({str(exc).strip().splitlines()[0][:160]})") from None
    dev = pick_device(device)
    model.to(dev)
    model.eval()
    return Policy(model=model, tokenizer=tokenizer, device=dev, name_or_path=name_or_path,
                  tokenizer_fingerprint=tokenizer_fingerprint(tokenizer),
                  model_fingerprint=model_fingerprint(base_name, base))


def evaluate(backend: GenerationBackend, policy: Policy, plan: EvalPlan, *,
             show_progress: bool = True) -> dict[str, Any]:
    """Per dataset and in all: tasks, and greedy and sampled accuracy (share with reward >= 1) and reward."""
    import torch
    from tqdm import tqdm

    from node.generation.base import SamplingSettings
    from node.generation.rollouts import score_tasks

    source, tasks = build_tasks(plan)
    total = len(tasks) * (1 + plan.samples)
    bar = tqdm(total=total, disable=not show_progress, unit="completion", dynamic_ncols=True, leave=False)
    greedy = SamplingSettings(max_new_tokens=plan.max_new_tokens, greedy=True)
    sampled = SamplingSettings(max_new_tokens=plan.max_new_tokens, temperature=plan.temperature, top_p=plan.top_p)
    generator = torch.Generator(device=policy.device).manual_seed(plan.sample_seed)
    scores: dict[str, list[list[float]]] = {"greedy": [], "sampled": []}
    try:
        for mode, settings, repeats in (("greedy", greedy, 1), ("sampled", sampled, plan.samples)):
            per_task: list[list[float]] = [[] for _ in tasks]
            for _ in range(repeats):
                for start in range(0, len(tasks), plan.batch_size):
                    chunk = tasks[start : start + plan.batch_size]
                    got = score_tasks(backend, policy, source, chunk, settings, None if mode == "greedy" else generator)
                    for i, score in enumerate(got):
                        per_task[start + i].append(score)
                    bar.update(len(chunk))
            scores[mode] = per_task
    finally:
        bar.close()
    by_dataset: dict[str, list[int]] = {}
    for i, task in enumerate(tasks):
        by_dataset.setdefault(task.ref.dataset, []).append(i)
    rows = {name: _summary(idx, scores) for name, idx in by_dataset.items()}
    rows["all"] = _summary(list(range(len(tasks))), scores)
    return {"source": plan.source, "tasks": len(tasks), "samples": plan.samples, "datasets": rows}


def _summary(indices: list[int], scores: dict[str, list[list[float]]]) -> dict[str, Any]:
    out: dict[str, Any] = {"tasks": len(indices)}
    for mode, per_task in scores.items():
        flat = [s for i in indices for s in per_task[i]]
        n = max(len(flat), 1)
        out[mode] = {"accuracy": sum(s >= 1.0 for s in flat) / n, "reward": sum(flat) / n}
    return out


def render_table(title: str, result: dict[str, Any]) -> str:
    from node.api.client import table

    head = ["dataset", "tasks", "greedy acc", "greedy reward", "sampled acc", "sampled reward"]
    rows = [[name, str(r["tasks"]), f"{r['greedy']['accuracy']:.3f}", f"{r['greedy']['reward']:.3f}",
             f"{r['sampled']['accuracy']:.3f}", f"{r['sampled']['reward']:.3f}"]
            for name, r in result["datasets"].items()]
    return "\n".join([title, *table([head, *rows])])


# -- the command -------------------------------------------------------------------------------------------

def _eval_inputs(args: argparse.Namespace) -> tuple[Any, NodeConfig, str, list[str] | None]:
    """``(run or None, config, task source, datasets or None)`` of ``swarm-node eval``, every mistake a
    one-line ``ConfigError`` before torch is imported."""
    from node.tasks.registry import check_datasets

    datasets = [d.strip() for d in args.datasets.split(",") if d.strip()] if args.datasets else None
    if (args.n is not None and args.n < 1) or args.samples < 1:
        raise ConfigError("--n and --samples must be at least 1")
    run = None
    if args.run_dir:
        from node.run.saved import open_run

        if args.config:
            raise ConfigError("--config goes with --model: a run is evaluated with its own config")

        run = open_run(args.run_dir, args.step)
        cfg = run.cfg
    else:
        if args.step is not None:
            raise ConfigError("--step needs --run-dir (a --model has no checkpoints)")
        cfg = load_config(args.config) if args.config else NodeConfig()
        locate_model(args.model)
    source = args.source or cfg.tasks.source
    if source != cfg.tasks.source and datasets is None:
        raise ConfigError(f"--source {source}: name its --datasets (the default ones are of {cfg.tasks.source})")
    try:
        check_datasets(source, datasets or list(cfg.tasks.eval_datasets or cfg.tasks.datasets))
    except TaskError as exc:
        raise ConfigError(f"--datasets: {exc}") from None
    return run, cfg, source, datasets


def cmd_eval(args: argparse.Namespace) -> int:
    import json

    run, cfg, source, datasets = _eval_inputs(args)
    setup_logging(os.environ.get("SWARM_NODE_LOG", "WARNING"))
    quiet_loading()
    from node.generation.backend import build_backend

    n = args.n if args.n is not None else (None if run is not None or args.config else 200)
    plan = EvalPlan.of_run(cfg, datasets=datasets, n=n, samples=args.samples, sample_seed=args.seed)
    if source != cfg.tasks.source:  # the config's prompt and dataset settings are of its own source
        plan = dataclasses.replace(plan, options={"chat_template": cfg.model.chat_template})
    plan = dataclasses.replace(plan, source=source, max_new_tokens=args.max_new_tokens or plan.max_new_tokens)
    if run is not None:
        from node.run.saved import load_policy

        policy = load_policy(run, dtype=cfg.model.dtype, device=cfg.model.device)
        title = (f"swarm-node eval: {run.run_dir} at step {run.step} · {cfg.model.name_or_path} ({cfg.adapter.kind}) "
                 f"· {args.backend} backend")
    else:
        m = cfg.model  # the device and dtype a node of this config would use (a GPU where there is one)
        policy = model_policy(args.model, dtype=m.dtype, device=m.device, trust_remote_code=m.trust_remote_code)
        title = f"swarm-node eval: {args.model} · {args.backend} backend"
    backend = build_backend(policy, args.backend, batch_size=plan.batch_size, dtype=cfg.model.dtype,
                            seed=args.seed, hf=cfg.generation.hf, vllm=cfg.generation.vllm)
    try:
        result = evaluate(backend, policy, plan, show_progress=not (args.no_progress or args.json))
    finally:
        backend.close()
    result.update(model=args.model or cfg.model.name_or_path, step=run.step if run else None, backend=args.backend)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(render_table(title + f" · {result['tasks']} held-out tasks, {plan.samples} sample(s) a task", result))
    return 0
