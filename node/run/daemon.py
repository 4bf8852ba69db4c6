"""``swarm-node start``: the node loop joined to a swarm over hivemind.

The node is built by ``Node.setup()`` with the hivemind transport factory below: policy, tasks,
trainer and checkpoint first, so a broken model or config fails before any network is touched; then
the identity and the transport, started without waiting, so training begins at once while joining goes
on in the background. ``PeerKeeper`` saves the peers a member reached (hosts and members that accept
connections, ``swarm.addresses``) in its run dir, its way back in when every host is gone.

A swarm node whose config sets no ``seed`` takes one from its identity (the first 32 bits of its peer
id), so nodes started from the same config sample different tasks, and a restarted node keeps its seed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from node.api.client import api_banner
from node.config import NodeConfig
from node.config.join import remember_peers, remembered_peers
from node.run.node import Node, load_identity
from node.run.rundir import process_started_at
from protocol.identity import Identity
from swarm.settings import SwarmSettings
from swarm.state import NetworkStatus
from swarm.transport import SwarmTransport

logger = logging.getLogger(__name__)

_ADDRESS_WAIT_SECONDS = 5.0


class PeerKeeper:
    """Every ``every`` seconds, the peers a member reached at an address and heard back from (its transport's
    ``remembered_maddrs``: hosts, holders, members that accept connections; never one behind NAT) are saved in
    its run dir (``remember_peers``) and handed to its transport as bootstrap peers: a restarted member, or one
    whose every neighbour is gone, joins again through them when every host of the swarm is down. A thread;
    ``close()`` stops it."""

    def __init__(self, transport: Any, run_dir: str | os.PathLike[str], every: float = 15.0) -> None:
        self.transport, self.run_dir, self.every = transport, run_dir, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="peer-keeper", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            self.keep()

    def keep(self) -> list[str]:
        """Save and hand over the peers reached once; returns them."""
        maddrs = self.transport.remembered_maddrs()
        if maddrs:  # saved first: what a crash right after leaves on disk is what the transport was given
            with contextlib.suppress(OSError):
                remember_peers(self.run_dir, maddrs)
            self.transport.add_bootstrap_peers(maddrs)
        return list(maddrs)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def start_swarm_transport(settings: SwarmSettings, identity: Identity, remembered: list[str] | None = None) -> SwarmTransport:
    """The daemon's transport factory: a hivemind transport, started in the background, that dials the peers
    the node ``remembered`` (its run dir's ``known_peers.txt``) with its initial peers."""
    transport = SwarmTransport(settings, identity)
    if remembered:
        transport.add_bootstrap_peers(remembered)
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


def connection_lines(cfg: NodeConfig, status: NetworkStatus, addrs: list[str]) -> list[str]:
    """What the daemon prints about its network at start: whether it is connected (``NetworkStatus.connected``:
    at least one peer answered, as everywhere else) and, for a node that accepts connections, its address."""
    s = cfg.swarm
    if status.connected:
        lines = [f"connected: {len(status.neighbours)} peer(s) answered ({status.reason})"]
    elif s.initial_peers:
        lines = [f"not connected yet ({status.reason}); training locally and retrying in the background"]
    else:
        lines = ["not connected yet: no initial peers (the first node of a swarm); training locally until "
                 "others join through its address"]
    how = (f"its batches are handed to {s.handoff_copies} reachable peers to serve (the swarm's hosts and members "
           "that accept connections)" if s.nat_sharing == "handoff" else f"nat_sharing={s.nat_sharing}")
    if s.client_mode == "auto" and status.client:
        lines.append(f"client mode until a peer can dial this node back (client_mode: auto); meanwhile {how}")
    elif status.client or s.client_mode is True:
        lines.append(f"client mode: dials out only, nobody can join through this node; {how}")
    elif addrs:
        lines.append("others can join with --initial-peers " + ",".join(addrs))
    else:
        lines.append("no address to share yet (the network side is still starting; see swarm-node status)")
    return ["swarm-node: " + line for line in lines]


def _wait_for_network(transport: SwarmTransport, cfg: NodeConfig) -> list[str]:
    """A short wait, so that the connection and the address can be printed; training starts either way."""
    wait = min(_ADDRESS_WAIT_SECONDS, cfg.swarm.startup_timeout)
    transport.wait_until_up(wait)
    deadline = time.monotonic() + wait
    while cfg.swarm.client_mode is not True and not transport.visible_multiaddrs() and time.monotonic() < deadline:
        time.sleep(0.1)
    return transport.visible_multiaddrs()


def run_daemon(cfg: NodeConfig, *, show_progress: bool = True) -> int:
    """Run a swarm node until a stop signal (or ``train.steps``, when set); ``cfg`` has its initial peers
    resolved."""
    explicit_seed = "seed" in cfg.model_fields_set
    cfg = with_identity_seed(cfg)
    remembered = remembered_peers(cfg.run_dir)
    node = Node(cfg, show_progress=show_progress,
                transport=lambda settings, identity: start_swarm_transport(settings, identity, remembered))
    keeper: PeerKeeper | None = None
    try:
        print(f"swarm-node: loading {cfg.model.name_or_path} and starting the network side (seconds; a minute or "
              "more on a busy machine)", flush=True)
        node.setup()
        node.install_signal_handlers()
        exchange = node.exchange
        if exchange is None:
            raise RuntimeError("setup() built no exchange although a transport factory was given")
        transport = exchange.transport
        addrs = _wait_for_network(transport, cfg) if isinstance(transport, SwarmTransport) else []
        if isinstance(transport, SwarmTransport):
            keeper = PeerKeeper(transport, cfg.run_dir)
        libp2p = transport.libp2p_id() if isinstance(transport, SwarmTransport) else None
        print("swarm-node: peer id " + exchange.identity.peer_id + (f" (libp2p peer id {libp2p})" if libp2p else ""),
              flush=True)
        if not explicit_seed:
            print(f"swarm-node: seed {cfg.seed} (from the identity; set seed=N to choose one)", flush=True)
        for line in connection_lines(cfg, transport.network_status(), addrs):
            print(line, flush=True)
        print(f"swarm-node: run dir {Path(cfg.run_dir).resolve()} (ready after {time.time() - process_started_at():.0f} s, "
              "counted from the command's start)", flush=True)
        print(f"swarm-node: {node.describe_policy()}", flush=True)
        if cfg.train.steps is None:
            print("swarm-node: training until stopped (Ctrl-C or SIGTERM: the step ends, a checkpoint is written)",
                  flush=True)
        if node.api is not None:
            print(api_banner(node.api.url), flush=True)
        step = node.run()
        print(f"swarm-node: stopped at step {step}", file=sys.stderr, flush=True)
        return 0
    finally:
        if keeper is not None:
            keeper.keep()  # the neighbours of the end too: the next start may need them
            keeper.close()
        node.close()
