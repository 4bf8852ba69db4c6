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

The parts of a node live beside this module, one job each: ``state`` (what it holds),
``setup`` (the ``_build_*`` builders, resuming), ``peers`` (which peer groups a step trains
on) and ``status`` (what the status API shows). ``Node`` composes them; this module keeps the
lifecycle and the step.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import random
import signal
import time
from collections.abc import Iterator
from typing import Any

import torch
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from node.api.metrics import MetricsWriter, peak_rss_mb
from node.failpoints import crash_point
from node.generation.base import SamplingSettings
from node.generation.rollouts import sample_groups, sample_groups_adaptive, score_tasks_routed, split_by_fit
from node.policy.model import pick_device
from node.run.checkpoint import CheckpointManager, CheckpointState, capture_rng
from node.run.peers import PeerGroupsMixin
from node.run.rundir import prepare_run_dir
from node.run.saved import init_source
from node.run.setup import SetupMixin, load_identity
from node.run.state import TransportFactory
from node.run.status import StatusMixin
from node.run.tracking import build_trackers
from node.tasks import Task
from node.train.groups import TrainGroup, assign_advantages

__all__ = ["Node", "TransportFactory", "load_identity", "stream_seed"]

logger = logging.getLogger(__name__)


def stream_seed(seed: int, stream: str) -> int:
    """The seed of the node's named random stream (64 bits of a sha256 of the node seed and the name)."""
    return int.from_bytes(hashlib.sha256(f"{stream}/{seed}".encode()).digest()[:8], "big")


