"""``swarm-node host --swarm FILE|URL``: run one of a swarm's hosts, a member without a model.

Everything is checked before the network starts, each mistake one line and exit code 2: the descriptor
(signature, pinned owner, expiry, protocol), the host's config (``configs/host.yaml``, overrides; a
shared setting set otherwise than the descriptor says is refused, as for a member) and the host's
libp2p key, which must be one the descriptor lists a host address for (``swarm-node swarm init
--host-key`` made it). The host listens on every interface at the ports of its listed addresses and
announces them as listed (an IP or a DNS name), dials the swarm's other hosts, and serves its status
page, ``/healthz``, ``/metrics`` and the descriptor itself at ``/swarm.yaml`` (``api.port``, 8780).

The process imports no torch (``swarm.hivemind_lean`` loads hivemind's DHT without it), so a host
costs tens of megabytes, not gigabytes.
"""

from __future__ import annotations

import argparse
import logging
import logging.handlers
import os
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from node.errors import ConfigError

__all__ = ["add_host_parser", "cmd_host", "descriptor_url", "join_command"]

logger = logging.getLogger(__name__)

_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
MEMBER_CONFIG = "configs/public-swarm.yaml"
MEMBER_RUN_DIR = "runs/public"
STATE_FILE = "members.json"
"""Run-dir file of the host's member table and the swarm's history per epoch, kept across restarts."""


def join_command(url: str) -> str:
    """The command a member joins with (docs/swarm.md, "Join a swarm", gives the same; ``swarm init`` and
    ``host`` print it)."""
    return f"swarm-node start --swarm {url} -c {MEMBER_CONFIG} --run-dir {MEMBER_RUN_DIR}"


def descriptor_url(host: str, port: int) -> str:
    """Where a host at multiaddr ``host`` serves the descriptor, its page on ``port``."""
    return f"http://{_public_name(host)}:{port}/swarm.yaml"


def add_host_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    host = sub.add_parser("host", help="run a host of a swarm: no model; members join through it, NATed ones hand "
                          "it their batches; a status page of the swarm")
    host.add_argument("--swarm", required=True, metavar="FILE_OR_URL", help="the swarm's signed descriptor")
    host.add_argument("--swarm-owner", metavar="SHA256:...", help="the owner fingerprint the swarm publishes")
    host.add_argument("--config", "-c", help="host config (e.g. configs/host.yaml; defaults apply when omitted)")
    host.add_argument("--run-dir", help="where the host keeps its keys, log and api_url (default runs/host)")
    host.add_argument("--p2p-key", help="the host's libp2p key (default RUN_DIR/p2p.key): the one "
                      "`swarm-node swarm init --host-key` made, whose peer id the descriptor lists")
    host.add_argument("--log-level", default=os.environ.get("SWARM_NODE_LOG", "INFO"))
    host.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. api.port=8781")


@dataclass
class HostPlan:
    """What a host runs with, every part checked."""

    cfg: Any  # HostConfig
    descriptor: Any  # SwarmDescriptor
    own: list[str]
    others: list[str]
    notes: list[str]


def _listen_addresses(own: list[str]) -> list[str]:
    """Every interface, at the port of each address the descriptor lists for this host."""
    found = []
    for maddr in own:
        parts = maddr.rpartition("/p2p/")[0].strip("/").split("/")
        family = "/ip6/::" if parts[0] == "ip6" else "/ip4/0.0.0.0"
        found.append(family + "/" + "/".join(parts[2:]))
    return list(dict.fromkeys(found))


def _public_name(maddr: str) -> str:
    """The IP or DNS name of a multiaddr (``/dns4/host.example.org/tcp/31337/...`` -> ``host.example.org``)."""
    parts = maddr.strip("/").split("/")
    return f"[{parts[1]}]" if parts[0] == "ip6" else parts[1]


