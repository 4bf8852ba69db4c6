"""A finished (or running) run, read back: its config, a checkpoint of it, its policy at that step.

What ``swarm-node export`` and ``swarm-node eval --run-dir`` start from, and a new run started from another's
adapter (``adapter.init_from``). Every user mistake (a folder that is not a run dir, a run without a
checkpoint yet, a step that was not kept, an adapter of another shape) is a one-line ``ConfigError`` found
before torch is imported.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from node.config import NodeConfig, load_recorded_config
from node.errors import ConfigError

if TYPE_CHECKING:
    from node.policy.model import Policy

__all__ = ["RunStep", "eval_at", "init_source", "load_init_state", "load_policy", "open_run"]

_PREFIX = "step_"


@dataclass(frozen=True)
class RunStep:
    """A run dir and one of its checkpoints."""

    run_dir: Path
    cfg: NodeConfig
    step: int
    checkpoint: Path

    @property
    def mode(self) -> str:
        """``swarm`` or ``silo``: as the checkpoint recorded it, else as the metrics rows show it."""
        try:
            mode = json.loads((self.checkpoint / "state.json").read_text()).get("mode")
        except (OSError, ValueError):
            mode = None
        if mode in ("swarm", "silo"):
            return str(mode)
        rows = _rows(self.run_dir)
        return "swarm" if any("peers_seen" in r for r in rows) else "silo"


def _steps(run_dir: Path) -> list[int]:
    folder = run_dir / "checkpoints"
    if not folder.is_dir():
        return []
    return sorted(int(d.name[len(_PREFIX):]) for d in folder.iterdir()
                  if d.name.startswith(_PREFIX) and d.name[len(_PREFIX):].isdigit() and (d / "state.json").is_file())


def open_run(run_dir: str | Path, step: int | None = None) -> RunStep:
    """The run in ``run_dir`` at checkpoint ``step`` (default: its newest)."""
    folder = Path(run_dir)
    if not (folder / "config.yaml").is_file():
        raise ConfigError(f"--run-dir {str(folder)!r} is not a run dir (no config.yaml); pass the folder a node "
                          "trained in (its --run-dir)")
    steps = _steps(folder)
    if not steps:
        raise ConfigError(f"--run-dir {str(folder)!r} has no checkpoint yet (checkpoints/step_NNNNNN); train "
                          "until one is written (train.checkpoint_every)")
    if step is None:
        step = steps[-1]
    elif step not in steps:
        kept = ", ".join(str(s) for s in steps[-8:])
        raise ConfigError(f"--step {step}: {folder} has no checkpoint of that step; it has {kept} (the last "
                          "train.keep_checkpoints and the train.keep_every milestones are kept)")
    try:  # the token was redacted when the config was recorded: it is not needed here
        cfg = load_recorded_config(folder / "config.yaml", ["api.token=null"])
    except ConfigError as exc:
        raise ConfigError(f"--run-dir {str(folder)!r}: its config.yaml does not load here ({exc})") from None
    return RunStep(folder, cfg, step, folder / "checkpoints" / f"{_PREFIX}{step:06d}")


_INIT = "adapter.init_from"
_SHAPE = ("kind", "rank", "alpha", "target_modules", "train_norms")


def init_source(cfg: NodeConfig) -> RunStep | None:
    """The checkpoint ``adapter.init_from`` names (a run dir's newest, or the ``checkpoints/step_NNNNNN``
    folder it names), checked against ``cfg``: the same base model and adapter shape. None when unset."""
    raw = cfg.adapter.init_from
    if raw is None:
        return None
    path = Path(raw).expanduser()
    digits = path.name[len(_PREFIX):]
    if path.parent.name == "checkpoints" and path.name.startswith(_PREFIX) and digits.isdigit():
        run_dir, step = path.parent.parent, int(digits)
    else:
        run_dir, step = path, None
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"{_INIT}={raw!r} is neither a run dir nor a checkpoint of one (no config.yaml); name "
                          "the folder a node trained in (its --run-dir)")
    steps = _steps(run_dir)
    if step is None and steps:
        step = steps[-1]
    if step is None or step not in steps:
        raise ConfigError(f"{_INIT}={raw!r} has no such checkpoint (it has {steps[-8:] or 'none yet'}); name a "
                          "run dir with a checkpoint, or one of its checkpoints/step_NNNNNN folders")
    try:
        source = load_recorded_config(run_dir / "config.yaml", ["api.token=null"])
    except ConfigError as exc:
        raise ConfigError(f"{_INIT}={raw!r}: its config.yaml does not load here ({exc})") from None
    differs = _shape_differences(cfg, source)
    if differs:
        raise ConfigError(f"{_INIT}={raw!r} was trained with {'; '.join(differs)}; set the same here or start "
                          "from a run of this node's model and adapter")
    return RunStep(run_dir, source, step, run_dir / "checkpoints" / f"{_PREFIX}{step:06d}")


def _shape_differences(cfg: NodeConfig, source: NodeConfig) -> list[str]:
    """``field=theirs (this node: ours)`` for each setting that makes the two adapters' weights not fit.
    ``target_modules: auto`` names its layers only once the model is loaded (``node.policy.families``):
    against a list, the checkpoint's tensor names decide when they load (a one-line refusal there)."""
    pairs = [(f"model.{name}", getattr(source.model, name), getattr(cfg.model, name))
             for name in ("name_or_path", "gguf_file")]
    pairs += [(f"adapter.{name}", getattr(source.adapter, name), getattr(cfg.adapter, name)) for name in _SHAPE]
    if cfg.adapter.kind == "remix" and source.adapter.kind == "remix":
        pairs += [(f"adapter.remix.{name}", getattr(source.adapter.remix, name), getattr(cfg.adapter.remix, name))
                  for name in ("n", "k", "scale")]
    return [f"{name}={theirs!r} (this node: {ours!r})" for name, theirs, ours in pairs
            if theirs != ours and not (name == "adapter.target_modules" and "auto" in (theirs, ours))]