class Node(SetupMixin, PeerGroupsMixin, StatusMixin):
    """A training node; ``exchange`` is None in silo mode (no ``transport`` given). Its state and
    constructor are ``node.run.state.NodeState``'s."""

    # ----- setup: ordering matters -- a missing generation engine fails before any model loads; the policy
    # exists before the trainer (its parameters) and the generator (an engine seeds the global RNGs when it
    # starts); the checkpoint is restored over freshly seeded state and handed to the generator; the
    # exchange comes after them, so a broken model or config fails before any network is touched; the API
    # last, once there is a node to report on.
    def setup(self) -> None:
        prepare_run_dir(self.run_dir)
        self._record_config()
        if self.cfg.generation.backend == "vllm":
            from node.generation.vllm_engine import require_vllm

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
                                     eval_every=self.cfg.train.eval_every or 1)
        self.tracking = build_trackers(self.cfg, self.run_dir, self.step)
        self.eval_tasks: list[Task] = self._build_eval_tasks()
        if self._transport_factory is not None:
            self.exchange = self._build_exchange(self._transport_factory)
        self.board.set_info(self._node_info())
        self._publish_resumed()
        self.board.set_state("ready")
        if self.cfg.api.port is not None:
            self.api = self._build_api()

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
        self.board.set_state("training")
        saved = self.step
        try:
            with self._progress(total) as bar:
                saved = self._run_steps(total, bar, saved)
            if self.stop_requested:
                self.board.set_state("stopping")
            if self.stop_requested and saved != self.step:
                self.save_checkpoint()
        finally:
            self.board.set_state("finished" if total is not None and self.step >= total else "stopped")
        return self.step

    def _run_steps(self, total: int | None, bar: tqdm, saved: int) -> int:
        """Steps until ``total`` or a stop signal, checkpoints when due; returns the last step saved."""
        while (total is None or self.step < total) and not self.stop_requested:
            record = self.train_step()
            bar.update(1)
            bar.set_postfix(reward=f"{record['reward_mean']:.3f}", tok_s=f"{record['tokens_per_s']:.0f}",
                            **({"eval": f"{record['eval_accuracy']:.3f}"} if "eval_accuracy" in record else {}))
            if self._checkpoint_due(total):
                self.save_checkpoint()
                saved = self.step
        return saved

    @contextlib.contextmanager
    def _progress(self, total: int | None) -> Iterator[tqdm]:
        """The steps' progress bar (an evaluation shows on it too); while it shows, log lines print above it."""
        bar = tqdm(total=total, initial=self.step, disable=not self.show_progress, unit="step", dynamic_ncols=True)
        self._bar = bar
        try:
            with logging_redirect_tqdm() if self.show_progress else contextlib.nullcontext():
                yield bar
        finally:
            self._bar = None
            bar.close()

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
        own_cap, j = self._plan(len(local), len(with_signal))
        external: list[TrainGroup] = []
        if self.exchange is not None:
            self.exchange.observe_own(local)  # what peers' text is held to
            self.exchange.share(self.step, sampled)
            external = self._select_external(epoch, j)
            self.exchange.read_reference(external)  # the frozen base reads what the screen will judge
        t_exchange = time.perf_counter() - t_gen
        self._count_trained(external)
        # I local groups with signal (all of them when no more were generated), then the external ones.
        signal_groups = with_signal[:own_cap] + external
        histograms = self.tracking.wants_histograms(self.step + 1)
        t_train = time.perf_counter()
        screen = self.exchange.screen_bounds() if self.exchange is not None else None
        stats = self.trainer.step(signal_groups, keep_distributions=histograms, screen=screen)
        if self.exchange is not None:  # every step: a pause is counted in steps
            self.exchange.record_screened(self.trainer.screened, self.step + 1)
        t_train = time.perf_counter() - t_train
        if self.decider is not None:
            self.decider.observe(stats.get("peer_alignment"))
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
            "gen_seconds": t_gen - t0,  # sampling, scoring included: with train_seconds, where a step goes
            "train_seconds": t_train,
            "local_signal_fraction": len(with_signal) / max(len(local), 1),
            "n_local_groups": sum(1 for grp in signal_groups if grp.is_local),
            "n_peer_groups": sum(1 for grp in signal_groups if not grp.is_local),
            "grad_norm": stats.get("grad_norm", 0.0),
            "tasks_too_long": len(too_long),
            "peak_rss_mb": round(peak_rss_mb()),
        }
        if self.policy.device.type == "cuda":  # what this node took of the card (its allocator's high-water mark)
            record["device_peak_mb"] = round(torch.cuda.max_memory_reserved(self.policy.device) / 2**20)
        record.update({f"train/{k}": v for k, v in stats.items() if k not in ("loss", "grad_norm")})
        record.update({f"gen/{k}": v for k, v in sync.items()})
        if self.policy.remix is not None:
            record["router_entropy"] = self.policy.remix.router_entropy()
        if self.decider is not None:
            record.update(self.decider.metrics())
        if self.exchange is not None:
            record["exchange_seconds"] = t_exchange
            record["peer_reward_mean"] = _mean([r for grp in external for r in grp.rewards])  # re-scored here
            record.update(self.exchange.metrics())
        if self._evaluation_due():
            record["eval_accuracy"] = self.evaluate()
            record.update(self.eval_details)  # by dataset; ReMix: its routing of the held-out prompts
            self._last_eval = (self.step, record["eval_accuracy"])
        row = self.metrics.write(record)
        self.tracking.log(self.step, row, self.trainer.distributions if histograms else None)
        self._publish_status(row)
        return record

    def _report_too_long(self, tasks: list[Task]) -> None:
        """Tasks set aside because their prompt fills the model's context: counted in the metrics
        (``tasks_too_long``), a warning the first time, debug after that."""
        if not tasks:
            return
        level = logging.DEBUG if self._warned_too_long else logging.WARNING
        self._warned_too_long = True
        logger.log(level, "%d task(s) skipped this step: prompt at least as long as the %s-token context "
                   "(first: %s)", len(tasks), self.generator.max_len, tasks[0].ref.key())

    def _evaluation_due(self) -> bool:
        """Every ``train.eval_every`` steps and at a run's last step; never when it is 0 or null."""
        every = self.cfg.train.eval_every
        if not every:
            return False
        return self.step % every == 0 or self.step == self.cfg.train.steps

    def evaluate(self) -> float:
        """The greedy mean reward on the held-out tasks (logged as ``eval_accuracy``). On a real model it
        takes minutes, so it says so: on the progress bar while it runs, and in the log."""
        n, g = len(self.eval_tasks), self.cfg.generation
        logger.info("evaluating %d held-out tasks (greedy) ...", n)
        if self._bar is not None:
            self._bar.set_description_str(f"evaluating {n} tasks", refresh=True)
        started = time.perf_counter()
        try:
            scores, routings = score_tasks_routed(self.generator, self.policy, self.source, self.eval_tasks,
                                                  SamplingSettings(max_new_tokens=g.max_new_tokens, greedy=True))
        finally:
            if self._bar is not None:
                self._bar.set_description_str("", refresh=True)
        value = sum(scores) / n if n else float("nan")
        self.eval_details = eval_details(self.eval_tasks, scores, routings, self.policy.remix, self._eval_routing)
        if self.policy.remix is not None and all(r is not None for r in routings) and routings:
            self._eval_routing = torch.stack(routings)  # type: ignore[arg-type]
        logger.info("evaluated %d held-out tasks in %.1f s: greedy mean reward %.3f", n,
                    time.perf_counter() - started, value)
        return value

    def save_checkpoint(self) -> None:
        rng = capture_rng(self.task_rng, self.sample_gen, self.select_rng)
        rng["routing_gen"] = self.trainer.routing_generator.get_state()
        extra: dict[str, Any] = {"model": self.cfg.model.name_or_path,
                                 "mode": "silo" if self.exchange is None else "swarm",
                                 "signal_history": list(self._signal_history)}
        if self.decider is not None:
            extra["peer_decider"] = self.decider.state()
        if self.exchange is not None:  # the screen's profile and verdicts: a restart frees no paused author
            extra["screen"] = self.exchange.screen_state()
        self.checkpoints.save(CheckpointState(step=self.step, trainable=self.policy.trainable_state(),
                                              optimizer=self.trainer.optimizer_state(), rng=rng, extra=extra))

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


def eval_details(tasks: list[Task], scores: list[float], routings: list[torch.Tensor | None], remix: Any,
                 previous: torch.Tensor | None) -> dict[str, Any]:
    """An evaluation's metrics beyond ``eval_accuracy``: ``eval_by_dataset`` (the greedy mean reward of each
    dataset's held-out tasks) and, for ReMix, the ``routing_*`` diagnostics of the held-out prompts'
    routing (``node.policy.remix.stats``; ``previous``: the last evaluation's routing)."""
    by: dict[str, list[float]] = {}
    for task, score in zip(tasks, scores):
        by.setdefault(task.ref.dataset, []).append(score)
    out: dict[str, Any] = {"eval_by_dataset": {name: sum(v) / len(v) for name, v in by.items()}}
    if remix is not None and routings and all(r is not None for r in routings):
        from node.policy.remix.stats import routing_metrics

        out.update(routing_metrics(remix, torch.stack(routings), [t.ref.dataset for t in tasks],  # type: ignore[arg-type]
                                   previous))
    return out