def host_plan(args: argparse.Namespace) -> HostPlan:
    from node.config import load_config_data
    from node.config.host import validate_host_config
    from node.config.join import apply_descriptor, get_key, read_descriptor, set_key, trust_descriptor
    from node.run.rundir import prepare_run_dir
    from swarm.p2p_keys import P2pKeyError, ensure_p2p_key

    descriptor = read_descriptor(args.swarm)
    notes = trust_descriptor(descriptor, owner=args.swarm_owner)
    data = load_config_data(args.config, [*args.overrides, *([f"run_dir={args.run_dir}"] if args.run_dir else [])])
    apply_descriptor(data, descriptor, hardware=None, section="swarm")
    run_dir = Path(str(data.get("run_dir") or "runs/host"))
    key = Path(args.p2p_key or get_key(data, "swarm.p2p_identity_path")[1] or "p2p.key")
    key = key if key.is_absolute() else run_dir / key
    prepare_run_dir(run_dir)
    try:
        peer = ensure_p2p_key(key)
    except P2pKeyError as exc:
        raise ConfigError(f"--p2p-key: {exc}") from None
    own = [h for h in descriptor.hosts if h.endswith("/p2p/" + peer)]
    if not own:
        raise ConfigError(f"--p2p-key {key}: its peer id {peer} is none of the swarm's hosts; pass the key "
                          f"`swarm-node swarm init --host-key` made, or list this host and sign the descriptor again")
    for key_name, value in (("swarm.host_maddrs", _listen_addresses(own)),
                            ("swarm.announce_maddrs", [h.rpartition("/p2p/")[0] for h in own])):
        if not get_key(data, key_name)[0]:
            set_key(data, key_name, value)
    others = [h for h in descriptor.hosts if h not in own and not h.endswith("/p2p/" + peer)]
    set_key(data, "swarm.p2p_identity_path", str(key.resolve()))
    set_key(data, "swarm.initial_peers", others)
    cfg = validate_host_config(data)
    from node.cli.common import check_free_ports

    check_free_ports(cfg.swarm.host_maddrs, cfg.api.host if cfg.api.port is not None else None, cfg.api.port)
    return HostPlan(cfg, descriptor, own, others, notes)


def cmd_host(args: argparse.Namespace) -> int:
    from swarm import hivemind_lean

    hivemind_lean.load()  # before anything imports hivemind: the host needs its DHT, not torch
    plan = host_plan(args)
    _setup_logging(args.log_level, Path(plan.cfg.run_dir) / "host.log")
    return run_host(plan)


def _setup_logging(level: str, path: Path) -> None:
    logging.basicConfig(level=level.upper(), format=_LOG_FORMAT, stream=sys.stderr)
    handler = logging.handlers.RotatingFileHandler(path, encoding="utf-8", maxBytes=8 * 1024 * 1024, backupCount=2)
    handler.setFormatter(logging.Formatter(_LOG_FORMAT))
    logging.getLogger().addHandler(handler)


def run_host(plan: HostPlan) -> int:
    """Run the host until SIGINT or SIGTERM; 0 when stopped, 1 if its network side could not start."""
    from node.api.host_server import HostApiServer
    from protocol.identity import Identity
    from swarm.host import HostLimits, SwarmHost

    cfg, d = plan.cfg, plan.descriptor
    run_dir = Path(cfg.run_dir)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    host = SwarmHost(cfg.swarm, Identity.load_or_create(run_dir / "identity.pem"), other_hosts=plan.others,
                     limits=HostLimits(**cfg.limits.model_dump()), health_every=cfg.health_every,
                     max_members=cfg.max_members, state_path=run_dir / STATE_FILE)
    api = HostApiServer(cfg.api, host, d) if cfg.api.port is not None else None
    say = lambda line: print(f"swarm-node host: {line}", flush=True)  # noqa: E731
    try:
        for line in plan.notes:
            say(line)
        host.start()
        addrs = host.wait_until_listening(cfg.swarm.startup_timeout)
        if not addrs:
            print(f"swarm-node host: error: the network side did not start ({host.transport.network_status().reason})",
                  file=sys.stderr, flush=True)
            return 1
        say(f"swarm {d.swarm_id} ({d.name}), descriptor valid until {d.expires:%Y-%m-%d %H:%M} UTC")
        say(f"listening on {', '.join(cfg.swarm.host_maddrs)}; announced as {' '.join(addrs)}")
        say(f"other hosts: {len(plan.others)}" + (f" ({', '.join(plan.others)})" if plan.others else ""))
        if api is not None:
            api.start()
            (run_dir / "api_url").write_text(api.url + "\n")
            say(f"status page at {api.url} (the descriptor at {api.url}swarm.yaml)")
        where = descriptor_url(plan.own[0], api.port) if api is not None else "<the descriptor>"
        say(f"members join with: {join_command(where)}")
        say(f"running until stopped; the member table is kept in {run_dir / STATE_FILE}")
        while not stop.wait(1.0):
            pass
        say("stopping")
        return 0
    finally:
        if api is not None:
            api.stop()
            (run_dir / "api_url").unlink(missing_ok=True)
        host.close()
