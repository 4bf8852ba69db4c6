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
    """Modules ``path`` imports: at module level only, or anywhere (lazy imports inside functions too).
    Relative imports are resolved against ``path``'s package, and ``importlib.import_module`` with a
    constant name (or an f-string's constant start, e.g. ``f"node.cli.{verb}"``: its package) counts."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in tree.body if top_level_only else ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(path, node.module, node.level)
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Call) and _is_import_module(node.func) and node.args:
            name = _constant_start(node.args[0])
            if name:
                found.add(name)
    found.discard("")
    return found


def _absolute(path: Path, module: str | None, level: int) -> str:
    """The absolute name of ``from <level dots><module> import ...`` written in ``path``."""
    if level == 0:
        return module or ""
    package = list(path.relative_to(ROOT).with_suffix("").parts)[:-1]  # a module's or __init__'s package
    base = package[: len(package) - (level - 1)] if level > 1 else package
    return ".".join([*base, *([module] if module else [])])


def _is_import_module(func: ast.expr) -> bool:
    return (isinstance(func, ast.Attribute) and func.attr == "import_module") or (
        isinstance(func, ast.Name) and func.id in ("import_module", "__import__"))


def _constant_start(arg: ast.expr) -> str:
    """A constant module name, or the package an f-string's constant start names (``"node.cli."``)."""
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        return str(arg.values[0].value).rsplit(".", 1)[0] if "." in str(arg.values[0].value) else ""
    return ""


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
        if name in PACKAGES or any(name == f"{p}.{sub}" for p in PACKAGES for sub in ("tasks", "policy", "train", "cli")):
            graph[name] = {m for m in graph[name] if not m.startswith(name + ".")}
    cycles = [c for c in (_cycle_from(m, graph) for m in sorted(graph)) if c]
    assert not cycles, cycles[0]


def test_relative_and_importlib_imports_are_counted(tmp_path: Path) -> None:
    global ROOT
    saved = ROOT
    ROOT = tmp_path
    try:
        room = tmp_path / "node" / "train"
        room.mkdir(parents=True)
        (room / "one.py").write_text(
            "from . import two\nfrom ..run import node\nfrom .. import cli\nimport importlib\n"
            "def f(v):\n    importlib.import_module('node.api.server')\n    importlib.import_module(f'node.exchange.{v}')\n")
        found = _imports(room / "one.py", top_level_only=False)
    finally:
        ROOT = saved
    assert {"node.train", "node.train.two", "node.run", "node.run.node", "node", "node.cli", "node.api.server",
            "node.exchange"} <= found, found
    assert _upward({(_room("node.train.one") or "", _room(m) or "") for m in found
                    if _room(m) and _room(m) != "train"}) == ["node/train imports node/api", "node/train imports node/cli",
                                                              "node/train imports node/exchange", "node/train imports node/run"]


