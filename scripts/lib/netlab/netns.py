"""A tiny network lab in Linux network namespaces: hosts on a simulated internet, NAT, partitions.

Used by the NAT and partition tests and by ``scripts/bench/bench_nat.py``. Needs root, ``ip`` (iproute2) and
``nft`` (nftables); ``scripts/dev/ci_deps.sh`` installs them. Every name carries a random tag, so runs never
collide, and ``close()`` removes every namespace (and with it every interface) it made, after killing
whatever still runs inside, even when a test failed half-way.

Topology: one router namespace ``<tag>-r``; every host is its own namespace joined to the router by a
veth pair on its own /30, with the router as default gateway.

* a *public* host gets ``203.0.113.(4i+2)`` (TEST-NET-3): everyone can dial it;
* a *NATed* host gets ``192.0.2.(4j+2)`` (TEST-NET-1) and sits behind the router's masquerade: it can dial
  out, nobody can dial in (new connections towards 192.0.2.0/24 are dropped), like a home machine.

``partition(a, b)`` drops all forwarded packets between two groups of hosts (established connections
included) until ``heal()``. Only documentation address ranges are used, and nothing leaves the namespaces.

Wide-area links: ``add_host(link=PROFILES["intercontinental"])`` joins the host to the router through the
user-space link emulator (``scripts/lab/linkem.py``, one process per lab, started with the first such host)
instead of a veth pair: two TUN devices, with the profile's delay, jitter, loss and rate applied to what
the host sends (as ``tc netem`` on the host's interface would; the kernel here has no netem). So the
round trip between two emulated hosts is the sum of their delays. A profile with ``nat`` puts the host
behind the router's NAT. ``link_stats()`` reads the emulator's counters.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field

__all__ = ["PROFILES", "Host", "LinkProfile", "NetLab", "netns_unavailable_reason"]

_PUBLIC_NET = "203.0.113"
_NAT_NET = "192.0.2"


def _run(*args: str, stdin: str | None = None) -> str:
    proc = subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def netns_unavailable_reason() -> str | None:
    """None if namespaces, veth and nftables NAT can be set up here, else why not (for a skip)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool, package in (("ip", "iproute2"), ("nft", "nftables")):
        if shutil.which(tool) is None:
            return f"`{tool}` not found (install {package}: scripts/dev/ci_deps.sh)"
    lab = NetLab()
    try:
        lab.add_host(nat=True)
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        return f"cannot create network namespaces with NAT here: {exc}"
    finally:
        lab.close()
    return None


@dataclass(frozen=True)
class LinkProfile:
    """A host's access link, applied to every packet the host sends (``netem``-like, see linkem.py)."""

    name: str
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss: float = 0.0
    rate_mbit: float | None = None
    nat: bool = False
    """The host sits behind the lab router's NAT (client mode: nobody can dial it)."""

    def emulated(self) -> dict[str, object]:
        """The emulator's profile for the host's sending direction."""
        fields = asdict(self)
        return {k: fields[k] for k in ("delay_ms", "jitter_ms", "loss", "rate_mbit")}


PROFILES = {
    # Through the emulator with nothing added: what the emulator itself costs against a plain veth.
    "lan": LinkProfile("lan"),
    "continental": LinkProfile("continental", delay_ms=40, jitter_ms=10, loss=0.005, rate_mbit=50),
    "intercontinental": LinkProfile("intercontinental", delay_ms=150, jitter_ms=40, loss=0.01, rate_mbit=20),
    "bad-home": LinkProfile("bad-home", delay_ms=250, jitter_ms=80, loss=0.03, rate_mbit=5, nat=True),
}
"""The wide-area profiles of ``scripts/lab/wan_swarm.py`` (issue: lan, continental, intercontinental, bad-home)."""

LINKEM = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "lab", "linkem.py")


@dataclass(eq=False)
class Host:
    """One namespace with one address."""

    name: str
    netns: str
    ip: str
    nat: bool
    procs: list[subprocess.Popen[str]] = field(default_factory=list)
    link: LinkProfile | None = None
    """The emulated access link, or None for a plain veth (no delay)."""

    def command(self, *args: str) -> list[str]:
        """``args`` run inside this host's namespace."""
        return ["ip", "netns", "exec", self.netns, *args]

    def popen(self, args: list[str], **kwargs: object) -> subprocess.Popen[str]:
        """Start a process in this host (killed by ``NetLab.close`` if still running)."""
        proc: subprocess.Popen[str] = subprocess.Popen(self.command(*args), text=True, **kwargs)  # type: ignore[call-overload]
        self.procs.append(proc)
        return proc


