"""The import structure: layers point downward only, and no module imports itself in a cycle.

Read from the source (module-level imports, as Python runs them at import time), so the test needs
nothing installed beyond the standard library.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("protocol", "swarm", "node")
FORBIDDEN = {
    "protocol": ("swarm", "node", "torch", "transformers", "peft", "hivemind", "aiohttp"),
    "swarm": ("node",),
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, *, top_level_only: bool) -> set[str]:
    """Modules ``path`` imports: at module level only, or anywhere (lazy imports inside functions too)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in tree.body if top_level_only else ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _graph() -> dict[str, set[str]]:
    """Who imports whom among our modules, lazy imports included: a lazy import that closes a loop is
    still a design cycle (a base module that imports its own subclasses)."""
    modules = {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    return {name: {m for m in _imports(path, top_level_only=False) if m in modules and m != name}
            for name, path in modules.items()}


def test_layers_point_downward() -> None:
    bad = []
    for pkg, banned in FORBIDDEN.items():
        for path in (ROOT / pkg).rglob("*.py"):
            for imported in _imports(path, top_level_only=False):
                if imported.split(".")[0] in banned:
                    bad.append(f"{path.relative_to(ROOT)} imports {imported}")
    assert not bad, bad


def _cycle_from(start: str, graph: dict[str, set[str]]) -> list[str] | None:
    stack = [(start, [start])]
    seen: set[str] = set()
    while stack:
        node, path = stack.pop()
        for nxt in graph[node]:
            if nxt == start:
                return [*path, start]
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, [*path, nxt]))
    return None


def test_no_import_cycles() -> None:
    graph = _graph()
    # A package's __init__ importing its own submodules is how packages work, not a cycle.
    for name in list(graph):
        graph[name] = {m for m in graph[name] if not name.startswith(m + ".")}
        if name in PACKAGES or any(name == f"{p}.{sub}" for p in PACKAGES for sub in ("tasks", "policy", "train")):
            graph[name] = {m for m in graph[name] if not m.startswith(name + ".")}
    cycles = [c for c in (_cycle_from(m, graph) for m in sorted(graph)) if c]
    assert not cycles, cycles[0]


def test_the_cycle_check_finds_a_cycle() -> None:
    assert _cycle_from("a", {"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle_from("a", {"a": {"b"}, "b": set()}) is None
