"""A discrete-event simulation of the swarm's manifest and pull protocol, at sizes the machine cannot run.

    python scripts/lab/sim_swarm.py --nodes 1000 --mix continental:0.5,intercontinental:0.3,bad-home:0.2
    python scripts/lab/sim_swarm.py --nodes 8 --mix lan:1 --collect-interval 0.25 --cpu-share 0.14   # as a lab run

What it simulates, per node (``docs/scaling.md`` gives the model and where every cost comes from):

* publishing: every ``--publish-seconds`` (an eighth of an epoch, as a fast node) a batch of
  ``--batch-kib``; a node behind NAT first hands it to two of the ``--holders`` bootstrap nodes, in
  parallel, then stores its manifest (``store_rtts`` round trips) under the key of its epoch and shard;
* polling: each reader reads the keys of the current and previous epoch, of every shard or of
  ``--read-shards`` drawn per epoch; each key's dictionary of manifests comes back from each of its
  ``replicas`` (5, hivemind's ``num_replicas``) through that replica's uplink, which it shares with
  everything else the replica sends (a hot key queues there); the poll ends when every reply is in
  and the reader's CPU has processed them, and the next one starts ``collect_interval`` later;
* screening and pulling: a new manifest is admitted within the per-epoch global quota and pulled
  with at most 8 pulls at once, 2 per author, from the author (a NATed author's holders), through the
  source's uplink and the reader's downlink (FIFO queues at each end) and no faster than one TCP
  flow on that path (its loss and round trip: ``tcp_c * MSS / (RTT * sqrt(loss))``, calibrated on the
  lab's links); a pull slower than ``pull_timeout + size / pull_min_rate`` fails and is retried;
* CPU: every operation costs the CPU measured for it (``Costs``), served by a FIFO per node at
  ``--cpu-share`` of a core.

Links are the ``scripts/lib/netlab/netns.py`` profiles: one-way delay on what a node sends, loss, uplink rate;
the downlink is ``--down-factor`` times the uplink (0: unlimited, as the lab emulates it).

At large N only ``--tracked`` readers are simulated in full; the others are a mean field: the load
they put on each node's uplink (pulls of its batches, replies of the keys it holds) is added as
background, from the poll period and pull rates the tracked readers see in the previous epoch. It
prints per profile: delivery within two epochs (of the batches a reader reads), publish-to-accepted
latency, poll period, traffic per node (DHT and pulls, up and down), busiest uplinks, CPU share of the
network side, failed pulls and quota refusals.
"""

from __future__ import annotations

import argparse
import bisect
import hashlib
import heapq
import json
import math
import random
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from scripts.lib.netlab.netns import PROFILES, percentile  # noqa: E402

MSS = 1448.0


@dataclass(frozen=True)
class Costs:
    """Per-operation costs, the same as ``scaling_model.Params`` (``docs/scaling.md``, "Parameters"),
    plus the round trips and TCP rate of the lab's links."""

    manifest_bytes: float = 330.0  # one manifest in a key's reply, on the wire
    neighbour_bytes: float = 63.0  # per neighbour a find reply names
    find_bytes: float = 724.0  # a find request and reply besides values and neighbours
    keys_per_find: float = 2.0
    beam: int = 20  # nodes a lookup visits at most (hivemind's bucket size)
    replicas: int = 5  # nodes a manifest is stored at (hivemind's num_replicas)
    lookup_rtts: float = 3.0  # round trips of a lookup beyond its bytes
    store_rtts: float = 4.0  # round trips of storing a manifest
    transfer_rtts: float = 3.0  # round trips a pull takes beyond its bytes (request, slow start)
    tcp_c: float = 10.0  # one TCP flow's rate: tcp_c * MSS / (RTT * sqrt(loss)), fitted on the lab's links
    cpu_base: float = 0.010  # cores an idle node uses
    cpu_dht_byte: float = 0.36e-6  # CPU seconds per DHT byte a poll brings in (serving others included)
    cpu_manifest: float = 0.00011  # a new manifest: decoded, signature verified
    cpu_pull_byte: float = 0.046e-6  # per byte pulled (p2pd, hash, decode and verify)


@dataclass
class Node:
    index: int
    profile: str
    delay: float  # seconds, one way, on what it sends
    loss: float
    up: float  # bytes/s
    down: float  # bytes/s (inf: unlimited)
    nat: bool
    up_free: float = 0.0
    down_free: float = 0.0
    cpu_free: float = 0.0
    bg_up: float = 0.0  # background share of the uplink (mean field of untracked readers)
    sent: Counter[str] = field(default_factory=Counter)
    received: Counter[str] = field(default_factory=Counter)
    cpu: float = 0.0