class NetLab:
    """Namespaces made by one test run; use as a context manager or call ``close()``."""

    def __init__(self, tag: str | None = None) -> None:
        self.tag = tag or "sn" + secrets.token_hex(3)
        self.router = f"{self.tag}-r"
        self.hosts: list[Host] = []
        self._made: list[str] = []
        self._n_public = 0
        self._n_nat = 0
        self._links: dict[str, str] = {}  # host name -> router-side interface
        self._emulator: subprocess.Popen[str] | None = None
        self._emulator_lock = threading.Lock()
        _run("ip", "netns", "add", self.router)
        self._made.append(self.router)
        self._in_router("ip", "link", "set", "lo", "up")
        self._in_router("sysctl", "-qw", "net.ipv4.ip_forward=1")
        self._nft(
            f"""
            table ip lab {{
              set part_a {{ type ipv4_addr; }}
              set part_b {{ type ipv4_addr; }}
              chain forward {{
                type filter hook forward priority 0; policy accept;
                ip saddr @part_a ip daddr @part_b drop
                ip saddr @part_b ip daddr @part_a drop
                ct state established,related accept
                ip daddr {_NAT_NET}.0/24 drop
              }}
              chain postrouting {{
                type nat hook postrouting priority 100; policy accept;
                ip saddr {_NAT_NET}.0/24 masquerade
              }}
            }}
            """
        )

    def __enter__(self) -> NetLab:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _in_router(self, *args: str) -> str:
        return _run("ip", "netns", "exec", self.router, *args)

    def _nft(self, script: str) -> None:
        _run("ip", "netns", "exec", self.router, "nft", "-f", "-", stdin=script)

    def add_host(self, *, nat: bool = False, name: str | None = None, link: LinkProfile | None = None) -> Host:
        """A new host namespace, public or behind the NAT, linked to the router: by a veth pair, or with
        ``link`` through the link emulator (behind the NAT too if the profile says so)."""
        nat = nat or (link is not None and link.nat)
        if nat:
            index, net = self._n_nat, _NAT_NET
            self._n_nat += 1
        else:
            index, net = self._n_public, _PUBLIC_NET
            self._n_public += 1
        if index >= 63:
            raise RuntimeError("at most 63 hosts of each kind")
        label = name or (f"n{index}" if nat else f"p{index}")
        netns = f"{self.tag}-{label}"
        router_if = f"{self.tag}{label}"[:15]
        gateway, ip = f"{net}.{4 * index + 1}", f"{net}.{4 * index + 2}"
        _run("ip", "netns", "add", netns)
        self._made.append(netns)
        if link is None:
            _run("ip", "link", "add", router_if, "netns", self.router, "type", "veth", "peer", "eth0", "netns", netns)
        else:
            self._emulate(label, netns, router_if, link)
            # A TUN link carries no link-local IPv6 chatter (router solicitations) through the emulator.
            self._in_router("sysctl", "-qw", f"net.ipv6.conf.{router_if}.disable_ipv6=1")
            _run("ip", "netns", "exec", netns, "sysctl", "-qw", "net.ipv6.conf.eth0.disable_ipv6=1")
        self._in_router("ip", "addr", "add", f"{gateway}/30", "dev", router_if)
        self._in_router("ip", "link", "set", router_if, "up")
        host = Host(name=label, netns=netns, ip=ip, nat=nat, link=link)
        for args in (
            ("ip", "link", "set", "lo", "up"),
            ("ip", "addr", "add", f"{ip}/30", "dev", "eth0"),
            ("ip", "link", "set", "eth0", "up"),
            ("ip", "route", "add", "default", "via", gateway),
        ):
            _run(*host.command(*args))
        self.hosts.append(host)
        self._links[label] = router_if
        return host

    def _emulator_call(self, request: dict[str, object]) -> dict[str, object]:
        """One request to the link emulator (started on first use) and its answer."""
        with self._emulator_lock:
            if self._emulator is None:
                self._emulator = subprocess.Popen([sys.executable, LINKEM, str(secrets.randbits(32))], text=True,
                                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE)
                self._emulator_answer()  # {"ready": pid}
            assert self._emulator.stdin is not None
            self._emulator.stdin.write(json.dumps(request) + "\n")
            self._emulator.stdin.flush()
            answer = self._emulator_answer()
        if "error" in answer:
            raise RuntimeError(f"link emulator: {answer['error']}")
        return answer

    def _emulator_answer(self) -> dict[str, object]:
        assert self._emulator is not None and self._emulator.stdout is not None
        line = self._emulator.stdout.readline()
        if not line:
            raise RuntimeError(f"link emulator exited ({self._emulator.poll()})")
        answer: dict[str, object] = json.loads(line)
        return answer

    def _emulate(self, label: str, netns: str, router_if: str, link: LinkProfile) -> None:
        self._emulator_call({"cmd": "add", "link": label, "host_ns": netns, "host_if": "eth0",
                             "router_ns": self.router, "router_if": router_if, "up": link.emulated(), "down": {}})

    def link_stats(self) -> dict[str, object]:
        """The emulator's counters per link and direction (``up``: what the host sent), its CPU seconds and
        the time; empty when no host is emulated."""
        if self._emulator is None:
            return {}
        return self._emulator_call({"cmd": "stats"})

    def partition(self, group_a: list[Host], group_b: list[Host]) -> None:
        """Drop every packet between the two groups (both ways) until ``heal()``."""
        for set_name, group in (("part_a", group_a), ("part_b", group_b)):
            addrs = ", ".join(h.ip for h in group)
            self._nft(f"add element ip lab {set_name} {{ {addrs} }}")

    def heal(self) -> None:
        """Undo every ``partition``."""
        self._nft("flush set ip lab part_a\nflush set ip lab part_b")

    def processes_inside(self) -> list[int]:
        """Pids of processes still running in any namespace of this lab."""
        pids: list[int] = []
        for netns in self._made:
            with contextlib.suppress(RuntimeError, subprocess.SubprocessError):
                pids += [int(p) for p in _run("ip", "netns", "pids", netns).split()]
        return pids

    def close(self) -> None:
        """Kill what runs inside, then delete every namespace (their interfaces go with them)."""
        for host in self.hosts:
            for proc in host.procs:
                if proc.poll() is None:
                    proc.kill()
        for pid in self.processes_inside():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while self.processes_inside() and time.monotonic() < deadline:
            time.sleep(0.1)
        for host in self.hosts:
            for proc in host.procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=5)
        if self._emulator is not None:  # its TUN devices go with it
            self._emulator.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._emulator.wait(timeout=5)
            self._emulator = None
        for netns in reversed(self._made):
            with contextlib.suppress(RuntimeError, subprocess.SubprocessError):
                _run("ip", "netns", "del", netns)
        self._made.clear()


