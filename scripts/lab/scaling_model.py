"""The per-node cost of the swarm protocol as a function of the swarm's size N (``docs/scaling.md``).

    python scripts/lab/scaling_model.py --check runs/camp_n4.json runs/camp_n8.json runs/camp_n16.json
    python scripts/lab/scaling_model.py --extrapolate
    python scripts/lab/scaling_model.py --measure-costs

``--check`` compares the model with ``scripts/lab/wan_swarm.py --json`` measurements (probes on ``lan``):
bytes a poll brings in, DHT and pull traffic a second, find and store requests, and CPU, predicted from
the measured poll rate (the bytes, requests and CPU of a poll are the model; how often a node polls on a
loaded 2-core machine is its CPU queue, not the protocol). The free parameters (``find_base``,
``cpu_dht_byte``) are fitted on the ``--fit`` run (8 nodes by default) and checked on the others.

``--extrapolate`` prints, for N = 100, 1,000 and 10,000 and the configurations of ``docs/scaling.md``,
what one node moves and spends a second, what the busiest node (a replica of a manifest key, a holder
of NATed nodes' batches) serves, where a 20 Mbit/s node saturates first, and the largest N at which its
step stays within 10% of silo (its network side under ``--cpu-budget`` of the core it trains on).

``--measure-costs`` measures the per-operation CPU on this machine: an idle probe and its p2pd (``c0``),
decoding and verifying a probe batch (``c_pull``) and a manifest (``c_m``).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from dataclasses import dataclass, replace
from typing import Any

MIB = 1024 * 1024


@dataclass(frozen=True)
class Params:
    """Measured per-operation quantities (``docs/scaling.md``, "Parameters")."""

    manifest_entry: float = 330.0  # bytes of one manifest in a key's reply, on the wire (315 serialized + 4%)
    neighbour_entry: float = 63.0  # bytes a find reply spends per neighbour it names (node id + peer id)
    find_base: float = 724.0  # bytes of a find request and reply besides values and neighbours (fitted, N=8)
    keys_per_find: float = 2.0  # hivemind asks about floor(sqrt(keys)) keys per request: 2 of 8
    beam: int = 20  # nodes a lookup visits at most (bucket size)
    replicas: int = 5  # nodes a manifest is stored at
    cpu_base: float = 0.010  # cores a lone idle node uses (its loops, p2pd's keep-alives): --measure-costs
    cpu_dht_byte: float = 0.36e-6  # CPU seconds (node + p2pd) per DHT byte received, serving included (fitted, N=8)
    cpu_pull_byte: float = 0.046e-6  # CPU seconds per byte pulled (decode, verify, hash: --measure-costs; x2 for p2pd)
    cpu_manifest: float = 0.00011  # CPU seconds to decode and verify one new manifest (--measure-costs)


@dataclass(frozen=True)
class Swarm:
    """One configuration of the protocol and the nodes' traffic."""

    nodes: int
    batch_bytes: float = 64 * 1024
    batches_per_epoch: float = 8.0  # publish interval = epoch / 8 (a node that steps faster)
    epoch_seconds: float = 60.0
    read_epochs: int = 2
    shards: int = 4
    read_shards: int = 0  # 0: all
    collect_interval: float = 0.25
    lookup_seconds: float = 0.1  # a poll's network time besides its bytes (round trips)
    downlink: float = math.inf  # bytes/s
    cpu_share: float = 1.0  # cores the node's network side may use
    rtt: float = 0.17  # seconds between two nodes (the mix of continental and intercontinental links)
    flow_rate: float = 1.0e6  # bytes/s one TCP flow carries on such a path (loss-limited)
    transfer_rtts: float = 3.0  # round trips a pull takes besides its bytes
    polls_per_second: float | None = None  # measured instead of modelled


def shards_read(s: Swarm) -> int:
    return s.shards if s.read_shards <= 0 or s.read_shards >= s.shards else s.read_shards


