"""hivemind's DHT and p2p modules without the package ``__init__`` files that import torch.

``import hivemind.dht.node`` first runs ``hivemind/__init__`` (averaging, MoE and optimizers: torch),
``hivemind/utils/__init__`` (tensor descriptors, ``MPFuture``: torch) and ``hivemind/dht/__init__``
(the multiprocess ``DHT``: ``MPFuture``). The DHT node, the p2p daemon client, the record validators and
the vendored multiaddr package need none of that. ``load()`` registers those three packages as bare
packages over hivemind's own folders and gives ``hivemind.utils`` the torch-free names the DHT modules
import from it, so ``swarm.transport`` and everything under it import in a fraction of the memory.

Only a process that trains nothing uses it (``swarm-node host``), and it must call ``load()`` before
anything imports hivemind; a process that already imported hivemind keeps it as it is.
``tests/node/test_host.py`` runs a host where importing torch raises.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import sys
import types
from pathlib import Path

from swarm.errors import SwarmError

__all__ = ["HivemindLayoutError", "load"]

_BARE_PACKAGES = ("hivemind", "hivemind.utils", "hivemind.dht")
_UTILS_NAMES = {  # what hivemind/utils/__init__ exports and the DHT and p2p modules import, torch-free
    "hivemind.utils.logging": ("get_logger",),
    "hivemind.utils.serializer": ("MSGPackSerializer", "SerializerBase"),
    "hivemind.utils.timed_storage": ("DHTExpiration", "MAX_DHT_TIME_DISCREPANCY_SECONDS", "TimedStorage",
                                     "ValueWithExpiration", "get_dht_time"),
    "hivemind.utils.asyncio": ("amap_in_executor", "as_aiter", "enter_asynchronously", "switch_to_uvloop"),
    "hivemind.utils.nested": ("nested_flatten", "nested_map", "nested_pack"),
    "hivemind.utils.performance_ema": ("PerformanceEMA",),
}
_DHT_NAMES = {"hivemind.dht.node": ("DHTNode",), "hivemind.dht.routing": ("DHTID", "DHTValue")}


class HivemindLayoutError(SwarmError):
    """hivemind's folders or module names are not where this module expects them (another release)."""


def load() -> bool:
    """Make ``hivemind.dht``, ``hivemind.p2p`` and ``hivemind.utils.*`` importable without torch; True if
    it did, False if hivemind was imported already (then nothing changes)."""
    if "hivemind" in sys.modules:
        return False
    spec = importlib.util.find_spec("hivemind")  # locates the package without running its __init__
    if spec is None or spec.origin is None:
        raise HivemindLayoutError("hivemind is not installed")
    root = Path(spec.origin).parent
    made = []
    for name in _BARE_PACKAGES:
        folder = root.joinpath(*name.split(".")[1:])
        if not folder.is_dir():
            raise HivemindLayoutError(f"hivemind has no folder {folder.relative_to(root.parent)}")
        module = types.ModuleType(name, f"{name} (loaded without its __init__ by swarm.hivemind_lean)")
        module.__spec__ = importlib.machinery.ModuleSpec(name, None, origin=str(folder / "__init__.py"), is_package=True)
        module.__spec__.submodule_search_locations = [str(folder)]
        module.__path__ = [str(folder)]
        module.__package__ = name
        module.__file__ = str(folder / "__init__.py")
        sys.modules[name] = module
        made.append(module)
        if "." in name:
            setattr(sys.modules[name.rpartition(".")[0]], name.rpartition(".")[2], module)
    made[0].__version__ = importlib.metadata.version("hivemind")  # type: ignore[attr-defined]
    try:
        for table, package in ((_UTILS_NAMES, made[1]), (_DHT_NAMES, made[2])):
            for module_name, names in table.items():
                source = importlib.import_module(module_name)
                for attr in names:
                    setattr(package, attr, getattr(source, attr))
    except (ImportError, AttributeError) as exc:
        for name in _BARE_PACKAGES:
            sys.modules.pop(name, None)
        raise HivemindLayoutError(f"hivemind {made[0].__version__}: {exc}; swarm/hivemind_lean.py needs updating") from None
    return True