def lab_namespaces(tag: str) -> list[str]:
    """Namespaces whose name starts with ``tag`` (to check that a lab left nothing behind)."""
    out = _run("ip", "netns", "list")
    return [line.split()[0] for line in out.splitlines() if line.startswith(tag)]


PROBE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "lab", "swarm_probe.py")


class Probe:
    """A ``scripts/lab/swarm_probe.py`` process (in a lab host, or on this machine when ``host`` is None);
    its JSON events are collected by a reader thread into ``events``."""

    def __init__(
        self,
        python: str,
        settings: dict[str, object],
        *,
        seconds: float,
        host: Host | None = None,
        publish_every: float = 0.0,
        publish_after: float = 0.0,
        publish_count: int | None = None,
        stats_every: float = 5.0,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        import json
        import threading

        args = [python, PROBE, "--seconds", str(seconds), "--publish-every", str(publish_every),
                "--publish-after", str(publish_after), "--stats-every", str(stats_every)]
        if publish_count is not None:
            args += ["--publish-count", str(publish_count)]
        args += list(extra_args)
        for key, value in settings.items():
            args += ["--set", f"{key}={json.dumps(value)}"]
        kwargs: dict[str, object] = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": subprocess.DEVNULL}
        self.host = host
        self.proc: subprocess.Popen[str] = (
            host.popen(args, **kwargs) if host is not None else subprocess.Popen(args, text=True, **kwargs)  # type: ignore[call-overload]
        )
        self.events: list[dict[str, object]] = []
        self._up = threading.Event()
        self._lock = threading.Lock()

        def read() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                with self._lock:
                    self.events.append(event)
                if event.get("ev") == "up":
                    self._up.set()

        self._reader = threading.Thread(target=read, daemon=True)
        self._reader.start()

    def wait_up(self, timeout: float) -> dict[str, object]:
        if not self._up.wait(timeout):
            raise RuntimeError(f"probe did not come up in {timeout:.0f} s (exit code {self.proc.poll()})")
        return self.of("up")[0]

    def of(self, kind: str) -> list[dict[str, object]]:
        with self._lock:
            return [e for e in self.events if e.get("ev") == kind]

    @property
    def peer(self) -> str:
        return str(self.wait_up(0)["peer"])

    def maddr(self, ip: str | None = None) -> str:
        """This probe's latest address (containing ``ip`` if given) for others' ``initial_peers``."""
        up = self.of("up") + self.of("maddrs")
        maddrs = [str(m) for m in up[-1]["maddrs"]]  # type: ignore[attr-defined]
        for maddr in maddrs:
            if ip is None or f"/{ip}/" in maddr:
                return maddr
        raise RuntimeError(f"no address with {ip} in {maddrs}")

    def send(self, line: str) -> None:
        """A command on the probe's stdin (``go``, ``stop``)."""
        with contextlib.suppress(OSError, ValueError):
            assert self.proc.stdin is not None
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()

    def stop(self, timeout: float = 30.0) -> int:
        """Ask it to stop (stdin), then wait; kill it if it does not exit in ``timeout``."""
        if self.proc.poll() is None:
            self.send("stop")
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(timeout=10)
        self._reader.join(timeout=5)
        return code


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def delivery(probes: list[Probe]) -> tuple[list[float], int]:
    """Publish-to-visible latencies of every (batch, receiver) pair that arrived, and how many pairs
    were expected (each probe's published batches times the other probes)."""
    sent: dict[tuple[str, int], float] = {}
    for probe in probes:
        for event in probe.of("pub"):
            sent[(probe.peer, int(event["n"]))] = float(event["t"])  # type: ignore[call-overload,arg-type]
    latencies = []
    for receiver in probes:
        for event in receiver.of("got"):
            key = (str(event["from"]), int(event["n"]))  # type: ignore[call-overload]
            if key in sent:
                latencies.append(float(event["t"]) - sent[key])  # type: ignore[arg-type]
    return latencies, len(sent) * (len(probes) - 1)


_SERVER = """
import socket, sys
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((sys.argv[1], int(sys.argv[2]))); srv.listen(4); print("ready", flush=True)
while True:
    conn, _ = srv.accept(); conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    mode = conn.recv(1)
    if mode == b"r":
        size = int(conn.recv(32).decode()); block = b"z" * 65536; sent = 0
        while sent < size:
            conn.sendall(block[: size - sent]); sent += min(len(block), size - sent)
        conn.close(); continue
    while True:
        data = conn.recv(65536)
        if not data:
            break
        if mode == b"e":
            conn.sendall(data)
    if mode == b"s":
        pass
    conn.close()
"""

_CLIENT = """
import json, socket, sys, time
host, port, mode, n, size = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
t0 = time.monotonic()
conn = socket.create_connection((host, port), timeout=60); conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
connect = time.monotonic() - t0
out = {"connect_s": connect}
if mode == "e":
    conn.sendall(b"e"); rtts = []
    for _ in range(n):
        t = time.monotonic(); conn.sendall(b"x" * size); got = 0
        while got < size:
            got += len(conn.recv(65536))
        rtts.append(time.monotonic() - t)
        time.sleep(0.05)
    out["rtts"] = rtts
elif mode == "r":
    conn.sendall(b"r" + str(size).encode()); t = time.monotonic(); got = 0
    while got < size:
        chunk = conn.recv(65536)
        if not chunk:
            break
        got += len(chunk)
    out["seconds"] = time.monotonic() - t; out["bytes"] = got
else:
    conn.sendall(b"s"); block = b"y" * 65536; t = time.monotonic(); sent = 0
    while sent < size:
        conn.sendall(block); sent += len(block)
    conn.shutdown(socket.SHUT_WR); conn.recv(1)
    out["seconds"] = time.monotonic() - t; out["bytes"] = sent
print(json.dumps(out))
"""


def tcp_check(src: Host, dst: Host, *, mode: str, n: int = 20, size: int = 64, port: int = 40001,
              timeout: float = 300) -> dict[str, object]:
    """A TCP exchange from ``src`` to ``dst`` over the lab: ``mode="e"``: ``n`` ping-pongs of ``size`` bytes
    (round-trip times in ``rtts``); ``mode="s"``: ``size`` bytes sent one way (``seconds``, ``bytes``);
    ``mode="r"``: ``size`` bytes sent back by ``dst`` (a NATed ``src`` can only receive this way)."""
    server = dst.popen([sys.executable, "-c", _SERVER, dst.ip, str(port)], stdout=subprocess.PIPE)
    try:
        assert server.stdout is not None
        server.stdout.readline()
        proc = subprocess.run(src.command(sys.executable, "-c", _CLIENT, dst.ip, str(port), mode, str(n), str(size)),
                              capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"tcp check {src.name} -> {dst.name} failed: {proc.stderr.strip()[-500:]}")
        result: dict[str, object] = json.loads(proc.stdout)
        return result
    finally:
        server.kill()
        server.wait(timeout=10)
