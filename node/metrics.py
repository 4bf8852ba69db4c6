"""The run's metrics sink: one JSON line per step in ``RUN_DIR/metrics.jsonl``."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any


class MetricsWriter:
    """Appends one line per step, flushed to disk as it is written.

    On resume, lines of steps after the restored checkpoint are dropped (they will be redone), so the file
    never holds two lines for one step.
    """

    def __init__(self, path: str | Path, resume_step: int = 0) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._truncate_after(resume_step)
        self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 -- closed by close()

    def _truncate_after(self, step: int) -> None:
        if not self.path.exists():
            return
        kept = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by a crash
            if int(record.get("step", 0)) <= step:
                kept.append(line)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(k + "\n" for k in kept), encoding="utf-8")
        os.replace(tmp, self.path)

    def write(self, record: dict[str, Any]) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        self._fh.write(json.dumps(clean, sort_keys=False) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All complete lines of a metrics file."""
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out
