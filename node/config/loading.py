"""Loading a config: YAML plus ``a.b=value`` overrides, every problem reported at once in one
``ConfigError``; and what the environment and the command line add (the API token, initial peers)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from node.config.operating import API_TOKEN_ENV, ApiConfig
from node.config.root import NodeConfig
from node.errors import ConfigError
from swarm.settings import SwarmSettings, initial_peers_from_env

_RENAMED = {"swarm.staleness_epochs": "swarm.read_epochs", "ingest.screen_ban_share": "ingest.screen_pause_share",
            "ingest.screen_ban_window": "ingest.screen_pause_window"}
_REMOVED = {"metrics": "section removed: Prometheus /metrics is served by the status API now; "
                       "use api.port (and api.host) instead of metrics.prometheus_port"}


def _parse_scalar(text: str) -> Any:
    """Parse an override value the way YAML would (``3`` -> 3, ``true`` -> True, ``[a, b]`` -> list)."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``a.b.c=value`` overrides to a nested dict (in place) and return it."""
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r} is not of the form key=value (e.g. train.steps=150)")
        parts = key.strip().split(".")
        node = data
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: {part!r} is a value, not a section")
            node = child
        node[parts[-1]] = _parse_scalar(value)
    return data


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """One line for a YAML error (PyYAML's own message spans several, with a source excerpt)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).strip().splitlines()[0]
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else problem


def _format_errors(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        field = ".".join(str(p) for p in e["loc"]) or "<root>"
        msg = str(e["msg"]).removeprefix("Value error, ").removeprefix(f"{e['loc'][-1] if e['loc'] else ''}: ")
        if e["type"] == "value_error" and not e["loc"]:  # a cross-section rule: its message names the fields
            lines.append(msg)
            continue
        if e["type"] == "extra_forbidden":
            msg = f"renamed to {_RENAMED[field]}" if field in _RENAMED else _REMOVED.get(field) or (
                "unknown key; check the spelling against configs/ and docs/configuration.md")
        elif e["type"] == "literal_error":
            msg = msg.replace("Input should be", "must be")
        if e["type"] != "extra_forbidden" and not isinstance(e.get("input"), dict):  # a section's value says nothing
            msg += f" (got {e.get('input')!r})"
        lines.append(f"{field}: {msg}")
    return "; ".join(lines)


def load_config_data(path: str | os.PathLike[str] | None, overrides: list[str] | None = None) -> dict[str, Any]:
    """A YAML config (or nothing when ``path`` is None) with ``overrides`` applied, not yet validated: what
    the user set, for a check that must tell set keys from defaults (``node.config.join``)."""
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {str(p)!r} not found; pass an existing file, e.g. configs/tiny-silo.yaml")
        try:
            loaded = yaml.safe_load(p.read_text())
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {str(p)!r} is not valid YAML: {_yaml_problem(exc)}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config file {str(p)!r} must hold a mapping of sections at the top level")
        data = loaded or {}
    return apply_overrides(data, overrides or [])


def validate_config(data: dict[str, Any]) -> NodeConfig:
    """A ``NodeConfig`` from ``load_config_data``'s mapping; one ``ConfigError`` naming every bad field."""
    try:
        return NodeConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"invalid config: {_format_errors(exc)}") from None


def load_config(path: str | os.PathLike[str] | None, overrides: list[str] | None = None) -> NodeConfig:
    """Load a YAML config (or the defaults when ``path`` is None), apply overrides, validate."""
    return validate_config(load_config_data(path, overrides))


def load_recorded_config(path: str | os.PathLike[str], overrides: list[str] | None = None) -> NodeConfig:
    """``load_config`` for a config a node recorded in its run dir (``config.yaml``), which an older version
    may have written: a key renamed since is read under its new name (a user's own config is told "renamed to"
    instead, so that it gets mended)."""
    data = load_config_data(path, overrides)
    for old, new in _RENAMED.items():
        *parents, key = old.split(".")
        section: Any = data
        for part in parents:
            section = section.get(part) if isinstance(section, dict) else None
        if not isinstance(section, dict) or key not in section:
            continue
        value = section.pop(key)
        *new_parents, new_key = new.split(".")
        target = data
        for part in new_parents:
            target = target.setdefault(part, {})
        target.setdefault(new_key, value)
    return validate_config(data)


def resolve_initial_peers(cfg: NodeConfig, cli_peers: list[str] | None) -> list[str]:
    """CLI flag, then ``SWARM_INITIAL_PEERS``, then the config, first non-empty wins."""
    if cli_peers:
        return list(cli_peers)
    env = initial_peers_from_env()
    return env or list(cfg.swarm.initial_peers)


def with_initial_peers(cfg: NodeConfig, cli_peers: list[str] | None) -> NodeConfig:
    """``cfg`` with its swarm settings' initial peers resolved and checked (``ConfigError`` if bad)."""
    peers = resolve_initial_peers(cfg, cli_peers)
    try:
        settings = SwarmSettings.model_validate({**cfg.swarm.model_dump(), "initial_peers": peers})
    except ValidationError as exc:
        reasons = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
        raise ConfigError(f"swarm: {reasons}") from None
    return cfg.model_copy(update={"swarm": settings})


def resolve_api(cfg: NodeConfig, environ: Mapping[str, str] | None = None) -> ApiConfig:
    """``cfg.api`` with its token taken from ``$SWARM_NODE_API_TOKEN`` when the config has none; a
    non-loopback bind without a token is a ``ConfigError``."""
    env = os.environ if environ is None else environ
    api = cfg.api
    if api.token is None and env.get(API_TOKEN_ENV):
        token = env[API_TOKEN_ENV]
        if len(token) < 16:
            raise ConfigError(f"{API_TOKEN_ENV}: the token must be at least 16 characters")
        api = api.model_copy(update={"token": token})
    if api.port is not None and not api.loopback and api.token is None:
        raise ConfigError(f"api.host: {api.host!r} is reachable from other machines; set api.token=<secret> or "
                          f"{API_TOKEN_ENV} (clients then send 'Authorization: Bearer <secret>'), or bind 127.0.0.1")
    return api

