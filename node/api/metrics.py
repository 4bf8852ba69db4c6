"""The run's metrics: one JSON line per step in ``RUN_DIR/metrics.jsonl``; the same rows, as Prometheus
metric families, for the status API's ``/metrics`` (``render_prometheus``). There is one path: the row a
step writes is the row the API and Prometheus serve.

Prometheus types follow what a value means: running totals (steps, batches, groups, bytes) are counters
(``swarm_node_<name>_total``), everything else is a gauge; dict-valued metrics (counts by reason) get a
``reason`` label, or what their keys are (``peer`` for the screen's figures by author, ``dataset``).
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

PREFIX = "swarm_node_"
COUNTERS = frozenset({
    "step", "batches_published", "batches_accepted", "batches_rejected", "ingest_groups_accepted",
    "ingest_retokenized", "ingest_reanchored", "ingest_answers_verified", "ingest_rejected", "ingest_surplus",
})
"""Record keys that only ever grow over a run (Prometheus counters); every other number is a gauge."""
_LABELS = {"screen_length_bound": "dataset"}
"""The label of a dict-valued metric's keys where they are not reasons (``screen_peer_*``: ``peer``)."""
_SKIPPED = frozenset({"time"})  # the wall clock of the row: served as swarm_node_last_step_timestamp_seconds


def peak_rss_mb() -> float:
    """The process's peak resident memory so far, in MiB (``getrusage``'s high-water mark)."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1024 if sys.platform != "darwin" else peak / 2**20  # KiB on Linux, bytes on macOS


class MetricsWriter:
    """Appends one line per step, flushed to disk as it is written.

    On resume, lines of steps after the restored checkpoint are dropped (they will be redone), so the file
    never holds two lines for one step. With ``max_bytes``, the file is compacted whenever it grows past
    that size (``compact_rows``): the newest half of it is kept as written and the older rows are thinned
    to a quarter of it, at a uniform stride over the steps (evaluation rows at their own stride), so the
    file stays under ``max_bytes`` however long the run, with the whole run's history at a coarser
    resolution.
    """

    def __init__(self, path: str | Path, resume_step: int = 0, max_bytes: int | None = None,
                 eval_every: int = 1) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.eval_every = eval_every
        self.compactions = 0
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

    def write(self, record: dict[str, Any]) -> dict[str, Any]:
        """Write one row; returns it as written (non-finite floats as None), a new dict."""
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        self._fh.write(json.dumps(clean, sort_keys=False) + "\n")
        self._fh.flush()
        if self.max_bytes is not None and self._fh.tell() > self.max_bytes:
            self._compact()
        return clean

    def _compact(self) -> None:
        """Rewrite the file through a temporary file and a rename (a crash leaves the old or the new one)."""
        self._fh.close()
        lines = self.path.read_text(encoding="utf-8").splitlines()
        limit = self.max_bytes or 0
        kept = compact_rows(lines, limit // 2, limit // 4, self.eval_every)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(k + "\n" for k in kept), encoding="utf-8")
        os.replace(tmp, self.path)
        self.compactions += 1
        logger.info("%s past %d bytes: compacted from %d to %d rows (older rows thinned)", self.path.name,
                    self.max_bytes, len(lines), len(kept))
        self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 -- closed by close()

    def close(self) -> None:
        self._fh.close()


def _size(lines: list[str]) -> int:
    return sum(len(line) + 1 for line in lines)


def _thinned(rows: list[tuple[int, str]], budget: int, key: int) -> list[tuple[int, str]]:
    """``rows`` (step, line) whose ``step // key`` is a multiple of the smallest power of two that keeps
    them within ``budget`` bytes: a uniform stride over the steps, so thinning again keeps a subset."""
    stride = 1
    while True:
        kept = [(step, line) for step, line in rows if (step // key) % stride == 0]
        if _size([line for _, line in kept]) <= budget or not kept:
            return kept
        stride *= 2


def compact_rows(lines: list[str], recent_bytes: int, older_bytes: int, eval_every: int = 1) -> list[str]:
    """``lines`` (one JSON row each, oldest first): the newest ``recent_bytes`` kept whole, the rows before
    them thinned to at most ``older_bytes``: evaluation rows (every ``eval_every`` steps) to a quarter of it,
    the others to the rest, each at a uniform stride over the steps. The run's first row stays."""
    cut, size = len(lines), 0
    while cut > 0 and size + len(lines[cut - 1]) + 1 <= recent_bytes:
        cut -= 1
        size += len(lines[cut]) + 1
    if cut <= 1:
        return lines
    first, older, recent = lines[0], lines[1:cut], lines[cut:]
    rows = []
    for line in older:
        try:
            rows.append((int(json.loads(line)["step"]), line))
        except (ValueError, KeyError, TypeError):
            continue  # a line cut short by a crash
    evals = _thinned([r for r in rows if '"eval_accuracy"' in r[1]], older_bytes // 4, max(1, eval_every))
    budget = older_bytes - len(first) - 1 - _size([line for _, line in evals])
    others = _thinned([r for r in rows if '"eval_accuracy"' not in r[1]], budget, 1)
    kept = sorted(evals + others, key=lambda r: r[0])
    return [first, *(line for _, line in kept), *recent]


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All complete lines of a metrics file."""
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def metric_name(key: str) -> str:
    """``train/clip_frac`` -> ``swarm_node_train_clip_frac`` (Prometheus names allow [a-zA-Z0-9_:])."""
    return PREFIX + "".join(c if c.isalnum() or c == "_" else "_" for c in key)


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return None


def _families(record: Mapping[str, Any], gauges: Mapping[str, float]) -> Iterator[Any]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    for key, value in record.items():
        if key in _SKIPPED:
            continue
        family_type = CounterMetricFamily if key in COUNTERS else GaugeMetricFamily
        name = "swarm_node_steps" if key == "step" else metric_name(key)
        if isinstance(value, Mapping):
            label = _LABELS.get(key, "peer" if key.startswith("screen_peer_") else "reason")
            family = family_type(name, f"{key} by {label}", labels=[label])
            for reason, count in sorted(value.items()):
                number = _number(count)
                if number is not None:
                    family.add_metric([str(reason)], number)
            yield family
            continue
        number = _number(value)
        if number is not None:
            yield family_type(name, key, value=number)
    if "time" in record and _number(record["time"]) is not None:
        yield GaugeMetricFamily(PREFIX + "last_step_timestamp_seconds", "when the last step ended",
                                value=float(record["time"]))
    for key, value in gauges.items():
        yield GaugeMetricFamily(metric_name(key), key, value=value)


def render_prometheus(record: Mapping[str, Any], gauges: Mapping[str, float] | None = None) -> bytes:
    """The Prometheus text exposition of one metrics row plus extra live gauges (e.g. ``up``)."""
    from prometheus_client import CollectorRegistry, generate_latest

    class _Row:
        def collect(self) -> Iterator[Any]:
            return _families(record, gauges or {})

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Row())
    return generate_latest(registry)
