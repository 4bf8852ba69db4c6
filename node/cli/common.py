"""What the verbs share: exit codes, logging set-up, a config from ``-c`` and ``key=value`` overrides."""

from __future__ import annotations

import argparse
import logging
import sys

from node.config import NodeConfig, load_config, resolve_api

EXIT_USAGE = 2
"""A user's mistake: one line naming the field and the fix."""

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT, stream=sys.stderr)
    logging.getLogger().setLevel(level.upper())  # also when logging was configured before (an embedding program)


def quiet_loading() -> None:
    """No per-file progress bars from transformers while a model loads: one command, one output."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def load_run_config(args: argparse.Namespace) -> NodeConfig:
    """The config of ``silo`` and ``start``: ``--config``, its overrides and ``--run-dir``, validated."""
    overrides = list(args.overrides)
    if args.run_dir:
        overrides.append(f"run_dir={args.run_dir}")
    cfg = load_config(args.config, overrides)
    resolve_api(cfg)  # a public bind without a token is refused before anything starts
    return cfg
