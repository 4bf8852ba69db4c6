"""``tracking`` and ``api``: where a run's history goes, and the status API and dashboard."""

from __future__ import annotations

import ipaddress
from typing import Literal

from pydantic import Field

from node.config.section import Section

API_TOKEN_ENV = "SWARM_NODE_API_TOKEN"


class WandbConfig(Section):
    """Weights & Biases (the ``tracking`` extra): ``offline`` needs no network (``wandb sync`` later)."""

    project: str = Field("swarm-node", min_length=1)
    mode: Literal["online", "offline"] = "online"
    entity: str | None = None
    name: str | None = Field(None, description="the run's name (default: the run dir's name)")


class TrackingConfig(Section):
    """Where a run's history goes besides ``metrics.jsonl``, and how big the run's own records may grow."""

    tensorboard: bool = Field(False, description="event files in RUN_DIR/tensorboard (the tracking extra)")
    wandb: WandbConfig | None = Field(None, description="log to Weights & Biases (the tracking extra)")
    histogram_every: int = Field(10, ge=1, description="steps between histograms (advantages, log-prob gaps)")
    metrics_max_mb: float = Field(32.0, gt=0, description="metrics.jsonl is compacted (older rows thinned) past this")
    log_max_mb: float = Field(8.0, gt=0, description="RUN_DIR/node.log is rotated past this")
    log_backups: int = Field(2, ge=0, description="rotated node.log files kept (node.log.1, ...)")


class ApiConfig(Section):
    """The status API, the dashboard at ``/`` and Prometheus ``/metrics``, all on one port."""

    port: int | None = Field(None, ge=0, le=65535, description="None: off; 0: any free port (the URL is printed)")
    host: str = Field("127.0.0.1", description="a non-loopback address needs a token")
    token: str | None = Field(None, min_length=16, description=f"bearer token (or ${API_TOKEN_ENV})")
    stall_seconds: float = Field(600.0, gt=0, description="/healthz fails when no step completed for this long")
    max_cpu_share: float = Field(0.01, gt=0, le=1, description="most of one core the API may use; requests wait beyond")

    @property
    def loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False  # a host name: where it points is not ours to check

