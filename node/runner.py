"""The node's lifecycle: ``setup()``, ``run()``, ``close()``.

One step: sample local tasks, generate G completions each, score them with the tasks' own verifiers,
(in swarm mode: publish them and collect peers'), mix I local and J external groups, one trainer step,
metrics; a checkpoint every ``train.checkpoint_every`` steps. Silo mode is the same loop with no exchange.

Randomness comes from separate seeded streams, all checkpointed: ``task_rng`` draws the node's tasks,
``select_rng`` picks peer groups and ``sample_gen`` drives generation. Task draws never depend on what
peers sent, so a silo node and a swarm node with the same seed train on the same task stream.

``Node`` is the one place a node is built, with or without an exchange: ``transport=None`` gives a silo
node; a ``TransportFactory`` (the hivemind ``SwarmTransport`` in a daemon, an in-memory hub's transport in
benchmarks and tests) gives a swarm node whose exchange is built last in ``setup()``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import signal
import statistics
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from tqdm import tqdm

from node.api.board import NodeInfo, PeerIngest, StatusBoard, StepSnapshot, freeze_record
from node.checkpoint import CheckpointManager, CheckpointState, capture_rng, restore_rng
from node.config import NodeConfig, resolve_api
from node.engines.base import GenerationBackend, SamplingSettings
from node.engines.hf import HFBackend
from node.errors import ConfigError, TaskError
from node.exchange import BatchTransport, SwarmExchange
from node.failpoints import crash_point
from node.ingest import IngestLimits
from node.metrics import MetricsWriter, peak_rss_mb, read_metrics
from node.policy.model import Policy, build_policy, pick_device
from node.rollouts import greedy_accuracy, sample_groups, sample_groups_adaptive, split_by_fit
from node.rundir import prepare_run_dir, say_config_changes
from node.runs import RunStep, init_source, load_init_state
from node.scoring import ScoringWorker, SourceSpec
from node.tasks import Task, TaskSource, build_task_source
from node.tracking import Trackers, build_trackers
from node.train.groups import TrainGroup, assign_advantages
from node.train.sampler import CandidateGroup, mix, preference_weights
from node.train.trainer import Trainer
from protocol.errors import IdentityError
from protocol.identity import Identity
from swarm.peer_book import MAX_TRACKED_PEERS
from swarm.settings import SwarmSettings

if TYPE_CHECKING:
    from node.api.server import ApiServer

logger = logging.getLogger(__name__)

_MAX_POOL_PER_J = 64  # peer groups held for selection, per external group trained on a step
_RECENT_STEPS = 20  # the status API's speed is the median of this many recent steps

TransportFactory = Callable[[SwarmSettings, Identity], BatchTransport]
"""Builds (and starts) the transport of a swarm node from its settings and identity."""


def stream_seed(seed: int, stream: str) -> int:
    """The seed of the node's named random stream (64 bits of a sha256 of the node seed and the name)."""
    return int.from_bytes(hashlib.sha256(f"{stream}/{seed}".encode()).digest()[:8], "big")


