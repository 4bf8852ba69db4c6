"""Write docs/configuration.md, the reference of every configuration key, from the config models.

    python scripts/dev/config_reference.py           # (re)write docs/configuration.md
    python scripts/dev/config_reference.py --check   # exit 1 when the page differs from the models

Each key's default and type come from the pydantic models ``node.config.NodeConfig`` is built of; its
meaning from the field's ``description``, else the docstring under the attribute (as ``swarm.settings``
writes them), else ``MEANINGS`` below for the few keys whose models say nothing. ``tests/test_docs.py``
fails when the page is out of date or a key has no meaning, so a new key is documented where it is
declared and this script is run again.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import sys
import textwrap
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

ROOT = Path(__file__).resolve().parents[2]

from node.config import NodeConfig  # noqa: E402  (the repository root on the path first)

PAGE = ROOT / "docs" / "configuration.md"
_MIB = 1024 * 1024

# Where each section's keys are explained at length.
TOPIC = {
    "api": "operating.md#status-api-and-dashboard", "model": "models.md", "adapter": "algorithms.md",
    "tasks": "tasks.md", "generation": "backends.md", "sampling": "algorithms.md", "train": "algorithms.md",
    "sapo": "swarm.md#which-peer-groups-a-node-trains-on", "ingest": "trust.md", "swarm": "swarm.md",
    "tracking": "operating.md#tracking",
}

# Meanings of the keys whose models carry neither a description nor an attribute docstring.
MEANINGS = {
    "seed": "the node's random seed (tasks, sampling, initialisation); a swarm node whose config sets none "
            "takes the first 32 bits of its peer id",
    "run_dir": "where metrics, checkpoints, the log and the config copy go (`--run-dir` sets it)",
    "model.dtype": "the base model's weights and compute dtype",
    "model.chat_template": "auto: use the model's chat template when it has one; always; never (plain prompts)",
    "model.trust_remote_code": "let transformers run the model folder's own code (off: only built-in architectures)",
    "adapter.kind": "lora: one LoRA a module; remix: k of n routed LoRAs a token (docs/algorithms.md, ReMix)",
    "adapter.rank": "LoRA rank (remix: the rank of each of its n LoRAs)",
    "adapter.alpha": "LoRA scale numerator (the update is scaled by alpha / rank)",
    "adapter.dropout": "LoRA dropout",
    "adapter.norm_lr": "learning rate of the trained RMSNorm weights (train_norms)",
    "adapter.remix.n": "LoRAs a routed module holds",
    "adapter.remix.k": "LoRAs a token is routed to",
    "adapter.remix.scale": "each active LoRA's weight: lora (alpha / rank) / k, rslora alpha / sqrt(rank) / k",
    "adapter.remix.router_lr": "learning rate of the router",
    "tasks.source": "arith (2-digit arithmetic) or reasoning_gym (reasoning-gym's datasets)",
    "tasks.datasets": "the datasets the node samples tasks from (docs/tasks.md lists them)",
    "tasks.weights": "sampling weight of each dataset, in the order of datasets (default: equal)",
    "tasks.eval_size": "held-out tasks the node evaluates on (and `swarm-node eval` of a run)",
    "generation.max_new_tokens": "longest completion, in tokens",
    "generation.temperature": "sampling temperature",
    "generation.top_p": "nucleus sampling threshold (1: off)",
    "sampling.mode": "standard: group_size completions a task; ada_balanced / ada_positive: Reinforce-Ada, "
                     "rounds until a group has signal (docs/algorithms.md)",
    "train.lr": "learning rate of the adapter (Adam)",
    "train.weight_decay": "AdamW weight decay",
    "train.max_grad_norm": "gradient norm clipping",
    "train.loss": "topr, rec, grpo or reinforce (docs/algorithms.md, Policy losses)",
    "train.advantage": "rloo, grpo or global baseline (docs/algorithms.md, Advantages)",
    "train.length_norm": "use a sequence's mean token log-ratio instead of its sum (docs/algorithms.md)",
    "train.eps_low": "rec and grpo: the ratio's lower bound is 1 - eps_low (docs/algorithms.md, Policy losses)",
    "train.eps_high": "rec and grpo: the ratio's upper bound is 1 + eps_high",
    "train.checkpoint_every": "steps between checkpoints",
    "train.keep_checkpoints": "newest checkpoints kept (older ones pruned, milestones aside)",
    "sapo.selection": "order in which peer groups are picked: uniform, highest_reward, round_robin",
    "sapo.max_per_peer": "peer groups from one peer a step, at most (null: no cap)",
    "sapo.staleness_epochs": "how many epochs old a peer group may be when trained on",
    "ingest.max_groups_per_peer_step": "peer groups taken from one author a step, at most",
    "ingest.max_rollouts_per_step": "peer completions ingested a step, at most",
    "ingest.max_tokens_per_step": "peer completion tokens ingested a step, at most",
    "ingest.max_seconds_per_peer_step": "wall time of ingesting one author's groups a step",
    "swarm.epoch_seconds": "length of an epoch, the unit of manifests' DHT keys and of quotas; swarm-wide",
    "swarm.max_batches_per_peer_epoch": "batches pulled from one author per epoch",
    "swarm.max_handoff_bytes_per_author_epoch": "hand-off bytes held per author and epoch; more are refused",
    "swarm.ban_backoff": "factor each further offence multiplies a peer's ban by",
    "swarm.max_ban_seconds": "longest ban",
    "swarm.join_retry_seconds": "first wait before retrying to join the DHT",
    "swarm.join_retry_max_seconds": "longest wait between retries to join (exponential back-off)",
    "swarm.max_concurrent_pulls": "batch pulls running at once",
    "swarm.max_pulls_per_author": "pulls from one author running at once",
    "swarm.max_pull_attempts": "tries to pull one batch before it is given up as unreachable",
    "swarm.max_publish_queue": "own batches waiting to be published; the oldest are dropped beyond it",
    "tracking.wandb.project": "the W&B project",
    "tracking.wandb.mode": "online, or offline (no network; `wandb sync` later)",
    "tracking.wandb.entity": "the W&B entity (team or user; default: the login's)",
}


def _section_model(annotation: Any) -> type[BaseModel] | None:
    """The model class of a section field (``X`` or ``X | None``), else None."""
    for candidate in (annotation, *get_args(annotation)):
        if inspect.isclass(candidate) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _attribute_docstrings(cls: type) -> dict[str, str]:
    """The string literal under each annotated attribute of ``cls`` and its bases (as swarm.settings has)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass in (object, BaseModel) or not issubclass(klass, BaseModel):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for stmt, after in zip(body, body[1:]):
            if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                    and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)):
                docs[stmt.target.id] = " ".join(after.value.value.split())
    return docs


