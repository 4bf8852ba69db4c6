"""The project's scripts (``scripts/FOLDER/NAME.py``) as modules, for tests that call their functions."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def load_script(path: str) -> ModuleType:
    """``scripts/<path>.py`` (``"lib/netns_lab"``), imported once and kept in ``sys.modules`` under its name."""
    name = path.rsplit("/", 1)[-1]
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{path}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