def test_the_cycle_check_finds_a_cycle() -> None:
    assert _cycle_from("a", {"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle_from("a", {"a": {"b"}, "b": set()}) is None


NODE_ORDER = ("cli", "run", "api", "exchange", "generation", "train", "fused", "policy", "sources", "config", "tasks",
              ("errors", "modes", "failpoints"))
"""node/'s rooms from the top down: a room imports only rooms after it (the last three leaf modules none of
each other). A new folder or leaf module goes into this list where its imports put it."""


def _room(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "node" and len(parts) > 1 else None


def _rank(room: str) -> int:
    for i, entry in enumerate(NODE_ORDER):
        if room == entry or (isinstance(entry, tuple) and room in entry):
            return i
    raise AssertionError(f"node/{room} is in no place of NODE_ORDER: add it where its imports put it")


def room_edges() -> set[tuple[str, str]]:
    """Pairs (importer, imported) of node's top-level rooms (a folder or a leaf module) tied by an import."""
    edges = set()
    for name, imported in _graph().items():
        a = _room(name)
        for m in imported:
            b = _room(m)
            if a and b and a != b:
                edges.add((a, b))
    return edges


def _upward(edges: set[tuple[str, str]]) -> list[str]:
    return sorted(f"node/{a} imports node/{b}" for a, b in edges if _rank(a) >= _rank(b))


def test_node_rooms_import_downward_only() -> None:
    rooms = {p.stem if p.suffix else p.name for p in (ROOT / "node").iterdir()
             if (p.suffix == ".py" and p.stem != "__init__") or (p.is_dir() and (p / "__init__.py").exists())}
    for room in rooms:
        _rank(room)
    upward = _upward(room_edges())
    print("node's rooms, top down:", " > ".join(e if isinstance(e, str) else " | ".join(e) for e in NODE_ORDER))
    assert not upward, upward


def test_node_has_few_rooms_and_few_ties() -> None:
    folders = [p.name for p in (ROOT / "node").iterdir() if p.is_dir() and (p / "__init__.py").exists()]
    leaves = [p.stem for p in (ROOT / "node").glob("*.py") if p.stem != "__init__"]
    assert len(folders) <= 11 and len(leaves) <= 4, (folders, leaves)
    prefixes = [p for p in leaves if "_" in p and sum(q.startswith(p.split("_")[0] + "_") for q in leaves) > 1]
    assert not prefixes, f"a family of files sharing a prefix is a folder waiting to be made: {prefixes}"
    assert len(room_edges()) <= 73, len(room_edges())  # half of the 146 the loose layout had


def test_no_room_is_a_crowd() -> None:
    """No folder of node/ holds more than 12 modules, nor (with its subfolders) more than 15% of node/'s lines."""
    lines = {p: len(p.read_text(encoding="utf-8").splitlines()) for p in (ROOT / "node").rglob("*.py")}
    total = sum(lines.values())
    crowded = []
    for folder in {p.parent for p in lines if p.parent != ROOT / "node"}:
        modules = [p for p in folder.glob("*.py") if p.stem != "__init__"]
        share = sum(n for p, n in lines.items() if folder in p.parents) / total
        if len(modules) > 12 or (folder.parent == ROOT / "node" and share > 0.15):
            crowded.append(f"{folder.relative_to(ROOT)}: {len(modules)} modules, {share:.0%} of node/'s lines")
    assert not crowded, crowded


def test_the_room_order_check_finds_an_upward_import() -> None:
    assert _upward({("config", "run"), ("run", "config"), ("modes", "errors")}) == [
        "node/config imports node/run", "node/modes imports node/errors"]
    try:
        _rank("nowhere")
    except AssertionError as exc:
        assert "NODE_ORDER" in str(exc)
    else:
        raise AssertionError("an unlisted room passed")


# -- scripts/: entry scripts are run, never imported; what they share is the package scripts.lib ----------------

SCRIPTS = ROOT / "scripts"


def _script_files() -> list[Path]:
    return sorted(p for p in SCRIPTS.rglob("*.py") if "__pycache__" not in p.parts)


def _is_lib(path: Path) -> bool:
    return path.relative_to(SCRIPTS).parts[0] in ("lib", "__init__.py")


def script_import_problems(files: list[Path]) -> list[str]:
    """Imports of an entry script (by its bare name, as a sys.path edit would allow, or as ``scripts.X`` outside
    ``scripts.lib``) and edits of ``sys.path``, in ``files``."""
    entries = {p.stem for p in files if not _is_lib(p) and p.stem != "__init__"}
    problems = []
    for path in files:
        text = path.read_text(encoding="utf-8")
        if "sys.path.insert" in text or "sys.path.append" in text:
            problems.append(f"{path.relative_to(ROOT)} edits sys.path")
        for name in _imports(path, top_level_only=False):
            top = name.split(".")[0]
            if top in entries or (name.startswith("scripts.") and not name.startswith("scripts.lib")):
                problems.append(f"{path.relative_to(ROOT)} imports the entry script {name}")
    return sorted(set(problems))


def test_scripts_import_only_their_library() -> None:
    assert not script_import_problems(_script_files()), script_import_problems(_script_files())


def test_scripts_library_has_no_cycle() -> None:
    lib = {_module_name(p): p for p in _script_files() if _is_lib(p)}
    graph = {name: {m for m in _imports(path, top_level_only=False) if m in lib and m != name
                    and not name.startswith(m + ".") and not m.startswith(name + ".")}
             for name, path in lib.items()}
    cycles = [c for c in (_cycle_from(m, graph) for m in sorted(graph)) if c]
    assert not cycles, cycles[0]


def test_the_script_check_finds_an_entry_script_import(tmp_path: Path) -> None:
    bench = tmp_path / "scripts" / "bench"
    bench.mkdir(parents=True)
    (bench / "one.py").write_text("import two\n")
    (bench / "two.py").write_text("import sys\nsys.path.insert(0, '.')\nfrom scripts.bench import one\n")
    global SCRIPTS, ROOT
    saved = SCRIPTS, ROOT
    SCRIPTS, ROOT = tmp_path / "scripts", tmp_path
    try:
        found = script_import_problems(sorted(bench.glob("*.py")))
    finally:
        SCRIPTS, ROOT = saved
    assert found == ["scripts/bench/one.py imports the entry script two",
                     "scripts/bench/two.py edits sys.path",
                     "scripts/bench/two.py imports the entry script scripts.bench",
                     "scripts/bench/two.py imports the entry script scripts.bench.one"]
