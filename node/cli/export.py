"""``swarm-node export``: a checkpoint of a run as folders other tools load.

- default: a PEFT adapter folder (``adapter_config.json`` + ``adapter_model.safetensors``, peft's own key
  names, written by peft's ``save_pretrained``) that ``PeftModel.from_pretrained(base, DIR)`` loads. Trained
  norms travel as peft ``modules_to_save``; vLLM's ``LoRARequest`` rejects such an adapter, so the export
  says so and points at ``--merged``.
- ``--merged``: a complete Hugging Face model folder (LoRA deltas and trained norms merged into the base
  weights, the tokenizer with its chat template, the generation config) for ``AutoModelForCausalLM`` and
  vLLM.
- ReMix: its routing picks LoRAs per token, so there is no PEFT form and nothing to merge; the adapter is
  written in the node's own format (``remix_adapter.safetensors`` + ``remix_config.json``).

Every folder gets a model card (``README.md``): base model, datasets, steps, swarm or silo, the node's
held-out greedy mean reward and the command that made it, and the code that loads it.

An adapter names its base by the absolute folder the node loaded it from (an embedded model's, or a
fetched model's or GGUF's converted folder in the node's cache), so plain transformers and peft load it
offline; the card says how another machine finds that folder (``swarm-node fetch NAME`` prints it).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from node.cli.common import quiet_loading, setup_logging
from node.config import ModelConfig
from node.errors import ConfigError
from node.run.saved import RunStep, eval_at, load_policy
from node.sources.embedded.catalog import embedded_model
from node.sources.fetched import gguf_file_of, registry_model
from node.sources.locate import locate_model

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

__all__ = ["ExportResult", "base_reference", "export_run"]

ExportDtype = Literal["fp32", "bf16"]


def _torch_dtype(dtype: ExportDtype) -> torch.dtype:
    import torch  # only once the command's inputs are checked

    return {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]


@dataclass
class ExportResult:
    out: Path
    kind: Literal["adapter", "merged", "remix"]
    notes: list[str] = field(default_factory=list)
    """One line each, for the user: what a loader can and cannot do with this folder."""
    targets: list[str] = field(default_factory=list)
    """The layers that carry the adapter, by leaf name (``adapter.target_modules: auto`` resolved)."""


def base_reference(model: ModelConfig) -> str:
    """What ``base_model_name_or_path`` records: the absolute folder the node loads the base from (an
    embedded model's, a fetched model's or a GGUF's converted folder in the node's cache, a local folder),
    so ``from_pretrained`` finds it offline on this machine; a hub name as it is (the hub's cache has it)."""
    folder = Path(locate_model(model.name_or_path, gguf_file=model.gguf_file).path).expanduser()
    return str(folder.resolve()) if folder.is_dir() else model.name_or_path


def base_elsewhere(model: ModelConfig) -> str:
    """How another machine finds the base ``base_reference`` names (for the model card)."""
    name = model.name_or_path
    if registry_model(name) is not None:
        return f"`swarm-node fetch {name}` fetches the same weights (checked by their sha256) and prints its folder"
    gguf = gguf_file_of(name, model.gguf_file)
    if gguf is not None:
        return f"`swarm-node fetch {gguf.name}` (with that GGUF file there) converts it and prints its folder"
    if embedded_model(name) is not None:
        return f"it ships with swarm-node: `swarm-node fetch {name}` prints its folder"
    if Path(name).expanduser().is_dir():
        return "copy this folder along"
    return "the same hub name, from that machine's Hugging Face cache"


def _prepare_out(out: Path, force: bool) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        if not force:
            raise ConfigError(f"--out {str(out)!r} exists and is not empty; choose another folder or pass --force")
        if out.is_dir():
            shutil.rmtree(out)
        else:
            out.unlink()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--out {str(out)!r} cannot be created ({exc.strerror}); choose a writable folder") from None


def export_run(run: RunStep, out: Path, *, merged: bool = False, dtype: ExportDtype = "fp32", force: bool = False,
               command: str = "") -> ExportResult:
    """Write ``run``'s checkpoint to ``out`` (see the module docstring); returns what was written."""
    if merged and run.cfg.adapter.kind == "remix":
        raise ConfigError("--merged: a ReMix adapter cannot be merged into the base weights (its routing picks "
                          "LoRAs per token); export it without --merged")
    _prepare_out(out, force)
    policy = load_policy(run)  # float32 on the CPU: merging and casting happen from exact weights
    if run.cfg.adapter.kind == "remix":
        result = _export_remix(run, policy, out, dtype)
    elif merged:
        result = _export_merged(policy, out, dtype)
    else:
        result = _export_adapter(run, policy, out, dtype)
    result.targets = _adapted_layers(policy)
    (out / "README.md").write_text(model_card(run, result, dtype, command))
    return result


def _adapted_layers(policy: object) -> list[str]:
    """The leaf names the run's adapter sits on, in the model's order (ReMix: its family's MLP projections)."""
    remix = getattr(policy, "remix", None)
    if remix is not None:
        return list(remix.projections)
    names: list[str] = []
    for name, module in policy.model.named_modules():  # type: ignore[attr-defined]
        leaf = name.rsplit(".", 1)[-1]
        if hasattr(module, "lora_A") and hasattr(module, "get_base_layer") and leaf not in names:
            names.append(leaf)
    return names


def _export_adapter(run: RunStep, policy: object, out: Path, dtype: ExportDtype) -> ExportResult:
    from safetensors.torch import load_file, save_file

    model = policy.model  # type: ignore[attr-defined]
    config = model.peft_config["default"]
    config.base_model_name_or_path = base_reference(run.cfg.model)
    # The node never resizes the vocabulary: no embedding layers to save, and no lookup of the base on the
    # hub (peft's "auto" asks the hub about any base that is not a local folder, and warns when offline).
    model.save_pretrained(str(out), save_embedding_layers=False)
    weights = out / "adapter_model.safetensors"
    tensors = load_file(str(weights))
    save_file({k: v.to(_torch_dtype(dtype)).contiguous() for k, v in tensors.items()}, str(weights),
              metadata={"format": "pt"})
    result = ExportResult(out, "adapter")
    norms = sorted(config.modules_to_save or [])
    if norms:
        result.notes.append(f"this adapter has trained norms ({', '.join(norms)}, as peft modules_to_save): peft "
                            "loads it, vLLM's LoRARequest does not; for vLLM export with --merged")
    return result


def _export_merged(policy: object, out: Path, dtype: ExportDtype) -> ExportResult:
    model = policy.model.merge_and_unload()  # type: ignore[attr-defined]  # trained norms replace the originals
    model.to(_torch_dtype(dtype))
    tokenizer = policy.tokenizer  # type: ignore[attr-defined]
    generation = model.generation_config
    if generation.eos_token_id is None:
        generation.eos_token_id = tokenizer.eos_token_id
    if generation.pad_token_id is None:
        generation.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    return ExportResult(out, "merged")


def _export_remix(run: RunStep, policy: object, out: Path, dtype: ExportDtype) -> ExportResult:
    from safetensors.torch import save_file

    state = policy.trainable_state()  # type: ignore[attr-defined]
    save_file({k: v.to(_torch_dtype(dtype)).contiguous() for k, v in state.items()},
              str(out / "remix_adapter.safetensors"), metadata={"format": "pt"})
    info = {"format": "swarm-node-remix", "base_model_name_or_path": base_reference(run.cfg.model),
            "adapter": run.cfg.adapter.model_dump(mode="json"), "step": run.step}
    (out / "remix_config.json").write_text(json.dumps(info, indent=1) + "\n")
    return ExportResult(out, "remix", ["ReMix: the adapter is written in swarm-node's own format (remix_adapter."
                                       "safetensors, remix_config.json), loadable by swarm-node only; no PEFT "
                                       "folder and no --merged, since its routing picks LoRAs per token"])


def model_card(run: RunStep, result: ExportResult, dtype: ExportDtype, command: str) -> str:
    """The folder's ``README.md``: what it is, what it was trained on, how well it did, how it was made, and
    the code that loads it (offline: the base is named by its folder, and how to find that folder elsewhere)."""
    cfg = run.cfg
    base, base_folder = cfg.model.name_or_path, base_reference(cfg.model)
    evaluated = eval_at(run.run_dir, run.step)
    # The node's evaluation is the mean reward of one greedy completion a task; on tasks scored with partial
    # credit (reasoning_gym) it is above the share of tasks solved outright, which swarm-node eval gives too.
    reward = ("not evaluated" if evaluated is None else
              f"{evaluated[1]:.3f} at step {evaluated[0]} on the node's {cfg.tasks.eval_size} held-out tasks (one in "
              "eight, chosen by a hash of each task's content); the share of tasks solved outright (accuracy) and "
              f"sampled figures: `swarm-node eval --run-dir {run.run_dir.resolve()} --step {run.step}`")
    datasets = ", ".join(f"{cfg.tasks.source}/{d}" for d in cfg.tasks.datasets)
    what = {"adapter": "a PEFT LoRA adapter", "merged": "a full model (adapter and trained norms merged)",
            "remix": "a ReMix adapter in swarm-node's format"}[result.kind]
    front = ["---", f"base_model: {base_folder}" if result.kind != "merged" else f"base_model: {base}",
             f"library_name: {'peft' if result.kind == 'adapter' else 'transformers'}",
             "tags: [swarm-node, reinforcement-learning, lora]", "---"]
    load = {
        "adapter": ["from peft import PeftModel", "from transformers import AutoModelForCausalLM",
                    f"# The base model's folder on the machine that exported this; elsewhere: {base_elsewhere(cfg.model)}.",
                    f"base = AutoModelForCausalLM.from_pretrained({base_folder!r})",
                    f"model = PeftModel.from_pretrained(base, {str(result.out)!r})"],
        "merged": ["from transformers import AutoModelForCausalLM",
                   f"model = AutoModelForCausalLM.from_pretrained({str(result.out)!r})"],
        "remix": ["# swarm-node only: swarm-node eval --run-dir (the run this came from)"],
    }[result.kind]
    lines = [
        *front, "", f"# {run.run_dir.resolve().name}, step {run.step}", "",
        f"{what[0].upper() + what[1:]}, trained by a swarm-node {run.mode} node with reinforcement learning on verifiable "
        f"tasks ({cfg.train.loss.upper()} loss, {cfg.train.advantage} advantages).", "",
        f"- base model: `{base}`" + (f" (folder `{base_folder}`)" if base_folder != base else ""),
        f"- adapter: {cfg.adapter.kind}, rank {cfg.adapter.rank}, alpha {cfg.adapter.alpha:g}, "
        f"targets {', '.join(result.targets)}" + (" (auto: the model family's)" if cfg.adapter.target_modules == "auto"
                                                    else "") + (", trained norms" if cfg.adapter.train_norms else ""),
        f"- datasets: {datasets}",
        f"- steps: {run.step}",
        f"- mode: {run.mode}" + (f" (swarm {cfg.swarm.swarm_id})" if run.mode == "swarm" else ""),
        f"- held-out greedy mean reward: {reward}",
        f"- dtype: {dtype}",
        f"- made by: `{command}`" if command else "- made by: swarm-node export",
        *(f"- note: {note}" for note in result.notes),
        "", "```python", *load, "```", "",
    ]
    return "\n".join(lines)


def cmd_export(args: argparse.Namespace) -> int:
    import shlex

    from node.run.saved import open_run

    run = open_run(args.run_dir, args.step)  # a bad run dir or step fails before torch is imported
    setup_logging(os.environ.get("SWARM_NODE_LOG", "WARNING"))
    quiet_loading()

    command = "swarm-node " + shlex.join(sys.argv[1:] if args.argv is None else args.argv)
    result = export_run(run, Path(args.out), merged=args.merged, dtype=args.dtype, force=args.force, command=command)
    what = {"adapter": "PEFT adapter", "merged": "merged model", "remix": "ReMix adapter"}[result.kind]
    print(f"swarm-node export: {what} of {run.run_dir} at step {run.step} written to {result.out}", flush=True)
    for note in result.notes:
        print(f"swarm-node export: {note}", flush=True)
    return 0
