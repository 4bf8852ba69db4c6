"""How a ``Node`` is built: one ``_build_*`` method a dependency (``Node.setup`` calls them in order and
says why that order), the run dir's config record, and resuming from a checkpoint or starting from
another run's adapter (``adapter.init_from``)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from node.api.board import NodeInfo
from node.config import IngestConfig, NodeConfig, resolve_api
from node.errors import ConfigError, TaskError
from node.exchange.exchange import SwarmExchange
from node.exchange.ingest import IngestLimits
from node.exchange.plausibility import ScreenSettings
from node.exchange.scoring import ScoringWorker, SourceSpec
from node.generation.backend import node_backend
from node.generation.base import GenerationBackend
from node.generation.rollouts import split_by_fit
from node.policy.model import Policy, build_policy, device_label, device_memory_mb
from node.run.checkpoint import CheckpointManager, restore_rng
from node.run.rundir import say_config_changes
from node.run.saved import RunStep, load_init_state
from node.run.state import NodeState, TransportFactory
from node.tasks import Task, TaskSource, build_task_source
from node.train.trainer import Trainer
from protocol.errors import IdentityError
from protocol.identity import Identity

if TYPE_CHECKING:
    from node.api.server import ApiServer

logger = logging.getLogger(__name__)


class SetupMixin(NodeState):
    """The builders ``Node.setup`` calls."""

    def _record_config(self) -> None:
        """Write ``RUN_DIR/config.yaml``; when resuming a run whose settings changed, say what changed."""
        import yaml

        path, text = self.run_dir / "config.yaml", _dump_yaml(self.cfg)
        if path.is_file() and CheckpointManager(self.run_dir, 1).latest() is not None:
            try:
                old = yaml.safe_load(path.read_text())
            except (OSError, yaml.YAMLError):
                old = None
            if isinstance(old, dict):
                say_config_changes(old, yaml.safe_load(text), self.run_dir)
        _write_atomic(path, text)

    def describe_policy(self) -> str:
        """The start line that says where the model runs: ``model smollm2-135m (lora) on cpu in float32``."""
        return (f"model {self.cfg.model.name_or_path} ({self.cfg.adapter.kind}) on {device_label(self.policy.device)} "
                f"in {self.cfg.model.dtype} (model.device: {self.cfg.model.device})")

    def _node_info(self) -> NodeInfo:
        from importlib.metadata import PackageNotFoundError, version

        try:
            ver = version("swarm-node")
        except PackageNotFoundError:
            ver = "unknown"
        name = self.cfg.model.name_or_path
        if Path(name).expanduser().exists():  # a local folder: its name only, never where it lives
            name = Path(name).expanduser().resolve().name
        ex = self.exchange
        return NodeInfo(version=ver, mode="silo" if ex is None else "swarm",
                        peer_id=None if ex is None else ex.identity.peer_id,
                        swarm_id=None if ex is None else ex.swarm_id, model=name, adapter=self.cfg.adapter.kind,
                        device=f"{device_label(self.policy.device)} · {self.cfg.model.dtype}",
                        run_dir=self.run_dir.resolve().name, total_steps=self.cfg.train.steps,
                        started_at=self._started_at)

    def _build_api(self) -> ApiServer:
        from node.api.server import ApiServer

        api = ApiServer(resolve_api(self.cfg), self.board, self.run_dir / "metrics.jsonl",
                        transport=None if self.exchange is None else self.exchange.transport)
        api.start()
        (self.run_dir / "api_url").write_text(api.url + "\n")
        logger.info("status API and dashboard on %s", api.url)
        return api

    def _build_policy(self) -> Policy:
        return build_policy(self.cfg.model, self.cfg.adapter, self.cfg.seed)

    def _build_generator(self) -> GenerationBackend:
        return node_backend(self.cfg, self.policy)

    def _build_task_source(self) -> TaskSource:
        t = self.cfg.tasks
        try:
            return build_task_source(t.source, list(t.datasets), t.weights, self.cfg.seed,
                                     **t.source_options(self.cfg.model.chat_template))
        except TaskError as exc:
            raise ConfigError(f"tasks: {exc}") from None

    def _build_eval_tasks(self) -> list[Task]:
        """The held-out tasks, formatted now, so that a prompt-format mistake, or tasks whose prompts the
        model's context cannot take, fail at start-up."""
        t = self.cfg.tasks
        try:
            source = self.source
            if t.eval_datasets:
                source = build_task_source(t.source, list(t.eval_datasets), None, self.cfg.seed,
                                           **t.source_options(self.cfg.model.chat_template))
            tasks = [source.task(r) for r in source.eval_refs(t.eval_size)]
            _, too_long = split_by_fit(self.policy, source, tasks, self.generator.max_len)
        except TaskError as exc:
            raise ConfigError(f"tasks: {exc}") from None
        if too_long:  # most of them: the tasks do not suit this model; a few: they are set aside as they come
            model_len = self.policy.context_length
            by_engine = model_len is None or (self.generator.max_len or model_len) < model_len
            n = self.generator.max_len
            limit = (f"limit of {n} tokens (generation.vllm.max_model_len)" if by_engine
                     else f"model's {n}-token context")
            message = f"{len(too_long)} of {len(tasks)} evaluation prompts are at least as long as the {limit}"
            if 2 * len(too_long) > len(tasks):
                fix = "raise generation.vllm.max_model_len" if by_engine else "use a model with a longer context"
                raise ConfigError(f"tasks: {message}; choose datasets with shorter prompts or {fix}")
            logger.warning("%s: such tasks are skipped in training and score 0 in evaluation", message)
        return tasks

    def _build_trainer(self) -> Trainer:
        tc, ac = self.cfg.train, self.cfg.adapter
        device = self.policy.device
        memory_mb = device_memory_mb(device, self.cfg.model.memory_mb)  # a node's cap, where it has one
        rows, budget_mb = tc.micro_batch_rows(device.type), tc.logits_budget_mb(device.type, memory_mb)
        logger.info("training in micro-batches of up to %d rows, %d MB of logits each", rows, budget_mb)
        return Trainer(self.policy, lr=tc.lr, norm_lr=ac.norm_lr, router_lr=ac.remix.router_lr,
                       weight_decay=tc.weight_decay, max_grad_norm=tc.max_grad_norm, loss=tc.loss,
                       eps_low=tc.eps_low, eps_high=tc.eps_high, length_norm=tc.length_norm,
                       micro_batch_size=rows, temperature=self.cfg.generation.temperature,
                       routings=ac.remix.routings, spread_routings=ac.remix.spread,
                       off_policy_correction=tc.off_policy_correction, seed=self.cfg.seed,
                       gradient_checkpointing=tc.gradient_checkpointing, logits_memory_mb=budget_mb,
                       engine_is_cap=tc.engine_is_cap, optimizer_steps=tc.optimizer_steps,
                       loss_denominator=(self.cfg.sapo.local_groups * self.cfg.generation.group_size
                                         if tc.loss_denominator == "fixed" else None),
                       measure_alignment=self.decider is not None, fused=tc.fused)

    def _build_identity(self) -> Identity:
        return load_identity(self.cfg, self.run_dir)

    def _build_exchange(self, factory: TransportFactory) -> SwarmExchange:
        settings = self.cfg.swarm
        if settings.p2p_identity_path and not Path(settings.p2p_identity_path).is_absolute():
            # Relative to the run dir, like swarm.identity_path: a restarted node keeps its libp2p id.
            settings = settings.model_copy(update={"p2p_identity_path": str(self.run_dir / settings.p2p_identity_path)})
        if settings.trace_path and not Path(settings.trace_path).is_absolute():
            settings = settings.model_copy(update={"trace_path": str(self.run_dir / settings.trace_path)})
        identity = self._build_identity()
        g, ic = self.cfg.generation, self.cfg.ingest
        limits = IngestLimits(max_groups_per_peer=ic.max_groups_per_peer_step, max_rollouts=ic.max_rollouts_per_step,
                              max_tokens=ic.max_tokens_per_step, max_seconds=ic.max_seconds_per_step,
                              max_seconds_per_peer=ic.max_seconds_per_peer_step,
                              max_seeds_per_peer_epoch=ic.max_seeds_per_peer_epoch, min_logprob=ic.min_logprob,
                              anchor_bytes=ic.anchor_memory_mb * 1024 * 1024)
        exchange = SwarmExchange(self.policy, self.source, factory(settings, identity), identity,
                                 swarm_id=settings.swarm_id, temperature=g.temperature, top_p=g.top_p,
                                 max_completion_tokens=g.max_new_tokens, max_peer_tokens=g.peer_completion_tokens,
                                 ingest_limits=limits, scorer=self._build_scorer(),
                                 anchor_flat_groups=self.cfg.train.external_shift != 0,
                                 screen=screen_settings(ic, self.cfg.train.external_shift))
        if self._saved_screen is not None:  # the screen's profile and verdicts as the last checkpoint left them
            exchange.load_screen_state(self._saved_screen)
        return exchange

    def _build_scorer(self) -> ScoringWorker | None:
        """A child process for peers' completions when the source's scorers may be slow (started lazily)."""
        if not self.source.isolated_scoring:
            return None
        t = self.cfg.tasks
        spec = SourceSpec(t.source, tuple(t.datasets), tuple(t.weights) if t.weights is not None else None,
                          self.cfg.seed, t.source_options(self.cfg.model.chat_template))
        scorer = ScoringWorker(spec, timeout=self.cfg.ingest.score_timeout)
        scorer.start()  # imports its libraries while the node sets up and takes its first steps
        return scorer

    def _restore(self) -> None:
        found = self.checkpoints.load_latest()  # skips (and warns about) damaged checkpoints
        if found is None:
            return
        path, state = found
        self.policy.load_trainable_state(state.trainable)
        self.trainer.load_optimizer_state(state.optimizer)
        restore_rng(state.rng, self.task_rng, self.sample_gen, self.select_rng)
        if "routing_gen" in state.rng:
            self.trainer.routing_generator.set_state(state.rng["routing_gen"])
        self._signal_history.extend(state.extra.get("signal_history", []))
        if self.decider is not None and "peer_decider" in state.extra:
            self.decider.load_state(state.extra["peer_decider"])
        if isinstance(state.extra.get("screen"), dict):  # for the exchange, built after the restore
            self._saved_screen = state.extra["screen"]
        self.step = state.step
        self.generator.sync()
        logger.info("resumed from %s at step %d", path, self.step)

    def _start_from(self, run: RunStep) -> None:
        """A new run's adapter weights from another run's checkpoint (``adapter.init_from``); the optimizer,
        the step count and the random streams stay the fresh ones of this run."""
        self.policy.load_trainable_state(load_init_state(run))
        self.generator.sync()
        logger.info("adapter weights from %s (step %d of that run); optimizer fresh", run.checkpoint, run.step)

