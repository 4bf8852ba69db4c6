"""``HostConfig``: the settings of ``swarm-node host`` (``configs/host.yaml`` plus ``a.b=value`` overrides).

A host's swarm settings are ``SwarmSettings``, as a member's: the shared ones come from the swarm's
descriptor (a different local value is refused, as for a member), the rest are the host's own: its
listen and announce addresses (by default those the descriptor lists for its key, on every interface),
its libp2p key file, and how much it keeps for others. ``limits`` are p2pd's (``swarm.host.HostLimits``).
The status page (``api``) is public by default: it shows what any member of the swarm can read from the
DHT, and the signed descriptor; its CPU is capped like a node's API.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from node.errors import ConfigError
from swarm.settings import SwarmSettings

__all__ = ["HostApiConfig", "HostConfig", "HostLimitsConfig", "validate_host_config"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HostApiConfig(_Section):
    port: int | None = Field(8780, ge=0, le=65535, description="the status page's port; None: off; 0: any free port")
    host: str = Field("0.0.0.0", description="where the page listens; it shows only what any swarm member can read")
    max_cpu_share: float = Field(0.02, gt=0, le=1, description="most of one core the page may use; requests wait beyond")


class HostLimitsConfig(_Section):
    max_connections: int = Field(512, ge=8, description="connections p2pd keeps open at most (trimmed to half beyond)")
    relay_circuits_per_peer: int = Field(4, ge=1, description="relayed connections through this host per peer")
    relay_reservations: int = Field(128, ge=0, description="members behind NAT holding a relay slot at once")
    relay_bytes: int = Field(64 * 1024 * 1024, ge=1024, description="bytes a relayed connection carries each way")
    relay_seconds: int = Field(600, ge=1, description="how long a relayed connection may stay open")


class HostConfig(_Section):
    run_dir: str = "runs/host"
    api: HostApiConfig = HostApiConfig()
    limits: HostLimitsConfig = HostLimitsConfig()
    health_every: float = Field(30.0, gt=0, description="seconds between two checks of the swarm's other hosts")
    max_members: int = Field(1024, ge=1, description="members the status page keeps (the longest unseen go first)")
    swarm: SwarmSettings = SwarmSettings()


def validate_host_config(data: dict[str, object]) -> HostConfig:
    """A ``HostConfig`` from a mapping; one ``ConfigError`` naming every bad field."""
    try:
        cfg = HostConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'config'}: {str(e['msg']).removeprefix('Value error, ')}"
                             for e in exc.errors())
        raise ConfigError(f"invalid host config: {problems}") from None
    if cfg.swarm.client_mode:
        raise ConfigError("swarm.client_mode: a host accepts connections; remove it (or set false)")
    return cfg
