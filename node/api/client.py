"""``swarm-node status``: a one-screen summary of a running node, read from its status API.

Standard library only (no torch, no aiohttp), so it answers in a blink on a server without a browser.
Exit codes: 0 healthy, 1 reachable but unhealthy (no progress within ``api.stall_seconds``), 2 a usage
mistake (e.g. ``--run-dir`` names no run dir), 3 not reachable: the token was refused, nothing answers at
the URL, no node runs in the run dir (a stopped node removes its ``api_url``), or the node there is still
starting (``RUN_MARKER``: written as soon as the command made the run dir, before the model loads).
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from node.errors import ConfigError

EXIT_OK, EXIT_UNHEALTHY, EXIT_UNREACHABLE = 0, 1, 3
DEFAULT_URL = "http://127.0.0.1:8770/"
RUN_MARKER = "node.pid"
"""Run-dir file a running ``silo`` or ``start`` command keeps from the moment it made the run dir until it ends:
``{"pid", "started_at" (the command's start, Unix time), "api" (whether a status API will answer)}``."""
_MAX_PEER_ROWS = 12


def api_banner(url: str) -> str:
    """The line ``silo`` and ``start`` print once the API is up."""
    return f"swarm-node: dashboard and status API at {url} (swarm-node status --url {url})"


class Unreachable(Exception):
    """The node did not answer (or refused our token)."""


def resolve_url(url: str | None, run_dir: str | None) -> str:
    """``--url``, else the URL a node running in ``--run-dir`` wrote to ``RUN_DIR/api_url``, else the default.

    ``ConfigError`` (exit 2) when ``--run-dir`` is not a run dir at all; ``Unreachable`` (exit 3) when it is
    one but no node with an API runs there now."""
    if url:
        return url if url.endswith("/") else url + "/"
    if run_dir:
        folder = Path(run_dir)
        path = folder / "api_url"
        if path.is_file():
            return path.read_text().strip()
        running = running_command(folder)
        if running is not None:
            pid, started_at, api = running
            age = max(0.0, time.time() - started_at)
            if api:
                raise Unreachable(f"the node in {run_dir} is starting (pid {pid}, {age:.0f} s since its command "
                                  "started: loading the model and the network side); its status API answers once it "
                                  "is ready")
            raise Unreachable(f"the node in {run_dir} runs (pid {pid}, for {age:.0f} s) without a status API "
                              "(api.port is not set)")
        if not (folder / "config.yaml").is_file():
            raise ConfigError(f"--run-dir {run_dir!r} is not a run dir (no config.yaml); pass the --run-dir the "
                              "node was started with")
        raise Unreachable(f"no node is running in {run_dir} (no api_url and no {RUN_MARKER}: it stopped)")
    return DEFAULT_URL


def running_command(folder: Path) -> tuple[int, float, bool] | None:
    """``(pid, started_at, api)`` of the command that runs in run dir ``folder`` (its ``RUN_MARKER``), or None
    when none does (no marker, one that does not parse, or its process is gone: killed with ``kill -9``)."""
    try:
        doc = json.loads((folder / RUN_MARKER).read_text(encoding="utf-8"))
        pid, started_at, api = int(doc["pid"]), float(doc["started_at"]), bool(doc["api"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:  # another user's process: it exists
        pass
    return pid, started_at, api


def fetch(base: str, path: str, token: str | None, timeout: float) -> tuple[int, Any]:
    """``(HTTP status, decoded JSON)``; 503 (unhealthy) is an answer, not an error."""
    req = urllib.request.Request(base.rstrip("/") + path, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 401:
            raise Unreachable("the node wants a bearer token (--token or SWARM_NODE_API_TOKEN)") from None
        if exc.code == 503:
            return 503, json.loads(exc.read())
        raise Unreachable(f"HTTP {exc.code} from {base}{path.lstrip('/')}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise Unreachable(f"{base} is not answering ({reason})") from None


def _num(value: Any, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _duration(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}h {s % 3600 // 60:02d}m {s % 60:02d}s" if s >= 3600 else f"{s // 60}m {s % 60:02d}s"


def _bytes(n: int) -> str:
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def table(rows: list[list[str]]) -> list[str]:
    """Left-aligned columns, two spaces apart."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]


def _speed(s: dict[str, Any]) -> str:
    """The median of the recent steps (one slow step, e.g. an evaluation, does not set it), and the last."""
    recent = s.get("recent") or {}
    n = recent.get("steps") or 0
    if not n:
        return f"{_num(s['tokens_per_s'], 0)} tokens/s · {_num(s['step_seconds'], 2)} s a step"
    return (f"{_num(recent['tokens_per_s_median'], 0)} tokens/s · {_num(recent['step_seconds_median'], 2)} s a step "
            f"(median of the last {n} steps; last step {_num(s['step_seconds'], 2)} s)")


def _decision(d: dict[str, Any]) -> str:
    """A deciding node's line: its last decision, the alignment estimate and the decisions so far."""
    estimate = ("no estimate yet" if d["alignment_mean"] is None else
                f"alignment {_num(d['alignment_mean'], 3)} ± {_num(d['alignment_se'], 3)} over {d['alignments']} steps")
    return (f"{d['last']} · {estimate} · peers taken {d['steps_taken']} steps (probes {d['probes']}), "
            f"declined {d['steps_declined']}")


def render(url: str, status: dict[str, Any], peers: dict[str, Any], health: dict[str, Any]) -> str:
    s, net = status, status["network"]
    ev = s["last_eval"]
    of_total = "" if s["total_steps"] is None else f" / {s['total_steps']}"
    summary = [
        ["node", f"{s['mode']} · {s['model']} ({s['adapter']}) · run {s['run_dir']} · v{s['version']}"],
        ["device", str(s.get("device") or "-")],
        ["state", f"{s['state']} · step {s['step']}{of_total} · up {_duration(s['uptime_s'])}"],
        ["health", ("ok" if health["ok"] else "STALLED") + f" · last progress {health['seconds_since_progress']:.1f} s ago"
         f" (limit {health['stall_seconds']:.0f} s)"],
        ["reward", f"{_num(s['last_reward'], 3)} last step · eval {_num(ev and ev['accuracy'], 3)}"
         + (f" at step {ev['step']}" if ev else "")],
        ["speed", _speed(s)],
        ["network", ("off" if s["mode"] == "silo" else "connected" if net["connected"] else "NOT CONNECTED")
         + f" · {net['reason']}"
         + (f" · {net['restarts']} restarts, last error: {net['last_error']}" if net["restarts"] else "")],
    ]
    if s["mode"] == "swarm":
        summary.insert(1, ["peer id", f"{s['peer_id']} · swarm {s['swarm_id']}"])
        summary.append(["shared", f"{s['published']['batches']} batches, {s['published']['groups']} groups"])
    if decision := s.get("peer_decision"):
        summary.append(["peers pay?", _decision(decision)])
    lines = [f"swarm-node status of {url}", *table(summary)]
    rows = peers["peers"]
    if s["mode"] == "swarm":
        lines.append("")
        if not rows:
            lines.append("no peers yet")
        else:
            head = ["peer", "conn", "batches", "groups", "ingested", "rejected", "in", "out", "seen", "banned"]
            body = [[p["peer_id"][:14] + "…", "yes" if p["connected"] else "no", str(p["batches_accepted"]),
                     str(p["groups_accepted"]), str(p["groups_ingested"]),
                     ",".join(f"{k}:{v}" for k, v in sorted(p["rejected"].items())) or "-",
                     _bytes(p["bytes_in"]), _bytes(p["bytes_out"]),
                     f"{max(0.0, peers['time'] - p['last_seen']):.0f}s ago",
                     "-" if p["banned_until"] is None else f"{p['banned_until'] - peers['time']:.0f}s"]
                    for p in rows[:_MAX_PEER_ROWS]]
            lines += table([head, *body])
            if len(rows) > _MAX_PEER_ROWS:
                lines.append(f"... and {len(rows) - _MAX_PEER_ROWS} more (GET /api/peers)")
    return "\n".join(lines)


def status_command(url: str, token: str | None, timeout: float = 5.0) -> tuple[int, str]:
    """``(exit code, text to print)``."""
    try:
        code, health = fetch(url, "/healthz", token, timeout)
        _, status = fetch(url, "/api/status", token, timeout)
        _, peers = fetch(url, "/api/peers", token, timeout)
    except Unreachable as exc:
        return EXIT_UNREACHABLE, f"swarm-node status: {exc}"
    text = render(url, status, peers, health)
    if code != 200:
        return EXIT_UNHEALTHY, text + f"\nunhealthy: no progress for {health['seconds_since_progress']:.0f} s"
    return EXIT_OK, text

