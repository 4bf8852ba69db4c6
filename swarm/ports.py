"""Is a listen port taken? Checked before p2pd starts, because p2pd would not say so.

p2pd (go-libp2p) listens with ``SO_REUSEPORT``, so a second p2pd started on a port another one holds binds
it too and raises nothing: both then listen, the kernel splits incoming connections between them, and a
node that dials "its host" may be answered by another node's p2pd (a member on its host's machine never
connected that way). So the node binds each fixed TCP port of ``swarm.host_maddrs`` itself first, without
``SO_REUSEPORT``: that fails while any process listens there. Pure standard library (no hivemind), so the
check runs before anything heavy and its mistake is one line.
"""

from __future__ import annotations

import contextlib
import errno
import socket

__all__ = ["free_port_after", "listen_port_taken", "taken_listen_addresses"]


def listen_port_taken(host: str, port: int, *, family: int = socket.AF_INET) -> bool:
    """Whether a process listens on ``host:port`` (TCP) now, so a listener there would share or fail."""
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        # SO_REUSEADDR, as any server sets it: a port left in TIME_WAIT by a process that stopped is free.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
        with contextlib.suppress(OSError):
            sock.listen(1)
            return False
        return True


def taken_listen_addresses(maddrs: list[str]) -> list[tuple[str, int]]:
    """``(multiaddr, port)`` of each listen address in ``maddrs`` (``/ip4|ip6/<addr>/tcp/<port>``, port not 0)
    whose port is taken; addresses of other shapes (DNS names, port 0) are not checked."""
    taken = []
    for maddr in maddrs:
        parts = maddr.strip("/").split("/")
        if len(parts) < 4 or parts[0] not in ("ip4", "ip6") or parts[2] != "tcp" or not parts[3].isdigit():
            continue
        port = int(parts[3])
        family = socket.AF_INET6 if parts[0] == "ip6" else socket.AF_INET
        if port and listen_port_taken(parts[1], port, family=family):
            taken.append((maddr, port))
    return taken


def free_port_after(host: str, port: int, *, family: int = socket.AF_INET, tries: int = 32) -> int | None:
    """The first port above ``port`` on ``host`` that nobody listens on now (of the next ``tries``), else None:
    what a hint to choose another port names."""
    for candidate in range(port + 1, min(port + 1 + tries, 65536)):
        if not listen_port_taken(host, candidate, family=family):
            return candidate
    return None
