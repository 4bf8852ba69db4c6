"""The hivemind internals swarm-node relies on, reached in this one module and nowhere else.

hivemind's public API lacks four things a node needs:

* the p2pd child process (``P2P._child``): to give it an orphan watchdog, to see that it died, and to
  kill it when a shutdown hangs;
* p2pd in a session of its own (``own_session_p2pd``): hivemind starts it in the node's process group,
  so a Ctrl-C typed at the node's terminal would kill the node's network before the node could finish
  its step and shut it down; the node stops p2pd itself (and its watchdog does if the node dies);
* dialing a peer at a given address (``P2P._client.connect``): ``P2P`` only dials through the DHT; and
  dropping the connections to a peer (``P2P._client.disconnect``), to tell whether it can still be dialed;
* the current DHT neighbours (``DHTNode.protocol.routing_table.peer_id_to_uid``);
* turning a client-mode DHT node into a server in place (``become_dht_server``: hivemind decides it once,
  in ``DHTProtocol.create``): a ``client_mode: auto`` node does so once a peer could dial it back;
* counting the DHT's outgoing requests (``DHTNode.protocol.call_find`` and ``call_store``, wrapped on the
  instance), for the node's statistics;
* p2pd flags ``P2P.create`` has no argument for (the connection manager's and the relay service's limits
  of a host): ``P2P._make_process_args`` is wrapped once to add the flags ``p2pd_flags`` sets for the
  current task, so another node started in the same process at the same time gets none of them.

Each accessor checks that the attribute is still there and raises ``HivemindCompatError`` naming it
otherwise, so a hivemind upgrade that renames one fails loudly (``tests/swarm/test_hivemind_compat.py``
exercises every accessor against real peers) instead of silently losing a safety net.

One more dependency on hivemind's layout lives in ``swarm.maddr``: the config check loads hivemind's
vendored multiaddr parser from its folder, to validate addresses without importing hivemind (and torch);
the same test file checks that it agrees with ``hivemind.utils.multiaddr``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import hivemind
from hivemind.dht.node import DHTNode
from hivemind.p2p import P2P, PeerID
from hivemind.utils.multiaddr import Multiaddr

from swarm.errors import SwarmError

__all__ = ["HivemindCompatError", "become_dht_server", "count_dht_requests", "dht_neighbours", "dial", "disconnect", "own_session_p2pd",
           "p2pd_flags", "p2pd_pid", "p2pd_process"]

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


class _OwnSessionSubprocess:
    """``asyncio.subprocess`` as hivemind's p2pd launcher sees it: every process in a new session."""

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio.subprocess, name)

    @staticmethod
    async def create_subprocess_exec(*args: Any, **kwargs: Any) -> asyncio.subprocess.Process:
        kwargs.setdefault("start_new_session", True)
        return await asyncio.subprocess.create_subprocess_exec(*args, **kwargs)


class _AsyncioForP2pd:
    """The ``asyncio`` module of ``hivemind.p2p.p2p_daemon``: the real one but for ``subprocess``."""

    subprocess = _OwnSessionSubprocess()

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)


def own_session_p2pd() -> None:
    """Make every p2pd that hivemind starts from now on a session leader (idempotent).

    hivemind launches p2pd with ``asyncio.subprocess.create_subprocess_exec`` and no way to pass
    ``start_new_session``; this swaps the ``asyncio`` name of that one module for a view of the real
    module that adds it. Nothing else in the process is affected.
    """
    from hivemind.p2p import p2p_daemon

    if not isinstance(_attribute(p2p_daemon, "asyncio"), _AsyncioForP2pd):
        p2p_daemon.asyncio = _AsyncioForP2pd()


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


async def disconnect(p2p: P2P, peer_id: PeerID) -> None:
    """Close ``p2p``'s connections to ``peer_id`` (raises hivemind's network errors on failure)."""
    client = _attribute(p2p, "_client")
    await client.disconnect(peer_id)


def count_dht_requests(dht: DHTNode, add: Callable[[str, int], None]) -> None:
    """Count every find and store request ``dht`` sends: ``add("dht_find_requests", 1)`` and
    ``add("dht_find_keys", keys)`` per find, likewise ``dht_store_requests`` / ``dht_store_keys``."""
    protocol = _attribute(dht, "protocol")
    call_find, call_store = _attribute(protocol, "call_find"), _attribute(protocol, "call_store")

    async def counted_find(peer: PeerID, keys: Sequence[Any], *args: Any, **kwargs: Any) -> Any:
        add("dht_find_requests", 1)
        add("dht_find_keys", len(keys))
        return await call_find(peer, keys, *args, **kwargs)

    async def counted_store(peer: PeerID, keys: Sequence[Any], *args: Any, **kwargs: Any) -> Any:
        add("dht_store_requests", 1)
        add("dht_store_keys", len(keys))
        return await call_store(peer, keys, *args, **kwargs)

    protocol.call_find = counted_find
    protocol.call_store = counted_store


def dht_neighbours(dht: DHTNode) -> list[PeerID]:
    """The peers in ``dht``'s routing table."""
    table = _attribute(_attribute(dht, "protocol"), "routing_table")
    return list(_attribute(table, "peer_id_to_uid"))


async def become_dht_server(dht: DHTNode) -> bool:
    """Make a client-mode ``dht`` a DHT server now, as ``DHTProtocol.create(client_mode=False)`` would have:
    its request handlers registered, and its node id sent with every request from now on, so the peers it
    talks to add it to their routing tables. Returns False if it was a server already."""
    from hivemind.proto import dht_pb2
    from hivemind.utils.auth import AuthRole, AuthRPCWrapper

    protocol = _attribute(dht, "protocol")
    if not _attribute(protocol, "client_mode"):
        return False
    wrapper = AuthRPCWrapper(protocol, AuthRole.SERVICER, _attribute(protocol, "authorizer"))
    await protocol.add_p2p_handlers(_attribute(protocol, "p2p"), wrapper)
    protocol.node_info = dht_pb2.NodeInfo(node_id=_attribute(protocol, "node_id").to_bytes())
    protocol.client_mode = False
    return True


_P2PD_FLAGS: contextvars.ContextVar[Mapping[str, object]] = contextvars.ContextVar(
    "swarm_p2pd_flags", default=types.MappingProxyType({}))


@contextlib.contextmanager
def p2pd_flags(flags: Mapping[str, object]) -> Iterator[None]:
    """Within this block, a p2pd that ``P2P.create`` starts from the current task gets ``flags`` too
    (``{"connHi": 512}`` becomes ``-connHi=512``; they replace hivemind's own flags of the same name)."""
    make = _attribute(P2P, "_make_process_args")
    if not getattr(make, "_adds_swarm_flags", False):
        def with_flags(*args: Any, **kwargs: Any) -> Any:
            return make(*args, **{**kwargs, **_P2PD_FLAGS.get()})

        with_flags._adds_swarm_flags = True  # type: ignore[attr-defined]
        P2P._make_process_args = staticmethod(with_flags)
    token = _P2PD_FLAGS.set(dict(flags))
    try:
        yield
    finally:
        _P2PD_FLAGS.reset(token)
