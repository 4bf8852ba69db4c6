"""``MetricsIndex``: the rows of ``metrics.jsonl`` after a given step, without re-reading the whole file.

It remembers the step and byte span of each complete line (24 bytes a step, not the rows) and reads
only what was appended since the last call. A file replaced or cut short (a resumed run drops the
steps it will redo) is indexed again from the start. Lines are served as the file holds them (they are
already JSON), so a request costs one seek and one read, no parsing. Thread-safe.
"""

from __future__ import annotations

import bisect
import json
import os
import threading
from array import array
from pathlib import Path


class MetricsIndex:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._steps, self._starts, self._ends = array("q"), array("q"), array("q")  # ends exclude the newline
        self._end = 0  # where the indexed part of the file ends
        self._inode: int | None = None

    def _reset(self, inode: int | None) -> None:
        self._steps, self._starts, self._ends = array("q"), array("q"), array("q")
        self._end, self._inode = 0, inode

    def _refresh(self) -> None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._reset(None)
            return
        if st.st_ino != self._inode or st.st_size < self._end:
            self._reset(st.st_ino)
        if st.st_size == self._end:
            return
        with open(self.path, "rb") as fh:
            fh.seek(self._end)
            chunk = fh.read(st.st_size - self._end)
        pos = self._end
        for line in chunk.splitlines(keepends=True):
            if not line.endswith(b"\n"):
                break  # being written: indexed on a later call
            try:
                step = int(json.loads(line)["step"])
            except (ValueError, KeyError, TypeError):
                step = None  # a line cut short by a crash, then appended to: skipped
            if step is not None and (not self._steps or step > self._steps[-1]):
                self._steps.append(step)
                self._starts.append(pos)
                self._ends.append(pos + len(line) - 1)
            pos += len(line)
        self._end = pos

    def last_step(self) -> int:
        with self._lock:
            self._refresh()
            return self._steps[-1] if self._steps else 0

    def rows_after(self, since: int, limit: int) -> tuple[list[bytes], bool]:
        """Up to ``limit`` raw JSON lines of steps after ``since``, and whether more follow."""
        with self._lock:
            self._refresh()
            first = bisect.bisect_right(self._steps, since)
            starts, ends = self._starts[first : first + limit], self._ends[first : first + limit]
            more = first + len(starts) < len(self._steps)
            if not starts:
                return [], False
            with open(self.path, "rb") as fh:
                fh.seek(starts[0])
                data = fh.read(ends[-1] - starts[0])
        base = starts[0]
        return [data[a - base : b - base] for a, b in zip(starts, ends)], more
