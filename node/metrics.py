"""The run's metrics: one JSON line per step in ``RUN_DIR/metrics.jsonl``; the same rows, as Prometheus
metric families, for the status API's ``/metrics`` (``render_prometheus``). There is one path: the row a
step writes is the row the API and Prometheus serve.

Prometheus types follow what a value means: running totals (steps, batches, groups, bytes) are counters
(``swarm_node_<name>_total``), everything else is a gauge; dict-valued metrics (counts by reason) get a
``reason`` label.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

PREFIX = "swarm_node_"
COUNTERS = frozenset({
    "step", "batches_published", "batches_accepted", "batches_rejected", "ingest_groups_accepted",
    "ingest_retokenized", "ingest_rejected",
})
"""Record keys that only ever grow over a run (Prometheus counters); every other number is a gauge."""
_SKIPPED = frozenset({"time"})  # the wall clock of the row: served as swarm_node_last_step_timestamp_seconds


def peak_rss_mb() -> float:
    """The process's peak resident memory so far, in MiB (``getrusage``'s high-water mark)."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1024 if sys.platform != "darwin" else peak / 2**20  # KiB on Linux, bytes on macOS


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

    def write(self, record: dict[str, Any]) -> dict[str, Any]:
        """Write one row; returns it as written (non-finite floats as None), a new dict."""
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        self._fh.write(json.dumps(clean, sort_keys=False) + "\n")
        self._fh.flush()
        return clean

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
            family = family_type(name, f"{key} by reason", labels=["reason"])
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