def per_node(s: Swarm, p: Params = Params()) -> dict[str, float]:
    """Steady-state costs of one (public) node a second, and of the busiest ones."""
    n, k = s.nodes, shards_read(s)
    keys = s.read_epochs * k
    b = s.batches_per_epoch
    authors_read = n * k / s.shards  # authors whose shard this node reads (itself included when read)
    # Manifests under the keys read: all of the previous epoch, half of the current one on average.
    entries = authors_read * b * (0.5 + (s.read_epochs - 1))
    copies = min(n, p.replicas) * (n - 1) / n  # replicas other than the reader answer with the values
    visited = min(n - 1, p.beam)
    finds = keys / p.keys_per_find * visited
    neighbours = min(n - 2, p.beam) if n > 2 else 0
    values = copies * entries * p.manifest_entry
    overhead = finds * (p.find_base + p.keys_per_find * neighbours * p.neighbour_entry)
    poll_bytes = values + overhead
    cpu_poll = p.cpu_dht_byte * poll_bytes
    if s.polls_per_second is not None:
        polls = s.polls_per_second
    else:
        period = s.collect_interval + s.lookup_seconds + poll_bytes / s.downlink + cpu_poll / s.cpu_share
        polls = 1.0 / period
    new_manifests = (authors_read - (1 if k == s.shards else k / s.shards)) * b / s.epoch_seconds
    pulls = new_manifests  # every new admissible manifest is pulled
    pull_bytes = pulls * s.batch_bytes
    readers_per_author = (n - 1) * k / s.shards
    serve_bytes = readers_per_author * b * s.batch_bytes / s.epoch_seconds
    # A replica of one key serves its dictionary to every reader of that key at every poll.
    key_entries = entries / keys
    key_readers = (n - 1) * k / s.shards
    replica_bytes = key_readers * polls * key_entries * p.manifest_entry
    quota_batches = n * k / s.shards * b  # batches a node would pull per epoch
    pull_seconds = s.transfer_rtts * s.rtt + s.batch_bytes / s.flow_rate
    return {
        "polls_per_s": polls,
        "poll_bytes": poll_bytes,
        "manifests_read_per_s": copies * entries * polls,
        "manifests_new_per_s": new_manifests,
        "finds_per_s": finds * polls,
        "stores_per_s": b / s.epoch_seconds * (min(n, p.replicas) - min(n, p.replicas) / n),
        "dht_down": poll_bytes * polls,
        "pull_down": pull_bytes,
        "pull_up": serve_bytes,
        "replica_up": replica_bytes,
        "batches_per_epoch": quota_batches,
        "pull_slots_busy": pulls * pull_seconds,  # pulls in flight on average (a node has 8 slots)
        "cpu": p.cpu_base + p.cpu_dht_byte * poll_bytes * polls + p.cpu_pull_byte * pull_bytes
        + p.cpu_manifest * new_manifests,
    }


# -- per-operation CPU -----------------------------------------------------------------------------------

def measure_costs(batch_kib: float, repeats: int) -> None:
    """``c_pull`` and ``c_m`` on this machine: the process CPU of decoding and verifying a probe batch of the
    size ``wan_swarm.py --kind probe`` publishes, and a manifest (the bytes of its signed encoding, too)."""
    import dataclasses
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:0] = [os.path.dirname(os.path.dirname(here)), here]
    from protocol.codec import decode_manifest, encode_batch, encode_manifest, make_manifest
    from protocol.identity import Identity
    from protocol.limits import DEFAULT_LIMITS
    from scripts.lib.netlab.probe_batches import probe_batch
    from swarm.intake import decode_with_digests

    identity = Identity.generate()
    chars = 2048  # as wan_swarm.py sizes a probe's batch
    groups = max(1, round(batch_kib * 1024 / (4 * chars * 0.74)))
    batch = probe_batch(identity, "probe", 1, n_groups=groups, text_chars=chars)
    address = f"/ip4/203.0.113.5/tcp/31337/p2p/{identity.peer_id}"
    batch = dataclasses.replace(batch, address=(address,))
    data = encode_batch(batch, identity)
    manifest = encode_manifest(make_manifest(batch, data, time.time() + 120), identity)

    def cpu(fn: Any, *a: Any) -> float:
        t0 = time.process_time()
        for _ in range(repeats):
            fn(*a)
        return (time.process_time() - t0) / repeats

    pull = cpu(decode_with_digests, data, DEFAULT_LIMITS)
    man = cpu(decode_manifest, manifest)
    print(f"a lone idle probe (swarm_probe.py, no peers) and its p2pd: {100 * idle_cpu(here, 10.0):.2f}% of a core (c0)")
    print(f"a probe batch of {len(data) / 1024:.1f} KiB: decoded, verified and hashed in {1000 * pull:.2f} ms of "
          f"process CPU ({1e6 * pull / len(data):.3f} us a byte; c_pull doubles it for p2pd's decryption)")
    print(f"a signed manifest of {len(manifest)} B: decoded and verified in {1000 * man:.3f} ms (c_m)")