def _type_name(annotation: Any) -> str:
    origin = get_origin(annotation)
    if origin is Literal:
        return " \\| ".join(str(a) for a in get_args(annotation))
    if origin in (Union, getattr(__import__("types"), "UnionType", Union)):
        return " \\| ".join(_type_name(a) for a in get_args(annotation))
    if origin is not None:
        inner = ", ".join(_type_name(a) for a in get_args(annotation))
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]"
    if annotation is type(None):
        return "null"
    return getattr(annotation, "__name__", str(annotation))


def _bounds(field: FieldInfo) -> str:
    signs = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<", "min_length": "length >="}
    parts = []
    for item in field.metadata:
        for attr, sign in signs.items():
            value = getattr(item, attr, None)
            if value is not None:
                parts.append(f"{sign} {value:g}" if isinstance(value, float) else f"{sign} {value}")
    return ", ".join(parts)


def _default(field: FieldInfo) -> str:
    value = field.get_default(call_default_factory=True)
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if isinstance(value, int) and not isinstance(value, bool) and value >= _MIB and value % _MIB == 0:
        text += f" ({value // _MIB} MiB)"
    return f"`{text}`"


def _markdown(text: str) -> str:
    """A docstring's reST literals as Markdown code, on one line."""
    return " ".join(text.replace("``", "`").split())