class Node:
    """A training node; ``exchange`` is None in silo mode (no ``transport`` given)."""

    def __init__(self, cfg: NodeConfig, run_dir: str | Path | None = None, *, show_progress: bool = True,
                 transport: TransportFactory | None = None) -> None:
        self.cfg = cfg
        self.run_dir = Path(cfg.run_dir if run_dir is None else run_dir)
        self.show_progress = show_progress
        self.stop_requested = False
        self.step = 0
        self.exchange: SwarmExchange | None = None
        self._transport_factory = transport
        self._external_pool: list[TrainGroup] = []
        self._trained_by_peer: OrderedDict[str, int] = OrderedDict()  # peer groups trained on, by peer (most recent last)
        # Per step, the node's own groups by dataset: [generated, with signal] (for dataset preferences).
        self._signal_history: deque[dict[str, list[float]]] = deque(maxlen=cfg.sapo.signal_window)
        self.board = StatusBoard()
        self._started_at = time.time()
        self.api: ApiServer | None = None
        self._last_eval: tuple[int, float] | None = None
        self._warned_too_long = False
        self._recent: deque[tuple[float, float]] = deque(maxlen=_RECENT_STEPS)  # (step seconds, tokens/s)
        self.tracking = Trackers([], histogram_every=1)  # the configured ones are built in setup()

    # ----- setup: ordering matters -- a missing generation engine fails before any model loads; the policy
    # exists before the trainer (its parameters) and the generator (an engine seeds the global RNGs when it
    # starts); the checkpoint is restored over freshly seeded state and handed to the generator; the
    # exchange comes after them, so a broken model or config fails before any network is touched; the API
    # last, once there is a node to report on.
    def setup(self) -> None:
        prepare_run_dir(self.run_dir)
        self._record_config()
        if self.cfg.generation.backend == "vllm":
            from node.engines.vllm_engine import require_vllm

            require_vllm(pick_device(self.cfg.model.device))
        init = init_source(self.cfg)  # a wrong adapter.init_from fails before any model loads
        self.policy = self._build_policy()
        self.source = self._build_task_source()
        self.trainer = self._build_trainer()
        self.generator = self._build_generator()
        self.task_rng = random.Random(self.cfg.seed)
        self.select_rng = random.Random(stream_seed(self.cfg.seed, "select"))
        self.sample_gen = torch.Generator(device=self.policy.device).manual_seed(self.cfg.seed)
        self.checkpoints = CheckpointManager(self.run_dir, self.cfg.train.keep_checkpoints,
                                             keep_every=self.cfg.train.keep_every)
        self._restore()
        if init is not None and self.step == 0:
            self._start_from(init)
        self.metrics = MetricsWriter(self.run_dir / "metrics.jsonl", resume_step=self.step,
                                     max_bytes=int(self.cfg.tracking.metrics_max_mb * 1024 * 1024),
                                     eval_every=self.cfg.train.eval_every)
        self.tracking = build_trackers(self.cfg, self.run_dir, self.step)
        self.eval_tasks: list[Task] = self._build_eval_tasks()
        if self._transport_factory is not None:
            self.exchange = self._build_exchange(self._transport_factory)
        self.board.set_info(self._node_info())
        self._publish_resumed()
        self.board.set_state("ready")
        if self.cfg.api.port is not None:
            self.api = self._build_api()

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
        g, m = self.cfg.generation, self.cfg.model
        if g.backend == "hf":
            return HFBackend(self.policy, batch_size=g.batch_size)
        from node.engines.vllm_engine import VLLMBackend, base_model_path

        return VLLMBackend(self.policy, base_model_path(self.policy), g.vllm, dtype=m.dtype,
                           max_num_seqs=g.batch_size, seed=self.cfg.seed, trust_remote_code=m.trust_remote_code,
                           lora_rank=self.cfg.adapter.rank)

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
        return Trainer(self.policy, lr=tc.lr, norm_lr=ac.norm_lr, router_lr=ac.remix.router_lr,
                       weight_decay=tc.weight_decay, max_grad_norm=tc.max_grad_norm, loss=tc.loss,
                       eps_low=tc.eps_low, eps_high=tc.eps_high, length_norm=tc.length_norm,
                       micro_batch_size=tc.micro_batch_size, temperature=self.cfg.generation.temperature,
                       routings=ac.remix.routings, off_policy_correction=tc.off_policy_correction, seed=self.cfg.seed,
                       gradient_checkpointing=tc.gradient_checkpointing, logits_memory_mb=tc.logits_memory_mb,
                       engine_is_cap=tc.engine_is_cap, optimizer_steps=tc.optimizer_steps,
                       loss_denominator=(self.cfg.sapo.local_groups * self.cfg.generation.group_size
                                         if tc.loss_denominator == "fixed" else None))

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
        return SwarmExchange(self.policy, self.source, factory(settings, identity), identity,
                             swarm_id=settings.swarm_id, temperature=g.temperature, top_p=g.top_p,
                             max_completion_tokens=g.max_new_tokens, max_peer_tokens=g.peer_completion_tokens,
                             ingest_limits=limits, scorer=self._build_scorer(),
                             anchor_flat_groups=self.cfg.train.external_shift != 0)

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
        self.trainer.optimizer.load_state_dict(state.optimizer)
        restore_rng(state.rng, self.task_rng, self.sample_gen, self.select_rng)
        if "routing_gen" in state.rng:
            self.trainer.routing_generator.set_state(state.rng["routing_gen"])
        self._signal_history.extend(state.extra.get("signal_history", []))
        self.step = state.step
        self.generator.sync()
        logger.info("resumed from %s at step %d", path, self.step)

    def _start_from(self, run: RunStep) -> None:
        """A new run's adapter weights from another run's checkpoint (``adapter.init_from``); the optimizer,
        the step count and the random streams stay the fresh ones of this run."""
        self.policy.load_trainable_state(load_init_state(run))
        self.generator.sync()
        logger.info("adapter weights from %s (step %d of that run); optimizer fresh", run.checkpoint, run.step)

    # ----- run
    def install_signal_handlers(self) -> None:
        """SIGINT/SIGTERM: finish the current step, checkpoint, exit cleanly. A second SIGINT aborts."""

        def handler(signum: int, _frame: object) -> None:
            if self.stop_requested and signum == signal.SIGINT:
                raise KeyboardInterrupt
            self.stop_requested = True
            logger.warning("signal %d: stopping after this step", signum)

        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGTERM, handler)

    def run(self) -> int:
        """Train until ``train.steps`` (until a stop signal when it is None); return the last completed step."""
        total = self.cfg.train.steps
        bar = tqdm(total=total, initial=self.step, disable=not self.show_progress, unit="step", dynamic_ncols=True)
        self.board.set_state("training")
        saved = self.step
        try:
            while (total is None or self.step < total) and not self.stop_requested:
                record = self.train_step()
                bar.update(1)
                bar.set_postfix(reward=f"{record['reward_mean']:.3f}", tok_s=f"{record['tokens_per_s']:.0f}",
                                **({"eval": f"{record['eval_accuracy']:.3f}"} if "eval_accuracy" in record else {}))
                if self._checkpoint_due(total):
                    self.save_checkpoint()
                    saved = self.step
            if self.stop_requested:
                self.board.set_state("stopping")
            if self.stop_requested and saved != self.step:
                self.save_checkpoint()
        finally:
            bar.close()
            self.board.set_state("finished" if total is not None and self.step >= total else "stopped")
        return self.step

    def _checkpoint_due(self, total: int | None) -> bool:
        """A checkpoint every ``train.checkpoint_every`` steps, at each milestone (``train.keep_every``) and
        at the last step."""
        tc = self.cfg.train
        milestone = tc.keep_every is not None and self.step % tc.keep_every == 0
        return self.step % tc.checkpoint_every == 0 or milestone or self.step == total

    def train_step(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        cfg = self.cfg
        epoch = self.exchange.current_epoch() if self.exchange is not None else 0
        refs = self.source.sample(cfg.sapo.generated_groups or cfg.sapo.local_groups, self.task_rng)
        tasks, too_long = split_by_fit(self.policy, self.source, [self.source.task(r) for r in refs],
                                       self.generator.max_len)
        self._report_too_long(too_long)
        g = cfg.generation
        settings = SamplingSettings(max_new_tokens=g.max_new_tokens, temperature=g.temperature, top_p=g.top_p)
        common: dict[str, Any] = dict(settings=settings, generator=self.sample_gen, epoch=epoch)
        if cfg.sampling.mode == "standard":
            sampled = sample_groups(self.generator, self.policy, self.source, tasks, group_size=g.group_size, **common)
        else:
            sampled = sample_groups_adaptive(self.generator, self.policy, self.source, tasks, group_size=g.group_size,
                                             round_size=cfg.sampling.round_size, max_rounds=cfg.sampling.max_rounds,
                                             mode=cfg.sampling.mode, positive_threshold=cfg.sampling.positive_threshold,
                                             **common)
        t_gen = time.perf_counter()
        crash_point("generation")
        local = [s.group for s in sampled]
        with_signal = assign_advantages(local, cfg.train.advantage)
        self._record_signal(local, with_signal)
        external: list[TrainGroup] = []
        if self.exchange is not None:
            self.exchange.share(self.step, sampled)
            external = self._select_external(epoch)
        t_exchange = time.perf_counter() - t_gen
        self._count_trained(external)
        # I local groups with signal (all of them when no more were generated), then the J external ones.
        signal_groups = with_signal[: cfg.sapo.local_groups] + external
        histograms = self.tracking.wants_histograms(self.step + 1)
        stats = self.trainer.step(signal_groups, keep_distributions=histograms)
        sync = self.generator.sync()  # the next step samples from the updated policy
        self.step += 1
        dt = time.perf_counter() - t0
        rewards = [r for grp in local for r in (grp.all_rewards or grp.rewards)]  # everything sampled
        n_gen_tokens = sum(len(c) for grp in local for c in grp.completions)
        record: dict[str, Any] = {
            "step": self.step,
            "time": time.time(),
            "reward_mean": sum(rewards) / max(len(rewards), 1),
            "loss": stats.get("loss", 0.0),
            "tokens_per_s": (n_gen_tokens + stats.get("n_tokens", 0.0)) / max(dt, 1e-9),
            "gen_tokens_per_s": n_gen_tokens / max(t_gen - t0, 1e-9),
            "step_seconds": dt,
            "local_signal_fraction": len(with_signal) / max(len(local), 1),
            "n_local_groups": sum(1 for grp in signal_groups if grp.is_local),
            "n_peer_groups": sum(1 for grp in signal_groups if not grp.is_local),
            "grad_norm": stats.get("grad_norm", 0.0),
            "tasks_too_long": len(too_long),
            "peak_rss_mb": round(peak_rss_mb()),
        }
        record.update({f"train/{k}": v for k, v in stats.items() if k not in ("loss", "grad_norm")})
        record.update({f"gen/{k}": v for k, v in sync.items()})
        if self.policy.remix is not None:
            record["router_entropy"] = self.policy.remix.router_entropy()
        if self.exchange is not None:
            record["exchange_seconds"] = t_exchange
            record["peer_reward_mean"] = _mean([r for grp in external for r in grp.rewards])  # re-scored here
            record.update(self.exchange.metrics())
        if self.step % cfg.train.eval_every == 0 or self.step == cfg.train.steps:
            record["eval_accuracy"] = self.evaluate()
            self._last_eval = (self.step, record["eval_accuracy"])
        row = self.metrics.write(record)
        self.tracking.log(self.step, row, self.trainer.distributions if histograms else None)
        self._publish_status(row)
        return record

    def _count_trained(self, external: list[TrainGroup]) -> None:
        """Peer groups trained on, per peer (the status API's peers list), for as many peers as ingestion
        tracks."""
        for grp in external:
            self._trained_by_peer[grp.peer_id] = self._trained_by_peer.pop(grp.peer_id, 0) + 1
        while len(self._trained_by_peer) > MAX_TRACKED_PEERS:
            self._trained_by_peer.popitem(last=False)

    def _report_too_long(self, tasks: list[Task]) -> None:
        """Tasks set aside because their prompt fills the model's context: counted in the metrics
        (``tasks_too_long``), a warning the first time, debug after that."""
        if not tasks:
            return
        level = logging.DEBUG if self._warned_too_long else logging.WARNING
        self._warned_too_long = True
        logger.log(level, "%d task(s) skipped this step: prompt at least as long as the %s-token context "
                   "(first: %s)", len(tasks), self.generator.max_len, tasks[0].ref.key())

    def _record_signal(self, local: list[TrainGroup], with_signal: list[TrainGroup]) -> None:
        """Remember, by dataset, how many of this step's own groups were generated, how many carried signal
        and the sum of their mean rewards."""
        counts: dict[str, list[float]] = {}
        kept = {id(grp) for grp in with_signal}
        for grp in local:
            entry = counts.setdefault(grp.dataset, [0, 0, 0.0])
            drawn = grp.all_rewards or grp.rewards
            entry[0] += 1
            entry[1] += int(id(grp) in kept)
            entry[2] += sum(drawn) / max(len(drawn), 1)
        self._signal_history.append(counts)

    def _window_rates(self, column: int) -> dict[str, float]:
        """Per dataset, column ``column`` of the window's own-group counts over the groups generated (entries
        of checkpoints written before a column existed are left out of its rate)."""
        totals: dict[str, list[float]] = {}
        for counts in self._signal_history:
            for dataset, entry in counts.items():
                if len(entry) > column:
                    total = totals.setdefault(dataset, [0, 0.0])
                    total[0] += entry[0]
                    total[1] += entry[column]
        return {d: value / n for d, (n, value) in totals.items() if n > 0}

    def signal_rates(self) -> dict[str, float]:
        """The fraction of the node's own groups of each dataset that carried signal, over the window."""
        return self._window_rates(1)

    def success_rates(self) -> dict[str, float]:
        """The node's own mean reward on each dataset, over the window."""
        return self._window_rates(2)

    def _dataset_weights(self, datasets: list[str]) -> dict[str, float] | None:
        sapo, tasks = self.cfg.sapo, self.cfg.tasks
        mixture = dict(zip(tasks.datasets, tasks.weights or [1.0] * len(tasks.datasets)))
        return preference_weights(datasets, sapo.dataset_preference, mixture=mixture,
                                  signal_rates=self.signal_rates(), floor=sapo.preference_floor)

    def _publish_resumed(self) -> None:
        """After a resume, the API starts from the last step already done, not from nothing."""
        rows = read_metrics(self.metrics.path) if self.step else []
        evals = [r for r in rows if isinstance(r.get("eval_accuracy"), float)]
        if evals:
            self._last_eval = (int(evals[-1]["step"]), float(evals[-1]["eval_accuracy"]))
        if rows and rows[-1].get("step") == self.step:
            self._publish_status(rows[-1])

    def _publish_status(self, row: dict[str, Any]) -> None:
        """Hand the API an immutable picture of this step (a few small copies; no tensors)."""
        ex = self.exchange
        exchange: dict[str, Any] = {}
        if isinstance(row.get("step_seconds"), float):
            self._recent.append((row["step_seconds"], float(row.get("tokens_per_s") or 0.0)))
        if self._recent:
            exchange.update(recent_steps=len(self._recent),
                            step_seconds_median=statistics.median(r[0] for r in self._recent),
                            tokens_per_s_median=statistics.median(r[1] for r in self._recent))
        if ex is not None:
            exchange = {"published_batches": ex.seq, "published_groups": ex.groups_shared,
                        "peer_ingest": {peer: PeerIngest(groups_accepted=n, groups_rejected=dict(rejected),
                                                         groups_trained=self._trained_by_peer.get(peer, 0))
                                        for peer, (n, rejected) in ex.ingestor.by_peer.items()}}
        self.board.publish(StepSnapshot(step=self.step, record=freeze_record(row), last_eval=self._last_eval,
                                        **exchange))

    def _select_external(self, epoch: int) -> list[TrainGroup]:
        """Add freshly received peer groups to the pool, drop stale ones, pick up to J (never waits)."""
        if self.exchange is None:
            return []
        sapo = self.cfg.sapo
        # Only what the pool can hold is ingested (none when J is 0). Advantages once, on arrival; a group
        # without signal never gains any, so it is not kept.
        capacity = _MAX_POOL_PER_J * sapo.external_groups
        room = min(self.cfg.ingest.max_groups_per_step, max(0, capacity - len(self._external_pool)))
        arrived = assign_advantages(self.exchange.receive(self.step, max_groups=room), self.cfg.train.advantage,
                                    self.cfg.train.external_shift)
        fresh = [grp for grp in self._external_pool + arrived if grp.epoch >= epoch - sapo.staleness_epochs]
        self._external_pool = fresh[-max(capacity, 1) :]  # newest kept
        if sapo.external_groups == 0 or not self._external_pool:
            return []
        candidates = [CandidateGroup(key=grp.key, peer_id=grp.peer_id, epoch=grp.epoch,
                                     rewards=torch.tensor(grp.rewards), advantages=grp.advantages, payload=grp,
                                     dataset=grp.dataset)
                      for grp in self._external_pool if grp.advantages is not None]
        weights = self._dataset_weights([c.dataset for c in candidates])
        above = self.success_rates() if sapo.peer_filter == "above_own" else None
        _, chosen = mix([], candidates, 0, sapo.external_groups, sapo.selection, max_per_peer=sapo.max_per_peer,
                        current_epoch=epoch, staleness_epochs=sapo.staleness_epochs, rng=self.select_rng,
                        dataset_weights=weights, above_reward=above)
        picked = {id(c.payload) for c in chosen}
        self._external_pool = [grp for grp in self._external_pool if id(grp) not in picked]  # each used once
        return [c.payload for c in chosen]

    def evaluate(self) -> float:
        g = self.cfg.generation
        return greedy_accuracy(self.generator, self.policy, self.source, self.eval_tasks,
                               max_new_tokens=g.max_new_tokens)

    def save_checkpoint(self) -> None:
        rng = capture_rng(self.task_rng, self.sample_gen, self.select_rng)
        rng["routing_gen"] = self.trainer.routing_generator.get_state()
        extra = {"model": self.cfg.model.name_or_path, "mode": "silo" if self.exchange is None else "swarm",
                 "signal_history": list(self._signal_history)}
        self.checkpoints.save(CheckpointState(step=self.step, trainable=self.policy.trainable_state(),
                                              optimizer=self.trainer.optimizer.state_dict(), rng=rng, extra=extra))

    def close(self) -> None:
        if self.api is not None:  # first: it reads what the rest of close() shuts
            self.api.stop()
            (self.run_dir / "api_url").unlink(missing_ok=True)
            self.api = None
        if getattr(self, "generator", None) is not None:
            self.generator.close()
        if getattr(self, "metrics", None) is not None:
            self.metrics.close()
        self.tracking.close()
        if self.exchange is not None:
            self.exchange.close()


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


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
