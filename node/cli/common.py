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


def check_free_ports(host_maddrs: list[str], api_host: str | None = None, api_port: int | None = None,
                     *, api_key: str = "api.port") -> None:
    """A ``ConfigError`` (one line, exit 2) when a fixed listen port of ``swarm.host_maddrs`` or the status
    page's port is taken by another process: p2pd would share the port without a word (``swarm.ports``)."""
    from node.errors import ConfigError
    from swarm.ports import free_port_after, listen_port_taken, taken_listen_addresses

    for maddr, port in taken_listen_addresses(host_maddrs):
        raise ConfigError(f"swarm.host_maddrs: port {port} ({maddr}) is taken: another process listens there "
                          "(another swarm-node or host on this machine?); choose another port, or /tcp/0 for any "
                          "free one")
    if api_host is not None and api_port:
        import socket

        family = socket.AF_INET6 if ":" in api_host else socket.AF_INET
        if listen_port_taken(api_host, api_port, family=family):
            free = free_port_after(api_host, api_port, family=family)
            example = f"e.g. {api_key}={free} (free now), or " if free is not None else ""
            raise ConfigError(f"{api_key}: port {api_port} on {api_host} is taken: another process listens there "
                              f"(another node's status page?); choose another, {example}{api_key}=0 for any free one")
