"""The hivemind internals swarm-node relies on, reached in this one module and nowhere else.

hivemind's public API lacks three things a node needs:

* the p2pd child process (``P2P._child``): to give it an orphan watchdog, to see that it died, and to
  kill it when a shutdown hangs;
* dialing a peer at a given address (``P2P._client.connect``): ``P2P`` only dials through the DHT;
* the current DHT neighbours (``DHTNode.protocol.routing_table.peer_id_to_uid``).

Each accessor checks that the attribute is still there and raises ``HivemindCompatError`` naming it
otherwise, so a hivemind upgrade that renames one fails loudly (``tests/swarm/test_hivemind_compat.py``
exercises every accessor against real peers) instead of silently losing a safety net.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import hivemind
from hivemind.dht.node import DHTNode
from hivemind.p2p import P2P, PeerID
from hivemind.utils.multiaddr import Multiaddr

from swarm.errors import SwarmError

__all__ = ["HivemindCompatError", "dht_neighbours", "dial", "p2pd_pid", "p2pd_process"]

TESTED_VERSIONS = ("1.1.10", "1.1.11", "1.1.12")
"""hivemind releases these accessors were checked against (``pyproject.toml`` pins ``<1.2``)."""


class HivemindCompatError(SwarmError):
    """hivemind no longer has an internal attribute this module relies on."""


def _attribute(obj: object, name: str) -> Any:
    try:
        return getattr(obj, name)
    except AttributeError:
        raise HivemindCompatError(
            f"hivemind {hivemind.__version__} has no {type(obj).__name__}.{name}; swarm/hivemind_compat.py was "
            f"written for {', '.join(TESTED_VERSIONS)}"
        ) from None


def p2pd_process(p2p: P2P) -> asyncio.subprocess.Process | None:
    """The p2pd child process of ``p2p``, or None when ``p2p`` did not start one (or it was reaped)."""
    child: asyncio.subprocess.Process | None = _attribute(p2p, "_child")
    return child


def p2pd_pid(p2p: P2P) -> int | None:
    """The pid of ``p2p``'s p2pd, or None."""
    child = p2pd_process(p2p)
    return None if child is None else child.pid


def p2pd_exited(p2p: P2P) -> bool:
    """True once ``p2p``'s daemon is gone (hivemind's own flag, or the child's exit status)."""
    child = p2pd_process(p2p)
    return not p2p.is_alive or (child is not None and child.returncode is not None)


async def dial(p2p: P2P, peer_id: PeerID, addrs: Sequence[Multiaddr]) -> None:
    """Connect ``p2p`` to ``peer_id`` at ``addrs`` (raises hivemind's network errors on failure)."""
    client = _attribute(p2p, "_client")
    await client.connect(peer_id, list(addrs))


def dht_neighbours(dht: DHTNode) -> list[PeerID]:
    """The peers in ``dht``'s routing table."""
    table = _attribute(_attribute(dht, "protocol"), "routing_table")
    return list(_attribute(table, "peer_id_to_uid"))
