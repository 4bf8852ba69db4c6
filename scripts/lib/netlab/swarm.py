"""A swarm formed as docs/swarm.md forms one, with processes in the network-namespace lab (or on loopback).

The owner signs a descriptor (``swarm-node swarm init -c configs/swarm-shared.yaml``) naming the hosts'
addresses and libp2p keys; each host runs ``swarm-node host --swarm FILE -c configs/host.yaml``; each member
runs ``swarm-node start --swarm URL -c configs/public-swarm.yaml`` with nothing but its own listen address
and NAT mode (and the small per-step settings a test or benchmark wants). Every process's output goes to a
log file beside its run dir; ``Member`` reads its peer id, trace and metrics from there. Used by
``tests/swarm/test_netns.py`` and ``scripts/lab/wan_swarm.py --hosts``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["API_PORT", "PORT", "Member", "cli", "host_peer_id", "init_swarm", "member_command", "names_resolved", "remembered",
           "start_host", "start_member", "wait_for_text"]

ROOT = Path(__file__).resolve().parents[3]
PORT = 31337
API_PORT = 8780
CLI = [sys.executable, "-m", "node.cli"]


def cli(*args: str) -> list[str]:
    """A ``swarm-node`` command line, run with this Python from the repository root."""
    return [*CLI, *args]


def process_env(run_dir: Path) -> dict[str, str]:
    """Each process pins swarm owners in its own run dir, and finds this repository's code."""
    return {**os.environ, "SWARM_NODE_KNOWN_SWARMS": str(run_dir / "known_swarms"), "PYTHONPATH": str(ROOT),
            "OMP_NUM_THREADS": "1"}


