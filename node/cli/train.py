"""``swarm-node silo`` (train alone, no network) and ``swarm-node start`` (a node that joins a swarm): the
checks that need only the file system first, then the node (``node.run``)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import logging.handlers
from collections.abc import Iterator
from pathlib import Path

from node.api.client import api_banner
from node.cli.common import LOG_FORMAT, check_free_ports, load_run_config, setup_logging
from node.config import NodeConfig, with_initial_peers
from node.errors import ConfigError
from node.run.rundir import (
    clear_run_marker,
    missing_dirs,
    prepare_run_dir,
    remove_if_unused,
    write_run_marker,
)
from node.run.saved import init_source
from node.sources.locate import locate_model

__all__ = ["cmd_silo", "cmd_start"]


def _preflight(cfg: NodeConfig) -> None:
    """The checks that need the file system but nothing heavy: a writable run dir, a model that exists, an
    ``adapter.init_from`` that names a checkpoint of this adapter's shape.

    They run before torch and transformers are imported, so these mistakes, like a bad config value,
    are reported within a second or two.
    """
    with contextlib.suppress(OSError):  # prepare_run_dir below says what is wrong with a folder it cannot make
        Path(cfg.run_dir).absolute().parent.mkdir(parents=True, exist_ok=True)
    write_run_marker(cfg.run_dir, api=cfg.api.port is not None)  # the run dir appears with it: status says "starting"
    prepare_run_dir(cfg.run_dir)
    locate_model(cfg.model.name_or_path, gguf_file=cfg.model.gguf_file)
    init_source(cfg)


@contextlib.contextmanager
def _run_log(cfg: NodeConfig) -> Iterator[None]:
    """The node's log also goes to ``RUN_DIR/node.log``, rotated past ``tracking.log_max_mb`` (keeping
    ``tracking.log_backups`` old files), for as long as the command runs."""
    t = cfg.tracking
    handler = logging.handlers.RotatingFileHandler(Path(cfg.run_dir) / "node.log", encoding="utf-8",
                                                   maxBytes=int(t.log_max_mb * 1024 * 1024), backupCount=t.log_backups)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    root = logging.getLogger()
    handler.setLevel(root.level)
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)
        handler.close()


@contextlib.contextmanager
def _run_dir_of_this_run(cfg: NodeConfig) -> Iterator[None]:
    """Check (and create) the run dir; if this invocation created it and fails before a step is recorded,
    remove it again: a mistake leaves no empty run dir behind."""
    created = missing_dirs(cfg.run_dir)
    done = False
    try:
        _preflight(cfg)
        yield
        done = True
    finally:
        clear_run_marker(cfg.run_dir)
        if not done:
            remove_if_unused(created)


def cmd_silo(args: argparse.Namespace) -> int:
    cfg = load_run_config(args)  # validated before the heavy imports below, so a bad config fails at once
    with _run_dir_of_this_run(cfg):
        setup_logging(args.log_level)
        with _run_log(cfg):
            step = _train_silo(cfg, show_progress=not args.no_progress)
    print(f"swarm-node silo: stopped at step {step}; metrics in {Path(cfg.run_dir) / 'metrics.jsonl'}, "
          f"checkpoints in {Path(cfg.run_dir) / 'checkpoints'}", flush=True)
    return 0


def _train_silo(cfg: NodeConfig, *, show_progress: bool) -> int:
    from node.run.node import Node

    node = Node(cfg, show_progress=show_progress)
    node.install_signal_handlers()
    try:
        node.setup()
        print(f"swarm-node silo: run dir {Path(cfg.run_dir).resolve()}", flush=True)
        print(f"swarm-node silo: {node.describe_policy()}", flush=True)
        if cfg.train.steps is None:
            print("swarm-node silo: training until stopped (train.steps is not set; Ctrl-C ends the step and "
                  "writes a checkpoint)", flush=True)
        if node.api is not None:
            print(api_banner(node.api.url), flush=True)
        return node.run()
    finally:
        node.close()


def cmd_start(args: argparse.Namespace) -> int:
    import importlib.util

    from swarm.settings import expand_initial_peers, initial_peers_from_env

    if importlib.util.find_spec("hivemind") is None:
        raise ConfigError("swarm-node start joins a swarm through hivemind, which is not installed here: pip install "
                          "'hivemind>=1.1.10,<1.2' (silo, eval, export, fetch and doctor work without it)")
    try:
        peers = expand_initial_peers(args.initial_peers or [])
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if args.swarm:  # validated before the heavy imports below
        from node.config.join import join_config

        overrides = [*args.overrides, *([f"run_dir={args.run_dir}"] if args.run_dir else [])]
        cfg, notes, descriptor, members = join_config(args.config, overrides, args.swarm, owner=args.swarm_owner,
                                                      extra_peers=peers or initial_peers_from_env())
        for line in notes:
            print(f"swarm-node: {line}", flush=True)
    else:
        if args.swarm_owner:
            raise ConfigError("--swarm-owner goes with --swarm (the fingerprint of the descriptor's owner)")
        cfg, descriptor, members = with_initial_peers(load_run_config(args), peers or None), None, []
    check_free_ports(cfg.swarm.host_maddrs, cfg.api.host, cfg.api.port)
    with _run_dir_of_this_run(cfg):
        if descriptor is not None:
            from node.config.join import save_descriptor

            save_descriptor(cfg.run_dir, descriptor, members)
        setup_logging(args.log_level)
        from node.run.daemon import run_daemon

        with _run_log(cfg):
            return run_daemon(cfg, show_progress=not args.no_progress)
