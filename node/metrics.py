"""The run's metrics sink: one JSON line per step in ``RUN_DIR/metrics.jsonl`` and, when a port is
configured, the same numbers as Prometheus gauges (``swarm_node_<name>``) on ``http://HOST:PORT/metrics``."""

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

    def __init__(self, path: str | Path, resume_step: int = 0, prometheus: PrometheusExporter | None = None) -> None:
        self.path = Path(path)
        self.prometheus = prometheus
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
        if self.prometheus is not None:
            self.prometheus.update(clean)

    def close(self) -> None:
        self._fh.close()
        if self.prometheus is not None:
            self.prometheus.close()


class PrometheusExporter:
    """Serves every numeric metric as a gauge; dict-valued metrics (counts by reason) get a label."""

    def __init__(self, host: str, port: int) -> None:
        from prometheus_client import CollectorRegistry, start_http_server

        self.registry = CollectorRegistry()
        self._gauges: dict[str, Any] = {}
        self.server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        self.port = self.server.server_port

    def _gauge(self, name: str, labelled: bool) -> Any:
        from prometheus_client import Gauge

        key = "swarm_node_" + "".join(c if c.isalnum() else "_" for c in name)
        if key not in self._gauges:
            self._gauges[key] = Gauge(key, name, ["reason"] if labelled else [], registry=self.registry)
        return self._gauges[key]

    def update(self, record: dict[str, Any]) -> None:
        for name, value in record.items():
            if isinstance(value, bool) or value is None:
                value = float(value) if isinstance(value, bool) else None
            if isinstance(value, (int, float)):
                self._gauge(name, False).set(value)
            elif isinstance(value, dict):
                gauge = self._gauge(name, True)
                for reason, count in value.items():
                    if isinstance(count, (int, float)):
                        gauge.labels(reason=str(reason)).set(count)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All complete lines of a metrics file."""
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out
