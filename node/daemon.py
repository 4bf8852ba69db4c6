"""``swarm-node start``: the node loop joined to a swarm over hivemind.

The node is built by ``Node.setup()`` with the hivemind transport factory below: policy, tasks,
trainer and checkpoint first, so a broken model or config fails before any network is touched; then
the identity and the transport, started without waiting, so training begins at once while joining goes
on in the background.

A swarm node whose config sets no ``seed`` takes one from its identity (the first 32 bits of its peer
id), so nodes started from the same config sample different tasks, and a restarted node keeps its seed.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from node.api.client import api_banner
from node.config import NodeConfig
from node.runner import Node, load_identity
from protocol.identity import Identity
from swarm.settings import SwarmSettings
from swarm.transport import SwarmTransport

logger = logging.getLogger(__name__)

_ADDRESS_WAIT_SECONDS = 5.0


def start_swarm_transport(settings: SwarmSettings, identity: Identity) -> SwarmTransport:
    """The daemon's transport factory: a hivemind transport, started in the background."""
    transport = SwarmTransport(settings, identity)
    transport.start(wait=False)
    return transport


def identity_seed(identity: Identity) -> int:
    """The seed of a swarm node that sets none: the first 32 bits of its peer id."""
    return int(identity.peer_id[:8], 16)


def with_identity_seed(cfg: NodeConfig) -> NodeConfig:
    """``cfg`` as it is when it sets ``seed``; otherwise with the seed of its identity (created if missing)."""
    if "seed" in cfg.model_fields_set:
        return cfg
    return cfg.model_copy(update={"seed": identity_seed(load_identity(cfg, Path(cfg.run_dir)))})


def run_daemon(cfg: NodeConfig, *, show_progress: bool = True) -> int:
    """Run a swarm node until ``train.steps`` or a stop signal; ``cfg`` has its initial peers resolved."""
    explicit_seed = "seed" in cfg.model_fields_set
    cfg = with_identity_seed(cfg)
    node = Node(cfg, show_progress=show_progress, transport=start_swarm_transport)
    try:
        node.setup()
        node.install_signal_handlers()
        exchange = node.exchange
        if exchange is None:
            raise RuntimeError("setup() built no exchange although a transport factory was given")
        transport = exchange.transport
        # A short wait so the address can be printed; training starts either way.
        if isinstance(transport, SwarmTransport):
            transport.wait_until_up(min(_ADDRESS_WAIT_SECONDS, cfg.swarm.startup_timeout))
            addrs = transport.visible_multiaddrs()
        else:
            addrs = []
        print("swarm-node: peer id " + exchange.identity.peer_id, flush=True)
        if not explicit_seed:
            print(f"swarm-node: seed {cfg.seed} (from the identity; set seed=N to choose one)", flush=True)
        if addrs and cfg.swarm.client_mode:
            print(f"swarm-node: network up in client mode (dials out only; batches are handed to "
                  f"{cfg.swarm.handoff_copies} initial peers to serve)" if cfg.swarm.nat_sharing == "handoff" else
                  f"swarm-node: network up in client mode (dials out only; nat_sharing={cfg.swarm.nat_sharing})",
                  flush=True)
        elif addrs:
            print("swarm-node: others can join with --initial-peers " + ",".join(addrs), flush=True)
        else:
            print("swarm-node: network not up yet (peers unreachable?); training locally and retrying to join "
                  "in the background", flush=True)
        print(f"swarm-node: run dir {Path(cfg.run_dir).resolve()}", flush=True)
        if node.api is not None:
            print(api_banner(node.api.url), flush=True)
        step = node.run()
        print(f"swarm-node: stopped at step {step}", file=sys.stderr, flush=True)
        return 0
    finally:
        node.close()
