"""A user-space link emulator: delay, jitter, loss and a rate limit on TUN links between namespaces.

The kernel here has no ``netem`` qdisc, so the lab's wide-area links are emulated by this process. Each
emulated link is a pair of TUN devices, one in the host's namespace (its ``eth0``) and one in the
router's namespace; this process holds both file descriptors and copies every IP packet from one to the
other, applying the link's profile per direction:

* loss: each packet is dropped with probability ``loss``, independently (``netem loss p%``);
* rate: packets are serialized at ``rate_mbit`` one after the other (``netem rate``): a packet leaves the
  rate stage ``size * 8 / rate`` after the previous one; a packet that would wait more than ``queue_ms``
  in that stage is dropped (tail drop, like ``tbf ... latency``);
* delay and jitter: then each packet is held ``delay_ms`` plus a uniform draw in ``[-jitter_ms,
  +jitter_ms]`` (netem's distribution without a table), but never leaves before the packet ahead of it
  on the same direction: order is kept (FIFO), so TCP sees no reordering. A packet behind a more delayed
  one therefore waits for it: a train of back-to-back packets is delayed by up to ``delay + jitter``.

What it does not model, unlike netem: reordering, duplication, corruption, correlated (bursty) loss or
delay, delay distributions other than uniform, and sub-millisecond timers (packets due in the future wait
in ``epoll`` with a 1 ms resolution). Its own cost (a Python read and write per packet) adds latency and
CPU that ``stats`` reports: per direction the packets, bytes and drops, and how late packets left
against their due time; and the process's CPU seconds.

Protocol (one JSON object a line on stdin, one answer a line on stdout)::

    {"cmd": "add", "link": NAME, "host_ns": NS, "host_if": IF, "router_ns": NS, "router_if": IF,
     "up": PROFILE, "down": PROFILE}             -> {"ok": NAME}     (both TUNs exist, down)
    {"cmd": "stats"}                             -> {"stats": {...}, "cpu_s": ..., "t": ...}
    PROFILE = {"delay_ms": 0, "jitter_ms": 0, "loss": 0, "rate_mbit": null, "queue_ms": 400}

``up`` is what the host sends (host -> router), ``down`` what it receives. End of input (or SIGTERM) ends
the process; the TUN devices disappear with their descriptors. Needs root (``setns`` into the
namespaces named under ``/var/run/netns``).
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import random
import resource
import selectors
import signal
import struct
import sys
import time
from collections import deque
from dataclasses import dataclass, field

CLONE_NEWNET = 0x40000000
TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
_MAX_PACKET = 65536
_READ_BURST = 64  # packets read from one descriptor before looking at the others
_libc = ctypes.CDLL(None, use_errno=True)


@dataclass
class Profile:
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss: float = 0.0
    rate_mbit: float | None = None
    queue_ms: float = 400.0


@dataclass
class Direction:
    """One way of one link: packets read from ``src`` are written to ``dst`` as ``profile`` says."""

    name: str
    src: int
    dst: int
    profile: Profile
    rng: random.Random
    queue: deque[tuple[float, bytes]] = field(default_factory=deque)  # (due time, packet), FIFO
    rate_free_at: float = 0.0  # when the rate stage is free again
    last_due: float = 0.0
    packets: int = 0
    nbytes: int = 0
    lost: int = 0
    queue_drops: int = 0
    write_errors: int = 0
    late_sum: float = 0.0
    late_max: float = 0.0

    def take(self, packet: bytes, now: float) -> None:
        """A packet read from ``src`` at ``now``: drop it, or queue it with its due time."""
        p = self.profile
        if p.loss and self.rng.random() < p.loss:
            self.lost += 1
            return
        due = now
        if p.rate_mbit:
            start = max(now, self.rate_free_at)
            if start - now > p.queue_ms / 1000.0:
                self.queue_drops += 1
                return
            self.rate_free_at = start + len(packet) * 8 / (p.rate_mbit * 1e6)
            due = self.rate_free_at
        if p.delay_ms or p.jitter_ms:
            due += max(0.0, p.delay_ms + self.rng.uniform(-p.jitter_ms, p.jitter_ms)) / 1000.0
        due = max(due, self.last_due)  # FIFO: never overtake the packet ahead
        self.last_due = due
        self.queue.append((due, packet))

    def flush(self, now: float) -> None:
        """Write every packet that is due."""
        queue = self.queue
        while queue and queue[0][0] <= now:
            due, packet = queue.popleft()
            try:
                os.write(self.dst, packet)
            except OSError:
                self.write_errors += 1
                continue
            self.packets += 1
            self.nbytes += len(packet)
            late = now - due
            self.late_sum += late
            self.late_max = max(self.late_max, late)

    def snapshot(self) -> dict[str, float | int]:
        return {"packets": self.packets, "bytes": self.nbytes, "lost": self.lost, "queue_drops": self.queue_drops,
                "write_errors": self.write_errors, "queued": len(self.queue),
                "late_mean_ms": 1000 * self.late_sum / max(self.packets, 1), "late_max_ms": 1000 * self.late_max}


def _setns(fd: int, what: str) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns {what}: {os.strerror(err)}")


def open_tun(netns: str, name: str, home: int) -> int:
    """A TUN device called ``name`` created in namespace ``netns``; the process returns to ``home`` (a
    descriptor of its own namespace)."""
    target = os.open(f"/var/run/netns/{netns}", os.O_RDONLY)
    try:
        _setns(target, netns)
    finally:
        os.close(target)
    try:
        fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
        try:
            fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
        except OSError:
            os.close(fd)
            raise
        return fd
    finally:
        _setns(home, "back")


class Emulator:
    def __init__(self, seed: int) -> None:
        self.selector = selectors.DefaultSelector()
        self.directions: list[Direction] = []
        self.by_fd: dict[int, Direction] = {}
        self.links: dict[str, tuple[Direction, Direction]] = {}
        self.seed = seed
        self.home = os.open("/proc/self/ns/net", os.O_RDONLY)  # our own namespace, to come back to
        self._stdin = b""
        self.done = False

    def add(self, cmd: dict[str, object]) -> dict[str, object]:
        name = str(cmd["link"])
        if name in self.links:
            return {"error": f"link {name} exists"}
        host_fd = open_tun(str(cmd["host_ns"]), str(cmd["host_if"]), self.home)
        try:
            router_fd = open_tun(str(cmd["router_ns"]), str(cmd["router_if"]), self.home)
        except OSError:
            os.close(host_fd)
            raise
        rng = random.Random(f"{self.seed}/{name}")
        up = Direction(f"{name}/up", host_fd, router_fd, Profile(**cmd.get("up") or {}), rng)  # type: ignore[arg-type]
        down = Direction(f"{name}/down", router_fd, host_fd, Profile(**cmd.get("down") or {}), rng)  # type: ignore[arg-type]
        self.links[name] = (up, down)
        for d in (up, down):
            self.directions.append(d)
            self.by_fd[d.src] = d
            self.selector.register(d.src, selectors.EVENT_READ, d)
        return {"ok": name}

    def stats(self) -> dict[str, object]:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return {"stats": {name: {"up": up.snapshot(), "down": down.snapshot()} for name, (up, down) in self.links.items()},
                "cpu_s": usage.ru_utime + usage.ru_stime, "t": time.time()}

    def handle_stdin(self) -> None:
        try:
            chunk = os.read(0, 65536)
        except BlockingIOError:
            return
        if not chunk:
            self.done = True
            return
        self._stdin += chunk
        while b"\n" in self._stdin:
            line, self._stdin = self._stdin.split(b"\n", 1)
            if not line.strip():
                continue
            try:
                cmd = json.loads(line)
                kind = cmd.get("cmd")
                answer = self.add(cmd) if kind == "add" else self.stats() if kind == "stats" else {"error": f"unknown {kind!r}"}
            except (OSError, ValueError, TypeError, KeyError) as exc:
                answer = {"error": f"{type(exc).__name__}: {exc}"}
            sys.stdout.write(json.dumps(answer) + "\n")
            sys.stdout.flush()

    def run(self) -> None:
        os.set_blocking(0, False)
        self.selector.register(0, selectors.EVENT_READ, None)
        while not self.done:
            now = time.monotonic()
            heads = [d.queue[0][0] for d in self.directions if d.queue]
            timeout = max(0.0, min(heads) - now) if heads else None
            for key, _ in self.selector.select(timeout):
                direction = key.data
                if direction is None:
                    self.handle_stdin()
                    continue
                self.read(direction)
            now = time.monotonic()
            for direction in self.directions:
                if direction.queue:
                    direction.flush(now)

    @staticmethod
    def read(direction: Direction) -> None:
        for _ in range(_READ_BURST):
            try:
                packet = os.read(direction.src, _MAX_PACKET)
            except BlockingIOError:
                return
            except OSError:
                return
            now = time.monotonic()
            direction.take(packet, now)
            if direction.queue and direction.queue[-1][0] <= now:
                direction.flush(now)  # nothing to wait for: straight through


def main() -> int:
    seed = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    emulator = Emulator(seed)
    sys.stdout.write(json.dumps({"ready": os.getpid()}) + "\n")
    sys.stdout.flush()
    emulator.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
