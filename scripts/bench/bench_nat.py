"""Measure how nodes behind NAT share: hand-off vs circuit relay vs nothing, in real network namespaces.

    sudo .venv/bin/python scripts/bench/bench_nat.py --modes handoff,relay,direct

For each mode, a fresh lab (``scripts/lib/netlab/netns.py``): ``--public`` public hosts (the first is the
bootstrap peer every node is given) and ``--nat`` hosts behind a masquerading router, each running
``scripts/lab/swarm_probe.py`` (a real ``SwarmTransport`` with its own p2pd; NATed ones in ``client_mode``
with ``nat_sharing=<mode>``). After ``--warmup`` seconds every node publishes a small batch every
``--publish-every`` seconds; the run ends ``--grace`` seconds after the last publish. Per pair kind
(author -> receiver: NAT->public, NAT->NAT, public->NAT, public->public) it prints the success rate
(batches received / batches published x receivers) and the publish-to-visible latency p50 / p99.
All figures of one invocation come from the same machine, side by side; give `uptime` with them.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict

from scripts.lib.netlab.netns import NetLab, Probe, netns_unavailable_reason  # noqa: E402

PORT = 31337


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def base_settings(args: argparse.Namespace) -> dict[str, object]:
    return {
        "swarm_id": "bench-nat",
        "epoch_seconds": args.epoch_seconds,
        "request_timeout": 5.0,
        "collect_interval": 0.25,
        "join_retry_seconds": 0.5,
        "join_retry_max_seconds": 4.0,
    }


def run_mode(mode: str, args: argparse.Namespace, python: str) -> dict[str, dict[str, float]]:
    publish_count = int((args.seconds - args.warmup - args.grace) / args.publish_every)
    with NetLab() as lab:
        public = [lab.add_host() for _ in range(args.public)]
        natted = [lab.add_host(nat=True) for _ in range(args.nat)]
        common = dict(publish_every=args.publish_every, publish_after=args.warmup, publish_count=publish_count)
        boot = Probe(python, {**base_settings(args), "host_maddrs": [f"/ip4/{public[0].ip}/tcp/{PORT}"]},
                     seconds=args.seconds + 30, host=public[0], **common)
        boot.wait_up(60)
        initial = [boot.maddr(public[0].ip)]
        probes = {boot: "public"}
        for host in public[1:]:
            settings = {**base_settings(args), "host_maddrs": [f"/ip4/{host.ip}/tcp/{PORT}"], "initial_peers": initial}
            probes[Probe(python, settings, seconds=args.seconds + 30, host=host, **common)] = "public"
        for host in natted:
            settings = {**base_settings(args), "host_maddrs": [f"/ip4/{host.ip}/tcp/{PORT}"], "initial_peers": initial,
                        "client_mode": True, "nat_sharing": mode}
            probes[Probe(python, settings, seconds=args.seconds + 30, host=host, **common)] = "nat"
        for probe in probes:
            probe.wait_up(90)
        time.sleep(args.seconds)
        for probe in probes:
            probe.stop()
        if args.verbose:
            verbose(probes)
        natted_pubs = sum(len(p.of("pub")) for p, kind in probes.items() if kind == "nat")
        skipped = sum(int(p.of("stats")[-1]["stats"]["publish_skipped"]) for p, kind in probes.items()
                      if kind == "nat" and p.of("stats"))  # type: ignore[call-overload,index]
        print(f"{mode:8s} NATed nodes published {natted_pubs} batches; {skipped} publishes skipped "
              "(no address to announce yet)", flush=True)
        return summarize(probes)


def verbose(probes: dict[Probe, str]) -> None:
    """Each node's counters, and which of each author's batches each receiver missed."""
    for probe, kind in probes.items():
        stats = probe.of("stats")
        last = stats[-1]["stats"] if stats else {}
        keep = ("batches_published", "publish_failed", "batches_accepted", "batches_rejected", "handoffs_sent",
                "handoff_failed", "handoffs_held", "handoffs_refused", "peers_connected", "network_up")
        print(f"  {kind:6s} {probe.peer[:8]} pubs {len(probe.of('pub'))} got {len(probe.of('got'))} "
              f"{ {k: last.get(k) for k in keep} }", flush=True)
    for receiver in probes:
        got = {(str(e["from"]), int(e["n"])) for e in receiver.of("got")}  # type: ignore[call-overload]
        for author in probes:
            if author is receiver:
                continue
            missed = [int(e["n"]) for e in author.of("pub") if (author.peer, int(e["n"])) not in got]  # type: ignore[call-overload]
            if missed:
                print(f"  {receiver.peer[:8]} missed {author.peer[:8]}'s {missed}", flush=True)


def summarize(probes: dict[Probe, str]) -> dict[str, dict[str, float]]:
    kind_of = {p.peer: k for p, k in probes.items()}
    sent: dict[tuple[str, int], float] = {}
    for probe in probes:
        for event in probe.of("pub"):
            sent[(probe.peer, int(event["n"]))] = float(event["t"])  # type: ignore[arg-type]
    latencies: dict[str, list[float]] = defaultdict(list)
    expected: dict[str, int] = defaultdict(int)
    for receiver, rkind in probes.items():
        for (author, _), _t in sent.items():
            if author != receiver.peer:
                expected[f"{kind_of[author]}->{rkind}"] += 1
        for event in receiver.of("got"):
            key = (str(event["from"]), int(event["n"]))  # type: ignore[arg-type]
            if key in sent:
                latencies[f"{kind_of[key[0]]}->{rkind}"].append(float(event["t"]) - sent[key])  # type: ignore[arg-type]
    out = {}
    for pair, n in sorted(expected.items()):
        lat = latencies.get(pair, [])
        out[pair] = {
            "expected": n,
            "received": len(lat),
            "success": len(lat) / n if n else 0.0,
            "p50": percentile(lat, 50) if lat else float("nan"),
            "p99": percentile(lat, 99) if lat else float("nan"),
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", default="handoff,relay,direct")
    parser.add_argument("--public", type=int, default=3)
    parser.add_argument("--nat", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=60.0, help="run length after all nodes are up")
    parser.add_argument("--warmup", type=float, default=15.0)
    parser.add_argument("--grace", type=float, default=15.0)
    parser.add_argument("--publish-every", type=float, default=2.0)
    parser.add_argument("--epoch-seconds", type=float, default=30.0)
    parser.add_argument("--verbose", action="store_true", help="print every node's final counters")
    args = parser.parse_args()
    reason = netns_unavailable_reason()
    if reason:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 1
    print(f"load average before: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}; "
          f"{os.cpu_count()} CPUs; {args.public} public + {args.nat} NATed nodes, one batch per node every "
          f"{args.publish_every} s for {args.seconds - args.warmup - args.grace:.0f} s")
    for mode in args.modes.split(","):
        results = run_mode(mode, args, sys.executable)
        for pair, r in results.items():
            print(f"{mode:8s} {pair:15s} received {r['received']:4.0f}/{r['expected']:4.0f} "
                  f"({100 * r['success']:5.1f}%)  p50 {r['p50'] * 1000:6.0f} ms  p99 {r['p99'] * 1000:6.0f} ms",
                  flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