def _escape(text: str) -> str:
    return _markdown(text).replace("|", "\\|")


def keys(model: type[BaseModel] = NodeConfig, prefix: str = "") -> list[tuple[str, FieldInfo, str]]:
    """Every configuration key below ``model``: (dotted name, its field, its meaning or '')."""
    docs = _attribute_docstrings(model)
    out: list[tuple[str, FieldInfo, str]] = []
    for name, field in model.model_fields.items():
        dotted = f"{prefix}{name}"
        meaning = field.description or docs.get(name) or MEANINGS.get(dotted, "")
        out.append((dotted, field, " ".join(meaning.split())))
        section = _section_model(field.annotation)
        if section is not None:
            out.extend(keys(section, f"{dotted}."))
    return out


_INTRO = """\
# Configuration reference

<!-- Generated by scripts/dev/config_reference.py from the config models: do not edit by hand; run
     python scripts/dev/config_reference.py after changing a key. tests/test_docs.py checks it. -->

A node's configuration is a YAML file (`configs/` holds one for each model and use) plus `a.b=value`
overrides on the command line, e.g. `swarm-node silo -c configs/tiny-silo.yaml train.steps=150 seed=3
"tasks.datasets=[add,sub]"`. Values are parsed as YAML would (`3`, `true`, `null`, `[a, b]`). Unknown keys
are refused, and every mistake is reported at once, one line naming the field and the fix, with exit
code 2. A run copies its resolved configuration to `RUN_DIR/config.yaml`.

Each table lists a section's keys with their type, default and meaning; the section's own page explains
them at length. A nested section's keys are written with dots (`generation.vllm.sync=merge`).
"""


def render() -> str:
    rows = keys()
    lines = [_INTRO]
    top = [(k, f, m) for k, f, m in rows if "." not in k and _section_model(f.annotation) is None]
    sections = [(k, f) for k, f, _ in rows if _section_model(f.annotation) is not None]
    lines += ["## Top level", "", "| key | type | default | meaning |", "| --- | --- | --- | --- |"]
    lines += [f"| `{k}` | {_type_name(f.annotation)} | {_default(f)} | {_escape(m)} |" for k, f, m in top]
    for name, field in sections:
        model = _section_model(field.annotation)
        assert model is not None
        level = "##" if "." not in name else "###"
        lines += ["", f"{level} `{name}`", ""]
        intro = field.description or model.__doc__ or ""  # a section's own docstring, when it has one
        if intro:
            lines += [_markdown(intro), ""]
        if "." not in name and name in TOPIC:
            lines += [f"Explained in [{TOPIC[name].split('#')[0]}]({TOPIC[name]}).", ""]
        if field.default is None:
            lines += [f"Off unless set: `{name}` is `null` by default.", ""]
        lines += ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
        for key, f, meaning in rows:
            if key.rpartition(".")[0] == name and _section_model(f.annotation) is None:
                bounds = _bounds(f)
                kind = _type_name(f.annotation) + (f" ({bounds})" if bounds else "")
                lines.append(f"| `{key}` | {kind} | {_default(f)} | {_escape(meaning)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/configuration.md is out of date")
    args = parser.parse_args(argv)
    missing = [k for k, f, m in keys() if not m and _section_model(f.annotation) is None]
    if missing:
        print(f"keys without a meaning (add a description where they are declared): {', '.join(missing)}")
        return 1
    text = render()
    if args.check:
        if PAGE.read_text(encoding="utf-8") != text:
            print(f"{PAGE.relative_to(ROOT)} is out of date: run python scripts/dev/config_reference.py")
            return 1
        return 0
    PAGE.write_text(text, encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)} ({len(keys())} keys)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