@dataclass
class Batch:
    bid: int
    author: int
    epoch: int
    created: float
    visible: float
    holders: tuple[int, ...]


class Swarm:
    def __init__(self, args: argparse.Namespace, costs: Costs) -> None:
        self.args, self.costs = args, costs
        self.rng = random.Random(args.seed)
        self.nodes = self._build_nodes(args)
        self.public = [n.index for n in self.nodes if not n.nat]
        self.holders = self.public[: args.holders]
        self.public_delay = sum(self.nodes[i].delay for i in self.public) / max(1, len(self.public))
        tracked = self.nodes if args.tracked <= 0 or args.tracked >= len(self.nodes) else \
            self.rng.sample(self.nodes, args.tracked)
        self.tracked = {n.index for n in tracked}
        self.events: list[tuple[float, int, str, tuple[Any, ...]]] = []
        self._seq = 0
        self.keys: dict[tuple[int, int], list[tuple[float, int]]] = defaultdict(list)  # (epoch, shard) -> visible
        self.batches: list[Batch] = []
        self.seen: dict[int, set[int]] = defaultdict(set)
        self.last_read: dict[tuple[int, int, int], float] = {}  # (reader, epoch, shard) -> poll start read up to
        self.queue: dict[int, list[int]] = defaultdict(list)
        self.running: dict[int, Counter[int]] = defaultdict(Counter)
        self.attempts: Counter[tuple[int, int]] = Counter()
        self.epoch_pulls: Counter[tuple[int, int]] = Counter()
        self.accepted: dict[tuple[int, int], float] = {}  # (reader, batch) -> time
        self.counts: Counter[str] = Counter()
        self.poll_periods: dict[int, list[float]] = defaultdict(list)
        self.mean_poll = args.collect_interval + 1.0
        self._replicas: dict[tuple[int, int], list[int]] = {}

    # -- set-up -----------------------------------------------------------------------------------------

    def _build_nodes(self, args: argparse.Namespace) -> list[Node]:
        names: list[str] = []
        for item in args.mix.split(","):
            name, _, share = item.partition(":")
            names += [name] * round(float(share or 1) * args.nodes)
        names = (names + [names[-1]] * args.nodes)[: args.nodes]
        if args.first:
            names[0] = args.first
        nodes = []
        for i, name in enumerate(names):
            p = PROFILES[name]
            up = (p.rate_mbit or args.lan_mbit) * 1e6 / 8
            down = math.inf if args.down_factor <= 0 else up * args.down_factor
            nodes.append(Node(i, name, p.delay_ms / 1000, p.loss, up, down, p.nat))
        return nodes

    def rtt(self, a: Node, b: Node) -> float:
        return a.delay + b.delay + 0.0005

    def shard(self, author: int) -> int:
        return int(hashlib.sha256(str(author).encode()).hexdigest(), 16) % self.args.shards

    def shards_read(self, reader: int, epoch: int) -> list[int]:
        k, s = self.args.read_shards, self.args.shards
        if k <= 0 or k >= s:
            return list(range(s))
        return random.Random(f"{reader}/{epoch}").sample(range(s), k)

    def replicas(self, key: tuple[int, int]) -> list[int]:
        """The nodes a key's manifests are stored at: the same few public nodes for every reader (in the
        DHT, the ones nearest to the key's id; here a draw seeded by the key)."""
        found = self._replicas.get(key)
        if found is None:
            found = self._replicas[key] = random.Random(f"key/{key}").sample(
                self.public, min(self.costs.replicas, len(self.public)))
        return found

    # -- the event loop ---------------------------------------------------------------------------------

    def at(self, t: float, kind: str, *data: Any) -> None:
        self._seq += 1
        heapq.heappush(self.events, (t, self._seq, kind, data))

    def run(self) -> None:
        e = self.args.epoch_seconds
        for node in self.nodes:
            self.at(self.rng.uniform(0, self.args.publish_seconds), "publish", node.index)
        for i in self.tracked:
            self.at(self.rng.uniform(0, 2.0), "poll", i)
        for k in range(1, self.args.epochs + 1):
            self.at(k * e, "epoch", k)
        self.at(self.args.warmup_epochs * e + 1e-6, "mark")
        end = self.args.epochs * e
        while self.events:
            t, _, kind, data = heapq.heappop(self.events)
            if t > end:
                break
            getattr(self, f"on_{kind}")(t, *data)

    # -- links and CPU ----------------------------------------------------------------------------------

    def transmit(self, src: Node, dst: Node, nbytes: float, t: float, what: str) -> float:
        """When ``nbytes`` sent at ``t`` from ``src`` have all arrived at ``dst``."""
        up_rate = src.up * max(0.02, 1.0 - src.bg_up)
        up_done = max(t, src.up_free) + nbytes / up_rate
        src.up_free = up_done
        arrive = up_done + src.delay
        if math.isfinite(dst.down):
            down_done = max(t, dst.down_free) + nbytes / dst.down
            dst.down_free = down_done
            arrive = max(arrive, down_done)
        rtt = self.rtt(src, dst)
        cap = math.inf if src.loss <= 0 else self.costs.tcp_c * MSS / (rtt * math.sqrt(src.loss))
        arrive = max(arrive, t + nbytes / cap)
        src.sent[what] += nbytes
        dst.received[what] += nbytes
        return arrive

    def compute(self, node: Node, t: float, seconds: float) -> float:
        """When ``seconds`` of CPU work ready at ``t`` is done on ``node``."""
        node.cpu += seconds
        node.cpu_free = max(t, node.cpu_free) + seconds / self.args.cpu_share
        return node.cpu_free

    # -- events -----------------------------------------------------------------------------------------

    def on_mark(self, t: float) -> None:
        """The end of the warm-up: traffic and CPU are counted from here."""
        for node in self.nodes:
            node.sent.clear()
            node.received.clear()
            node.cpu = 0.0
        self.poll_periods.clear()

    def on_epoch(self, t: float, k: int) -> None:
        """Refresh the mean field: what the untracked readers load each uplink with."""
        periods = [p for i in self.tracked for p in self.poll_periods[i][-20:]]
        if periods:
            self.mean_poll = sum(periods) / len(periods)
        untracked = len(self.nodes) - len(self.tracked)
        if untracked <= 0:
            return
        a, c = self.args, self.costs
        reads = 1.0 if a.read_shards <= 0 or a.read_shards >= a.shards else a.read_shards / a.shards
        batch = a.batch_kib * 1024
        per_batch = untracked * reads * batch / a.publish_seconds  # bytes/s an author's batches draw
        load = Counter[int]()
        for node in self.nodes:
            if node.nat:
                for h in self.holders[:2]:
                    load[h] += per_batch / 2
            else:
                load[node.index] += per_batch
        authors_per_shard = len(self.nodes) / a.shards
        entries = authors_per_shard * (a.epoch_seconds / a.publish_seconds) * 1.5 / 2  # per key, mean of 2 epochs
        key_bytes = entries * c.manifest_bytes
        for epoch in (k, k - 1):
            for s in range(a.shards):
                for r in self.replicas((epoch, s)):
                    load[r] += untracked * reads * key_bytes / self.mean_poll
        for node in self.nodes:
            node.bg_up = load[node.index] / node.up

    def on_publish(self, t: float, author: int) -> None:
        a, c = self.args, self.costs
        node = self.nodes[author]
        self.at(t + a.publish_seconds * self.rng.uniform(0.98, 1.02), "publish", author)
        epoch = int(t // a.epoch_seconds)
        size = a.batch_kib * 1024
        ready, holders = t, ()
        if node.nat:
            holders = tuple(self.rng.sample(self.holders, min(2, len(self.holders))))
            arrivals = [self.transmit(node, self.nodes[h], size, t, "handoff") for h in holders]
            ready = min(arrivals)
        replicas = [self.nodes[r] for r in self.replicas((epoch, self.shard(author)))]
        rtt = sum(self.rtt(node, r) for r in replicas) / len(replicas)
        visible = ready + c.store_rtts * rtt
        batch = Batch(len(self.batches), author, epoch, t, visible, holders)
        self.batches.append(batch)
        bisect.insort(self.keys[(epoch, self.shard(author))], (visible, batch.bid))
        self.counts["published"] += 1

    def on_poll(self, t: float, reader: int) -> None:
        a, c = self.args, self.costs
        node = self.nodes[reader]
        current = int(t // a.epoch_seconds)
        keys = [(e, s) for e in (current, current - 1) if e >= 0 for s in self.shards_read(reader, e)]
        peers = min(len(self.public) - (0 if node.nat else 1), c.beam)
        finds = len(keys) / c.keys_per_find * peers
        done = t + c.lookup_rtts * (node.delay + self.public_delay + 0.0005)
        find_bytes = finds * (c.find_bytes + c.keys_per_find * max(0, peers - 1) * c.neighbour_bytes)
        reply_bytes = find_bytes
        new: list[int] = []
        for key in keys:
            entries = self.keys.get(key, [])
            n_visible = bisect.bisect_right(entries, (t, math.inf))
            nbytes = n_visible * c.manifest_bytes
            for r in self.replicas(key):
                if r == reader:
                    continue
                done = max(done, self.transmit(self.nodes[r], node, nbytes, t + self.rtt(node, self.nodes[r]) / 2,
                                               "dht"))
                reply_bytes += nbytes
            since = self.last_read.get((reader, *key), -math.inf)
            lo = bisect.bisect_right(entries, (since, math.inf))
            new += [bid for _, bid in entries[lo:n_visible]]
            self.last_read[(reader, *key)] = t
        node.received["dht"] += find_bytes  # requests and replies without values (fitted as one quantity)
        cpu = reply_bytes * c.cpu_dht_byte
        done = self.compute(node, done, cpu)
        self.poll_periods[reader].append(done - t + a.collect_interval)
        self.at(done, "polled", reader, tuple(new))
        self.at(done + a.collect_interval, "poll", reader)

    def on_polled(self, t: float, reader: int, new: tuple[int, ...]) -> None:
        a = self.args
        current = int(t // a.epoch_seconds)
        fresh = [b for b in new if self.batches[b].author != reader and b not in self.seen[reader]]
        for bid in fresh:
            batch = self.batches[bid]
            if batch.epoch <= current - 2:
                self.counts["stale"] += 1
                continue
            used = self.epoch_pulls[(reader, batch.epoch)]
            if used >= a.max_batches_per_epoch:
                self.counts["quota_global"] += 1
                continue
            self.epoch_pulls[(reader, batch.epoch)] += 1
            self.seen[reader].add(bid)
            self.compute(self.nodes[reader], t, self.costs.cpu_manifest)
            self.queue[reader].append(bid)
        self.start_pulls(t, reader)

    def start_pulls(self, t: float, reader: int) -> None:
        running, queue = self.running[reader], self.queue[reader]
        i = 0
        while i < len(queue) and sum(running.values()) < 8:
            batch = self.batches[queue[i]]
            if running[batch.author] >= 2:
                i += 1
                continue
            queue.pop(i)
            running[batch.author] += 1
            self.pull(t, reader, batch)

    def pull(self, t: float, reader: int, batch: Batch) -> None:
        a, c = self.args, self.costs
        node = self.nodes[reader]
        source = self.nodes[batch.holders[0] if batch.holders else batch.author]
        size = a.batch_kib * 1024
        request = t + self.rtt(node, source) / 2
        arrive = self.transmit(source, node, size, request, "pull") + c.transfer_rtts * self.rtt(node, source)
        if arrive - t > a.pull_timeout + size / a.pull_min_rate + a.pull_timeout:
            self.at(t + a.pull_timeout + size / a.pull_min_rate, "pull_failed", reader, batch.bid)
            return
        done = self.compute(node, arrive, size * c.cpu_pull_byte)
        self.at(done, "pulled", reader, batch.bid)

    def on_pulled(self, t: float, reader: int, bid: int) -> None:
        batch = self.batches[bid]
        self.running[reader][batch.author] -= 1
        self.accepted[(reader, bid)] = t
        self.start_pulls(t, reader)

    def on_pull_failed(self, t: float, reader: int, bid: int) -> None:
        batch = self.batches[bid]
        self.running[reader][batch.author] -= 1
        self.attempts[(reader, bid)] += 1
        self.counts["pulls_failed"] += 1
        if self.attempts[(reader, bid)] < 3:
            self.queue[reader].append(bid)
        else:
            self.counts["unreachable"] += 1
        self.start_pulls(t, reader)

    # -- results ----------------------------------------------------------------------------------------

    def report(self) -> dict[str, Any]:
        a = self.args
        e = a.epoch_seconds
        t0, t1 = a.warmup_epochs * e, (a.epochs - 2) * e
        span = (a.epochs - a.warmup_epochs) * e
        window = [b for b in self.batches if t0 <= b.created < t1]
        by_profile: dict[str, dict[str, Any]] = {}
        for name in sorted({n.profile + (" NAT" if n.nat else "") for n in self.nodes}):
            readers = [i for i in self.tracked if self.nodes[i].profile + (" NAT" if self.nodes[i].nat else "") == name]
            if not readers:
                continue
            expected = in_time = 0
            latencies = []
            for i in readers:
                for b in window:
                    if b.author == i or self.shard(b.author) not in self.shards_read(i, b.epoch):
                        continue
                    expected += 1
                    got = self.accepted.get((i, b.bid))
                    if got is not None:
                        latencies.append(got - b.created)
                        in_time += got - b.created <= 2 * e
            nodes = [self.nodes[i] for i in readers]
            by_profile[name] = {
                "readers": len(readers),
                "delivered": in_time / expected if expected else None,
                "latency_p50": percentile(latencies, 50) if latencies else None,
                "latency_p99": percentile(latencies, 99) if latencies else None,
                "poll_s": sum(sum(self.poll_periods[i]) / max(1, len(self.poll_periods[i])) for i in readers) / len(readers),
                "dht_down": sum(n.received["dht"] for n in nodes) / len(nodes) / span,
                "pull_down": sum(n.received["pull"] for n in nodes) / len(nodes) / span,
                "cpu": self.costs.cpu_base + sum(n.cpu for n in nodes) / len(nodes) / span,
                "polls_per_s": sum(len(self.poll_periods[i]) for i in readers) / len(readers) / span,
            }
        ups = sorted(((sum(n.sent.values()) / span + n.bg_up * n.up) / n.up, n.index) for n in self.nodes)
        busiest = self.nodes[ups[-1][1]]
        return {"profiles": by_profile, "counts": dict(self.counts),
                "uplink_busiest": ups[-1][0], "busiest_profile": busiest.profile,
                "busiest_sent": {k: v / span for k, v in busiest.sent.items()}, "busiest_bg": busiest.bg_up,
                "uplink_median": ups[len(ups) // 2][0],
                "mean_up": {k: sum(n.sent[k] for n in self.nodes) / len(self.nodes) / span
                            for k in ("dht", "pull", "handoff")}}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=100)
    p.add_argument("--mix", default="continental", help="profile:share,... (netns_lab.PROFILES)")
    p.add_argument("--first", default="", help="the profile of node 0 (a bootstrap node)")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--warmup-epochs", type=int, default=1)
    p.add_argument("--epoch-seconds", type=float, default=60.0)
    p.add_argument("--publish-seconds", type=float, default=7.5)
    p.add_argument("--batch-kib", type=float, default=64.0)
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--read-shards", type=int, default=0)
    p.add_argument("--collect-interval", type=float, default=0.25)
    p.add_argument("--max-batches-per-epoch", type=int, default=1024)
    p.add_argument("--pull-timeout", type=float, default=10.0)
    p.add_argument("--pull-min-rate", type=float, default=16 * 1024)
    p.add_argument("--holders", type=int, default=3)
    p.add_argument("--lan-mbit", type=float, default=1000.0)
    p.add_argument("--down-factor", type=float, default=0.0)
    p.add_argument("--cpu-share", type=float, default=1.0, help="cores the network side of a node may use")
    p.add_argument("--tracked", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--costs", default=None, help="JSON of Costs fields")
    p.add_argument("--json", action="store_true")
    return p


def main() -> int:
    args = build_parser().parse_args()
    costs = Costs(**json.loads(args.costs)) if args.costs else Costs()
    swarm = Swarm(args, costs)
    swarm.run()
    result = swarm.report()
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"sim: {args.nodes} nodes ({args.mix}), {args.shards} shards, read {args.read_shards or 'all'}, batches "
          f"{args.batch_kib:.0f} KiB every {args.publish_seconds} s, epoch {args.epoch_seconds:.0f} s, "
          f"{len(swarm.tracked)} tracked readers")
    for name, r in result["profiles"].items():
        fmt = lambda v, s=1.0, d=1: "-" if v is None else f"{v * s:.{d}f}"  # noqa: E731
        print(f"  {name:18s} delivered {fmt(r['delivered'], 100)}%  latency p50 {fmt(r['latency_p50'])} s p99 "
              f"{fmt(r['latency_p99'])} s  poll {r['poll_s']:.2f} s  down: dht {r['dht_down'] / 1024:.0f} KiB/s "
              f"pulls {r['pull_down'] / 1024:.0f} KiB/s  cpu {100 * r['cpu']:.1f}%")
    print(f"  busiest uplink {100 * result['uplink_busiest']:.0f}% ({result['busiest_profile']}), median "
          f"{100 * result['uplink_median']:.0f}%; counts {result['counts']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
