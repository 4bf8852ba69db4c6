"""Multiaddr checks with hivemind's own parser, without importing hivemind (for config validation).

hivemind vendors py-multiaddr as ``hivemind.utils.multiaddr``, but importing any hivemind module runs
``hivemind/__init__`` (torch and the rest: seconds), too slow for a config check that must answer at
once. The vendored package is self-contained (relative imports, plus varint, netaddr, idna, base58 and
cid), so it is loaded here from hivemind's folder under a private module name: the same parser the
transport uses when it dials, checking addresses, ports and the base58 multihash of a ``/p2p/`` peer id.
``tests/swarm/test_hivemind_compat.py`` checks that it agrees with ``hivemind.utils.multiaddr``, so a
hivemind release that moves the package fails a test (and ``MultiaddrParserMissing`` names it here).
"""

from __future__ import annotations

import importlib.util
import sys
from functools import cache
from pathlib import Path
from typing import Any

from swarm.errors import SwarmError

__all__ = ["MultiaddrParserMissing", "multiaddr_class", "multiaddr_problem"]

_MODULE = "_swarm_node_hivemind_multiaddr"


class MultiaddrParserMissing(SwarmError):
    """hivemind no longer ships its multiaddr parser at ``hivemind/utils/multiaddr``."""


@cache
def multiaddr_class() -> Any:
    """hivemind's ``Multiaddr`` class, loaded without running ``hivemind/__init__``."""
    spec = importlib.util.find_spec("hivemind")  # locates the package without importing it
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    folder = Path(locations[0]) / "utils" / "multiaddr" if locations else Path("hivemind/utils/multiaddr")
    if not (folder / "__init__.py").is_file():
        raise MultiaddrParserMissing(f"hivemind has no multiaddr parser at {folder}; see swarm/maddr.py")
    package = importlib.util.spec_from_file_location(_MODULE, folder / "__init__.py",
                                                     submodule_search_locations=[str(folder)])
    if package is None or package.loader is None:
        raise MultiaddrParserMissing(f"cannot load hivemind's multiaddr parser from {folder}")
    module = importlib.util.module_from_spec(package)
    sys.modules[_MODULE] = module  # its relative imports resolve against this name
    package.loader.exec_module(module)
    return module.Multiaddr


def multiaddr_problem(maddr: str) -> str | None:
    """Why ``maddr`` is not a valid multiaddr (unknown protocol, bad IP, port, peer id), or None."""
    try:
        multiaddr_class()(maddr)
    except ValueError as exc:  # the parser's StringParseError is a ValueError
        protocol = getattr(exc, "protocol", None)
        message = getattr(exc, "message", None) or str(exc)
        return f"{protocol}: {message}" if protocol else str(message)
    return None