def idle_cpu(here: str, seconds: float) -> float:
    """Cores a lone ``swarm_probe.py`` (no peers, not publishing) and its p2pd use once up."""
    import os
    import subprocess
    import sys

    import psutil

    proc = subprocess.Popen([sys.executable, os.path.join(here, "swarm_probe.py"), "--seconds", str(seconds + 60)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if '"up"' in line:
                break
        root = psutil.Process(proc.pid)

        def cpu() -> float:
            total = 0.0
            for p in [root, *root.children(recursive=True)]:
                try:
                    t = p.cpu_times()
                    total += t.user + t.system
                except psutil.Error:
                    pass
            return total

        c0, t0 = cpu(), time.monotonic()
        time.sleep(seconds)
        return (cpu() - c0) / (time.monotonic() - t0)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- checks against measurements ------------------------------------------------------------------------

def measured(path: str) -> dict[str, Any]:
    """The means over nodes of a ``wan_swarm.py --json`` run (one scenario, probes)."""
    with open(path, encoding="utf-8") as handle:
        data = json.load(handle)
    result = data["results"][0]
    args = data["args"]
    span = result["t1"] - result["t0"]
    rows = result["rows"]

    def mean(key: str) -> float:
        return statistics.mean(float(r[key] or 0) for r in rows)

    pull_in = mean("w_bytes_in") / span
    received = mean("received_bytes_s")
    return {
        "nodes": len(rows), "batch_bytes": mean("batch_bytes"), "polls_per_s": mean("w_polls") / span,
        "epoch_seconds": float(args["epoch_seconds"]), "pull_down": pull_in,
        "dht_down": received - 1.04 * pull_in, "finds_per_s": mean("w_dht_find_requests") / span,
        "stores_per_s": mean("w_dht_store_requests") / span, "cpu": mean("cpu_node") + mean("cpu_p2pd"),
        "load": result["load_during"][0], "path": path,
    }


def predicted_for(m: dict[str, Any], p: Params) -> dict[str, float]:
    s = Swarm(nodes=m["nodes"], batch_bytes=m["batch_bytes"], epoch_seconds=m["epoch_seconds"],
              polls_per_second=m["polls_per_s"])
    return per_node(s, p)


def fit(m: dict[str, Any], p: Params) -> Params:
    """``find_base`` and ``cpu_dht_byte`` from one run; the rest are measured on their own."""
    base = predicted_for(m, replace(p, find_base=0.0))
    finds_per_poll = base["finds_per_s"] / m["polls_per_s"]
    find_base = (m["dht_down"] - base["dht_down"]) / m["polls_per_s"] / finds_per_poll
    p = replace(p, find_base=find_base)
    other = p.cpu_base + p.cpu_pull_byte * m["pull_down"] + p.cpu_manifest * predicted_for(m, p)["manifests_new_per_s"]
    return replace(p, cpu_dht_byte=(m["cpu"] - other) / m["dht_down"])


def check(paths: list[str], fit_nodes: int) -> None:
    runs = [measured(path) for path in paths]
    ref = next((r for r in runs if r["nodes"] == fit_nodes), runs[0])
    p = fit(ref, Params())
    print(f"fitted on N={ref['nodes']}: find_base {p.find_base:.0f} B, cpu_dht_byte {p.cpu_dht_byte * 1e6:.2f} us/B")
    print("  N  quantity             measured    model    error")
    for r in runs:
        pred = predicted_for(r, p)
        for key, unit, scale in (("dht_down", "KiB/s", 1 / 1024), ("pull_down", "KiB/s", 1 / 1024),
                                 ("finds_per_s", "/s", 1.0), ("stores_per_s", "/s", 1.0), ("cpu", "cores", 1.0)):
            err = pred[key] / r[key] - 1 if r[key] else float("nan")
            print(f"{r['nodes']:3d}  {key:16s} {r[key] * scale:10.3f} {pred[key] * scale:9.3f}  {100 * err:+6.1f}%"
                  f"  {unit}{'  (fit)' if r is ref else ''}")
        print(f"     (polls {r['polls_per_s']:.2f}/s measured, load average {r['load']:.1f})")


# -- extrapolation --------------------------------------------------------------------------------------

CONFIGS = {
    "default (4 shards, all read, poll 0.25 s)": dict(shards=4, read_shards=0, collect_interval=0.25),
    "public (4 shards, all read, poll 2 s)": dict(shards=4, read_shards=0, collect_interval=2.0),
    "sharded (N/25 shards, 2 read, poll 2 s)": dict(read_shards=2, collect_interval=2.0),
    "sharded (N/25 shards, 1 read, poll 2 s)": dict(read_shards=1, collect_interval=2.0),
}


def extrapolate(batch_kib: float, uplink_mbit: float, cpu_budget: float) -> None:
    uplink = uplink_mbit * 1e6 / 8
    print(f"batches of {batch_kib:.0f} KiB every 7.5 s, 60 s epochs; a node with a {uplink_mbit:.0f} Mbit/s uplink "
          f"(downlink 4x) training on one core: its step stays within 10% of silo while its network side needs at "
          f"most {100 * cpu_budget:.0f}% of that core (the links, pull slots and quota bound what it exchanges, "
          f"not its step)")
    for name, cfg in CONFIGS.items():
        print(f"== {name}")
        print("      N  polls/s  DHT down  pulls down  serving up  key replica up  batches/epoch  slots  cpu")
        for n in (4, 16, 100, 1000, 10000):
            c = dict(cfg)
            if "shards" not in c:
                c["shards"] = max(4, round(n / 25))
            s = Swarm(nodes=n, batch_bytes=batch_kib * 1024, downlink=uplink * 4, lookup_seconds=0.5, **c)
            r = per_node(s)
            print(f"{n:7d}  {r['polls_per_s']:7.2f}  {r['dht_down'] / MIB:6.2f} MiB  {r['pull_down'] / MIB:6.2f} MiB"
                  f"  {r['pull_up'] / MIB:6.2f} MiB  {r['replica_up'] / MIB:8.2f} MiB  {r['batches_per_epoch']:10.0f}"
                  f"  {r['pull_slots_busy']:5.1f}  {100 * r['cpu']:5.1f}%")
        limits = saturation(cfg, batch_kib, uplink, cpu_budget)
        print("   first limits: " + ", ".join(label if n is None else f"{label} at N={n}" for label, n in limits))
        print(f"   largest N: the step within 10% of silo (CPU) {largest(limits, cpu=True)}; every link, pull slot "
              f"and the quota unsaturated {largest(limits, cpu=False)}")


def largest(limits: list[tuple[str, int | None]], *, cpu: bool) -> str:
    """The largest N below the first CPU limit (``cpu``) or below the first other limit."""
    first = min((n for label, n in limits if n is not None and label.startswith("CPU") == cpu), default=None)
    return "every N up to 100,000" if first is None else f"N={first - 1}"


def saturation(cfg: dict[str, Any], batch_kib: float, uplink: float, cpu_budget: float) -> list[tuple[str, int | None]]:
    """The smallest N at which each resource of a node runs out (searched on a grid; None: not below 100,000)."""
    limits = {"uplink serving pulls": lambda r: r["pull_up"] > uplink,
              "uplink of a key replica": lambda r: r["replica_up"] > uplink,
              "downlink (DHT + pulls)": lambda r: r["dht_down"] + r["pull_down"] > 4 * uplink,
              f"CPU {100 * cpu_budget:.0f}% of a core": lambda r: r["cpu"] > cpu_budget,
              "global quota (1,024 batches/epoch)": lambda r: r["batches_per_epoch"] > 1024,
              "pull slots (8 at once)": lambda r: r["pull_slots_busy"] > 8}
    out: list[tuple[str, int | None]] = []
    for label, hit in limits.items():
        for n in sorted({int(x) for x in (1.1 ** i for i in range(200)) if 3 <= x <= 100000}):
            c = dict(cfg)
            if "shards" not in c:
                c["shards"] = max(4, round(n / 25))
            s = Swarm(nodes=n, batch_bytes=batch_kib * 1024, downlink=uplink * 4, lookup_seconds=0.5, **c)
            if hit(per_node(s)):
                out.append((label, n))
                break
        else:
            out.append((f"{label}: not below 100,000", None))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", nargs="*", default=None, metavar="JSON")
    parser.add_argument("--fit", type=int, default=8, help="the run (its N) the free parameters are fitted on")
    parser.add_argument("--extrapolate", action="store_true")
    parser.add_argument("--batch-kib", type=float, default=64.0)
    parser.add_argument("--uplink-mbit", type=float, default=20.0)
    parser.add_argument("--cpu-budget", type=float, default=0.10)
    parser.add_argument("--measure-costs", action="store_true",
                        help="time decoding a --batch-kib probe batch and a manifest on this machine")
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    if args.measure_costs:
        measure_costs(args.batch_kib, args.repeats)
    if args.check:
        check(args.check, args.fit)
    if args.extrapolate:
        extrapolate(args.batch_kib, args.uplink_mbit, args.cpu_budget)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