def init_swarm(base: Path, host_ips: list[str], *, swarm_id: str = "lab-swarm", overrides: list[str] = (),  # type: ignore[assignment]
               expires_days: float = 1.0) -> tuple[Path, list[Path]]:
    """Sign a descriptor for hosts at ``host_ips`` (port ``PORT``) with a new owner key, as an owner would
    (``swarm-node swarm init`` making each host's libp2p key): ``(descriptor path, the hosts' key files)``.
    ``overrides`` change the shared settings."""
    base.mkdir(parents=True, exist_ok=True)
    keys = [base / f"host{i}" / "p2p.key" for i in range(len(host_ips))]
    out = base / "swarm.yaml"
    args = ["swarm", "init", "-c", str(ROOT / "configs" / "swarm-shared.yaml"), "--id", swarm_id, "--key",
            str(base / "owner.pem"), "--out", str(out), "--force", "--expires-days", str(expires_days)]
    for ip, key in zip(host_ips, keys):  # each host's key made here, its peer id written into its address
        args += ["--host", f"/ip4/{ip}/tcp/{PORT}", "--host-key", str(key)]
    done = subprocess.run(cli(*args, *overrides), capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    if done.returncode != 0:
        raise RuntimeError(f"swarm init failed: {done.stderr.strip()}")
    return out, keys


def start_host(popen: Any, descriptor: str, run_dir: Path, key: Path, *extra: str) -> subprocess.Popen[Any]:
    """``swarm-node host`` with ``popen`` (a lab ``Host.popen`` or ``subprocess.Popen``); output in
    ``RUN_DIR.log``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    log = open(run_dir.with_suffix(".log"), "wb")  # noqa: SIM115 -- kept open by the child
    args = cli("host", "--swarm", descriptor, "-c", str(ROOT / "configs" / "host.yaml"), "--run-dir", str(run_dir),
               "--p2p-key", str(key), f"api.port={API_PORT}", *extra)
    proc: subprocess.Popen[Any] = popen(args, stdout=log, stderr=subprocess.STDOUT, env=process_env(run_dir), cwd=ROOT,
                                        start_new_session=True)
    return proc


def member_command(source: str, run_dir: Path, ip: str, *, nat: bool | None, extra: list[str] = ()) -> list[str]:  # type: ignore[assignment]
    """``swarm-node start --swarm SOURCE``: a member's own settings only (listen address, NAT mode, trace).
    ``nat=None`` leaves the config's ``client_mode: auto``: the member finds out whether peers can dial it."""
    mode = [] if nat is None else [f"swarm.client_mode={'true' if nat else 'false'}"]
    return cli("start", "--swarm", source, "-c", str(ROOT / "configs" / "public-swarm.yaml"), "--run-dir",
               str(run_dir), "--no-progress", f"swarm.host_maddrs=[/ip4/{ip}/tcp/{PORT}]", *mode,
               "swarm.trace_path=trace.jsonl", *extra)


def host_peer_id(descriptor: Path, index: int = 0) -> str:
    """The libp2p peer id of a descriptor's ``index``-th host (the last ``/p2p/`` of its address)."""
    import yaml

    return str(yaml.safe_load(descriptor.read_text())["hosts"][index]).rsplit("/p2p/", 1)[1]


def remembered(run_dir: Path) -> list[str]:
    """The peers a member saved in its run dir (``known_peers.txt``)."""
    path = run_dir / "known_peers.txt"
    return [ln for ln in path.read_text().splitlines() if ln and not ln.startswith("#")] if path.exists() else []


@contextlib.contextmanager
def names_resolved(lab_hosts: list[Any], names: dict[str, str]) -> Iterator[None]:
    """Inside ``lab_hosts``, host names resolve to the given IPs (``/etc/netns/<namespace>/hosts``, which
    ``ip netns exec`` mounts over ``/etc/hosts``): a descriptor's ``/dns4/`` addresses work in the lab.
    The files are removed at the end."""
    made = []
    try:
        for host in lab_hosts:
            folder = Path("/etc/netns") / host.netns
            folder.mkdir(parents=True, exist_ok=True)
            made.append(folder)
            lines = ["127.0.0.1 localhost", *(f"{ip} {name}" for name, ip in names.items())]
            (folder / "hosts").write_text("\n".join(lines) + "\n")
        yield
    finally:
        for folder in made:
            with contextlib.suppress(OSError):
                (folder / "hosts").unlink()
                folder.rmdir()


def wait_for_text(path: Path, pattern: str, timeout: float, proc: subprocess.Popen[Any] | None = None) -> re.Match[str]:
    """The first match of ``pattern`` in the file at ``path`` once it appears (``RuntimeError`` after
    ``timeout``, or at once if ``proc`` exits)."""
    deadline = time.monotonic() + timeout
    while True:
        text = path.read_text(errors="replace") if path.exists() else ""
        found = re.search(pattern, text)
        if found:
            return found
        if (proc is not None and proc.poll() is not None) or time.monotonic() > deadline:
            raise RuntimeError(f"{pattern!r} not in {path} after {timeout:.0f} s:\n{text[-3000:]}")
        time.sleep(0.5)


@dataclass(eq=False)
class Member:
    """A member process and what its run dir says."""

    run_dir: Path
    proc: subprocess.Popen[Any]
    started: float

    @property
    def log(self) -> Path:
        return self.run_dir.with_suffix(".log")

    def peer_id(self, timeout: float = 300) -> str:
        return wait_for_text(self.log, r"swarm-node: peer id (\S+)", timeout, self.proc).group(1)

    def trace(self) -> list[dict[str, Any]]:
        events = []
        with contextlib.suppress(OSError):
            for line in (self.run_dir / "trace.jsonl").read_text().splitlines():
                with contextlib.suppress(json.JSONDecodeError):
                    events.append(json.loads(line))
        return events

    def accepted_from(self, peer_id: str, after: float = 0.0) -> int:
        """Batches of ``peer_id`` this member accepted that were created after ``after`` (Unix time)."""
        return sum(1 for e in self.trace() if e.get("ev") == "acc" and peer_id.startswith(e.get("author", "-"))
                   and float(e.get("created", 0)) > after)

    def steps(self) -> int:
        path = self.run_dir / "metrics.jsonl"
        return sum(1 for _ in path.open()) if path.exists() else 0


def start_member(popen: Any, source: str, run_dir: Path, ip: str, *, nat: bool | None,
                 extra: list[str] = ()) -> Member:  # type: ignore[assignment]
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    log = open(run_dir.with_suffix(".log"), "ab")  # noqa: SIM115 -- kept open by the child; a restart appends
    run_dir.mkdir(parents=True, exist_ok=True)
    proc = popen(member_command(source, run_dir, ip, nat=nat, extra=list(extra)), stdout=log,
                 stderr=subprocess.STDOUT, env=process_env(run_dir), cwd=ROOT, start_new_session=True)
    return Member(run_dir, proc, time.time())
