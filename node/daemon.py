"""``swarm-node start``: the node loop joined to a swarm over hivemind.

Order of set-up: the node (policy, tasks, trainer, checkpoint) first, so a broken model or config fails
before any network is touched; then the identity and the transport, started without waiting, so training
begins at once while joining goes on in the background.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from pydantic import ValidationError

from node.config import ConfigError, NodeConfig
from node.exchange import SwarmExchange
from node.runner import Node
from protocol.errors import IdentityError
from protocol.identity import Identity

logger = logging.getLogger(__name__)

_ADDRESS_WAIT_SECONDS = 5.0


def resolve_initial_peers(cfg: NodeConfig, cli_peers: list[str] | None) -> list[str]:
    """CLI flag, then ``SWARM_INITIAL_PEERS``, then the config, first non-empty wins."""
    from swarm.settings import initial_peers_from_env

    if cli_peers:
        return list(cli_peers)
    env = initial_peers_from_env()
    return env or list(cfg.swarm.initial_peers)


def build_swarm_node(cfg: NodeConfig, *, initial_peers: list[str] | None = None, show_progress: bool = True) -> Node:
    """A set-up node with a started (not necessarily joined) swarm exchange."""
    from swarm.settings import SwarmSettings
    from swarm.transport import SwarmTransport

    peers = resolve_initial_peers(cfg, initial_peers)
    try:
        settings = SwarmSettings.model_validate({**cfg.swarm.model_dump(), "initial_peers": peers})
    except ValidationError as exc:
        reasons = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
        raise ConfigError(f"swarm: {reasons}") from None
    node = Node(cfg, cfg.run_dir, show_progress=show_progress)
    node.setup()
    identity_path = Path(settings.identity_path)
    if not identity_path.is_absolute():
        identity_path = Path(cfg.run_dir) / identity_path
    try:
        identity = Identity.load_or_create(identity_path)
    except IdentityError as exc:
        raise ConfigError(f"swarm.identity_path: {exc}") from None
    transport = SwarmTransport(settings, identity)
    transport.start(wait=False)
    g = cfg.generation
    node.exchange = SwarmExchange(node.policy, node.source, transport, identity, swarm_id=settings.swarm_id,
                                  temperature=g.temperature, top_p=g.top_p,
                                  max_completion_tokens=4 * g.max_new_tokens)
    return node


def run_daemon(cfg: NodeConfig, *, initial_peers: list[str] | None = None, show_progress: bool = True) -> int:
    node: Node | None = None
    try:
        node = build_swarm_node(cfg, initial_peers=initial_peers, show_progress=show_progress)
        node.install_signal_handlers()
        exchange = node.exchange
        if not isinstance(exchange, SwarmExchange):
            raise RuntimeError("swarm node built without its exchange")
        transport = exchange.transport
        # A short wait so the address can be printed; training starts either way.
        transport.wait_until_up(min(_ADDRESS_WAIT_SECONDS, cfg.swarm.startup_timeout))  # type: ignore[attr-defined]
        addrs = transport.visible_multiaddrs()  # type: ignore[attr-defined]
        print("swarm-node: peer id " + exchange.identity.peer_id, flush=True)
        if addrs:
            print("swarm-node: others can join with --initial-peers " + ",".join(addrs), flush=True)
        else:
            print("swarm-node: network not up yet (peers unreachable?); training locally and retrying to join "
                  "in the background", flush=True)
        print(f"swarm-node: run dir {Path(cfg.run_dir).resolve()}", flush=True)
        step = node.run()
        print(f"swarm-node: stopped at step {step}", file=sys.stderr, flush=True)
        return 0
    finally:
        if node is not None:
            node.close()
