"""``swarm-node start``: the node loop joined to a swarm over hivemind.

The node is built by ``Node.setup()`` with the hivemind transport factory below: policy, tasks,
trainer and checkpoint first, so a broken model or config fails before any network is touched; then
the identity and the transport, started without waiting, so training begins at once while joining goes
on in the background.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from node.config import NodeConfig
from node.runner import Node
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


def run_daemon(cfg: NodeConfig, *, show_progress: bool = True) -> int:
    """Run a swarm node until ``train.steps`` or a stop signal; ``cfg`` has its initial peers resolved."""
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
        node.close()
