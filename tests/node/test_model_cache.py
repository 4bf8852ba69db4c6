"""Model folders made once and cached (``node.sources.cache``): made once under a lock by concurrent
processes, reused afterwards, never left half-made."""

from __future__ import annotations

import json
import multiprocessing
import time
from pathlib import Path

import pytest

from node.sources.cache import DONE_FILE, cache_root, ensure_cached, is_complete


def _make_slowly(folder: Path) -> None:
    """A maker that takes a moment, so two processes overlap, and logs each time it runs."""
    with open(folder.parent / "makes.log", "a") as log:
        log.write("made\n")
    time.sleep(0.5)
    (folder / "weights.bin").write_bytes(b"w" * 10)
    (folder / DONE_FILE).write_text(json.dumps({"ok": True}))


def _ensure_in_child(root: str) -> None:
    import os

    os.environ["SWARM_NODE_CACHE"] = root
    ensure_cached("model-x", _make_slowly, what="making model-x", echo=lambda _line: None)


def test_cache_root_follows_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWARM_NODE_CACHE", str(tmp_path / "a"))
    assert cache_root() == tmp_path / "a"
    monkeypatch.delenv("SWARM_NODE_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "swarm-node"


def test_made_once_then_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWARM_NODE_CACHE", str(tmp_path))
    lines: list[str] = []
    first = ensure_cached("model-x", _make_slowly, what="making model-x", echo=lines.append)
    assert first == tmp_path / "model-x" and is_complete(first) and (first / "weights.bin").is_file()
    assert len(lines) == 1 and "making model-x" in lines[0] and str(first) in lines[0]
    assert ensure_cached("model-x", _make_slowly, what="making model-x", echo=lines.append) == first
    assert len(lines) == 1 and (tmp_path / "makes.log").read_text() == "made\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["makes.log", "model-x", "model-x.lock"]


def test_concurrent_processes_make_it_once(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    children = [ctx.Process(target=_ensure_in_child, args=(str(tmp_path),)) for _ in range(3)]
    for child in children:
        child.start()
    for child in children:
        child.join(60)
        assert child.exitcode == 0
    assert (tmp_path / "makes.log").read_text() == "made\n"
    assert is_complete(tmp_path / "model-x")


def test_a_failed_make_leaves_nothing_and_the_next_attempt_makes_it(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWARM_NODE_CACHE", str(tmp_path))

    def fail(folder: Path) -> None:
        (folder / "weights.bin").write_bytes(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        ensure_cached("model-x", fail, what="making model-x", echo=lambda _line: None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model-x.lock"]

    def forgets_the_record(folder: Path) -> None:
        (folder / "weights.bin").write_bytes(b"w")

    with pytest.raises(RuntimeError, match=f"no {DONE_FILE}"):
        ensure_cached("model-x", forgets_the_record, what="making model-x", echo=lambda _line: None)
    assert not (tmp_path / "model-x").exists()
    # An interrupted earlier attempt (a folder without its record) is replaced.
    (tmp_path / "model-x").mkdir()
    (tmp_path / "model-x" / "stale.bin").write_bytes(b"s")
    made = ensure_cached("model-x", _make_slowly, what="making model-x", echo=lambda _line: None)
    assert sorted(p.name for p in made.iterdir()) == [DONE_FILE, "weights.bin"]
