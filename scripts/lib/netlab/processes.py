"""Node processes a lab started, from the outside: their memory, their p2pd children and watchdogs, and
stopping them all (SIGTERM, then SIGKILL for stragglers)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import psutil


def rss(pid: int) -> int:
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.Error:
        return 0


def p2pd_of(pid: int) -> list[int]:
    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True) if "p2pd" in c.name()]
    except psutil.Error:
        return []


def stop_all(procs: list[subprocess.Popen[bytes]], timeout: float) -> list[int]:
    """SIGTERM every node, SIGKILL stragglers; returns pids (ours or descendants) still alive after."""
    tree = {p.pid for proc in procs for p in _descendants(proc.pid)} | {proc.pid for proc in procs}
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            print(f"node pid {proc.pid} did not stop in {timeout:.0f} s; SIGKILL", file=sys.stderr)
            proc.kill()
            proc.wait(timeout=30)
    time.sleep(3.0)  # the watchdogs notice a dead parent within a second, then give p2pd 2 s
    return [pid for pid in tree if _alive(pid)]


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def watchdogs_of(p2pd_pids: set[int]) -> list[int]:
    """Watchdog shells (``swarm-p2pd-watchdog``) watching any of ``p2pd_pids``, found with ``ps``."""
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    found = []
    for line in out.splitlines():
        pid, _, args = line.strip().partition(" ")
        if "swarm-p2pd-watchdog" in args and any(f" {p}" in args for p in p2pd_pids):
            found.append(int(pid))
    return found