def _write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename (no torn file after a crash)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def load_identity(cfg: NodeConfig, run_dir: Path) -> Identity:
    """The node's Ed25519 identity (``swarm.identity_path``, relative to ``run_dir``), created if missing."""
    path = Path(cfg.swarm.identity_path)
    if not path.is_absolute():
        path = run_dir / path
    try:
        return Identity.load_or_create(path)
    except IdentityError as exc:
        raise ConfigError(f"swarm.identity_path: {exc}") from None


def _dump_yaml(cfg: NodeConfig) -> str:
    import yaml

    data = cfg.model_dump(mode="json")
    if data["api"]["token"] is not None:
        data["api"]["token"] = "<redacted>"  # a secret does not go into a file others may read
    return yaml.safe_dump(data, sort_keys=False)


def screen_settings(ic: IngestConfig, external_shift: float = 0.0) -> ScreenSettings:
    """The ``ingest.screen*`` keys as the ingestor takes them. With a baseline shift on peer groups
    (``train.external_shift``) a completion below its group's mean can be pushed up, so the length bound holds
    every one."""
    return ScreenSettings(enabled=ic.screen, token_floor=ic.screen_token_floor, window=ic.screen_window,
                          span_quantile=ic.screen_span_quantile, span_margin=ic.screen_span_margin,
                          length_quantile=ic.screen_length_quantile, length_ratio=ic.screen_length_ratio,
                          length_all=ic.screen_length_all or external_shift > 0, span_all=ic.screen_span_all,
                          share_dropped=ic.screen_share_to if ic.screen_share_dropped else None,
                          min_own=ic.screen_min_own, pause_share=ic.screen_pause_share,
                          pause_window=ic.screen_pause_window, pause_steps=ic.screen_pause_steps,
                          probation=ic.screen_probation,
                          probation_first=ic.screen_probation_first,
                          probation_base=ic.screen_probation_base,
                          probation_weight=ic.screen_probation_weight, trial=ic.screen_trial,
                          positive_floor=ic.screen_positive_floor, answer_full=ic.screen_answer_full,
                          answer_working=ic.screen_answer_working, reference=ic.screen_reference,
                          profile_rows=ic.screen_profile_rows, profile_every=ic.screen_profile_every,
                          prefix_cache=ic.screen_prefix_cache, read_dtype=ic.screen_read_dtype,
                          sequence_quantile=ic.screen_sequence_quantile,
                          sequence_fail=ic.screen_sequence_fail, group_cap=ic.screen_group_positive_cap,
                          author_cap=ic.screen_author_positive_cap)
