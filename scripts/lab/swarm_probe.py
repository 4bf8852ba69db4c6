"""One swarm transport in its own process, for multi-process tests and benchmarks (no model, no torch: hivemind
is loaded without it, ``swarm.hivemind_lean``).

    python scripts/lab/swarm_probe.py --seconds 60 --publish-every 2 --set initial_peers='["/ip4/.../p2p/..."]'

It starts a ``SwarmTransport`` with the given settings, publishes a small valid batch every
``--publish-every`` seconds (numbered 0, 1, ...), polls ``collect()`` every 20 ms, and writes one JSON
line per event to stdout, with wall-clock times (the same clock for every process on one machine):

    {"ev": "up", "peer": <swarm peer id>, "maddrs": [...], "t": ...}
    {"ev": "maddrs", "maddrs": [...], "t": ...}          when the visible addresses change
    {"ev": "pub", "n": 3, "t": ...}                      batch 3 handed to publish()
    {"ev": "got", "from": <peer>, "n": 3, "t": ...}      a peer's batch 3 came out of collect()
    {"ev": "stats", "stats": {...}, "rss": ..., "p2pd_rss": ..., "t": ...}   every --stats-every s and at exit

It stops after ``--seconds`` (a bound, always), on SIGTERM or SIGINT, or when stdin says ``stop``. With
``--wait-go`` it publishes only once stdin says ``go`` (so many probes can start publishing together).
``--groups`` and ``--text-chars`` size the batches (random letters: they do not compress away).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from typing import Any

import psutil  # noqa: E402

from protocol.identity import Identity, peer_id_from_public_key  # noqa: E402
from swarm import hivemind_lean  # noqa: E402

hivemind_lean.load()  # the transport without torch: a probe is a few tens of megabytes, not hundreds

from scripts.lib.netlab.probe_batches import TAG_STRIDE, probe_batch  # noqa: E402
from swarm.settings import SwarmSettings  # noqa: E402
from swarm.transport import SwarmTransport  # noqa: E402


def emit(event: dict[str, Any]) -> None:
    event["t"] = time.time()
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def _rss(pid: int | None) -> int:
    if pid is None:
        return 0
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.Error:
        return 0


def parse_args() -> tuple[argparse.Namespace, SwarmSettings]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, required=True, help="hard bound on the run")
    parser.add_argument("--publish-every", type=float, default=0.0, help="0: never publish")
    parser.add_argument("--publish-count", type=int, default=10**9, help="stop publishing after this many")
    parser.add_argument("--publish-after", type=float, default=0.0, help="seconds before the first publish")
    parser.add_argument("--stats-every", type=float, default=5.0)
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--text-chars", type=int, default=64)
    parser.add_argument("--wait-go", action="store_true", help="publish only after 'go' on stdin")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=JSON", help="a SwarmSettings field")
    args = parser.parse_args()
    values: dict[str, Any] = {}
    for item in args.set:
        key, _, raw = item.partition("=")
        try:
            values[key] = json.loads(raw)
        except json.JSONDecodeError:
            values[key] = raw
    return args, SwarmSettings.model_validate(values)


def control(wait_go: bool) -> tuple[threading.Event, threading.Event]:
    """``(stop, go)``: set by signals and by ``stop`` / ``go`` lines on stdin."""
    stop, go = threading.Event(), threading.Event()
    if not wait_go:
        go.set()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    def watch_stdin() -> None:
        for line in sys.stdin:
            if line.strip() == "go":
                go.set()
            if line.strip() == "stop":
                break
        stop.set()

    if not sys.stdin.isatty():
        threading.Thread(target=watch_stdin, daemon=True).start()
    return stop, go


def main() -> int:
    args, settings = parse_args()
    identity = Identity.generate()
    transport = SwarmTransport(settings, identity)
    stop, go = control(args.wait_go)
    transport.start(wait=True)
    try:
        run(args, transport, stop, go)
    finally:
        transport.close()
    return 0


def run(args: argparse.Namespace, transport: SwarmTransport, stop: threading.Event, go: threading.Event) -> None:
    maddrs = transport.visible_multiaddrs()
    emit({"ev": "up", "peer": transport.identity.peer_id, "maddrs": maddrs})
    deadline = time.monotonic() + args.seconds
    next_pub = float("inf")
    next_stats = time.monotonic() + args.stats_every
    published = 0
    while not stop.is_set() and time.monotonic() < deadline:
        now = time.monotonic()
        if next_pub == float("inf") and go.is_set() and args.publish_every:
            next_pub = now + args.publish_after
        if now >= next_pub and published < args.publish_count:
            batch = probe_batch(transport.identity, transport.settings.swarm_id, published, n_groups=args.groups,
                                text_chars=args.text_chars)
            if transport.publish(batch) is not None:
                emit({"ev": "pub", "n": published})
                published += 1
            next_pub = now + args.publish_every
        for batch in transport.collect():
            n = batch.groups[0].task.index // TAG_STRIDE
            emit({"ev": "got", "from": peer_id_from_public_key(batch.author), "n": n})
        if transport.visible_multiaddrs() != maddrs:
            maddrs = transport.visible_multiaddrs()
            emit({"ev": "maddrs", "maddrs": maddrs})
        if now >= next_stats:
            next_stats = now + args.stats_every
            emit_stats(transport)
        stop.wait(0.02)
    emit_stats(transport)


def emit_stats(transport: SwarmTransport) -> None:
    emit(
        {
            "ev": "stats",
            "stats": transport.stats(),
            "rss": _rss(os.getpid()),
            "p2pd_rss": _rss(transport.p2pd_pid()),
        }
    )


if __name__ == "__main__":
    sys.exit(main())