def load_init_state(run: RunStep) -> dict[str, Any]:
    """The trainable tensors of ``run``'s checkpoint (what ``adapter.init_from`` starts a run from)."""
    from node.errors import CheckpointError
    from node.run.checkpoint import CheckpointManager

    try:
        return CheckpointManager(run.run_dir, run.cfg.train.keep_checkpoints).load(run.checkpoint).trainable
    except CheckpointError as exc:
        raise ConfigError(f"{_INIT}: {exc}") from None


def load_policy(run: RunStep, *, dtype: str = "float32", device: str = "cpu") -> Policy:
    """The run's policy as it was at ``run.step``: its base model, its adapters, the checkpoint's weights."""
    from node.errors import CheckpointError
    from node.policy.model import build_policy
    from node.run.checkpoint import CheckpointManager

    model_cfg = run.cfg.model.model_copy(update={"dtype": dtype, "device": device})
    policy = build_policy(model_cfg, run.cfg.adapter, run.cfg.seed)
    try:
        state = CheckpointManager(run.run_dir, run.cfg.train.keep_checkpoints).load(run.checkpoint)
    except CheckpointError as exc:
        raise ConfigError(f"--step {run.step}: {exc}") from None
    policy.load_trainable_state(state.trainable)
    policy.model.eval()
    return policy


def _rows(run_dir: Path) -> list[dict[str, Any]]:
    from node.api.metrics import read_metrics

    path = run_dir / "metrics.jsonl"
    return read_metrics(path) if path.is_file() else []


def eval_at(run_dir: Path, step: int) -> tuple[int, float] | None:
    """The node's own held-out evaluation at ``step``, else its latest before it: ``(step, accuracy)``."""
    evals = [(int(r["step"]), float(r["eval_accuracy"])) for r in _rows(run_dir)
             if isinstance(r.get("eval_accuracy"), (int, float)) and int(r["step"]) <= step]
    return evals[-1] if evals else None
