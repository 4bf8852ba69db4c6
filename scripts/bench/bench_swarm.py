"""Benchmark a local swarm: publish-to-visible latency, pull throughput and memory per node, in one run.

    .venv/bin/python scripts/bench/bench_swarm.py --nodes 8

Starts N ``SwarmTransport`` nodes on 127.0.0.1 in this process (node 0 bootstraps the rest; each node has
its own network thread and its own p2pd). Then:

1. latency: every node publishes ``--rounds`` small batches in turn; each batch's latency at each other
   node is the time from ``publish()`` until that node's ``collect()`` returns it (collect is polled
   every 10 ms). Reports p50/p99 over all (batch, receiver) pairs;
2. pull throughput: node 1 pulls a large incompressible batch (``--pull-mib``) from node 0 over the
   batch handler ``--pulls`` times; reports MiB/s;
3. memory: RSS of this process (its growth per node, over the baseline after imports) and of each p2pd.

With ``--processes`` the same measurements run over N real processes instead (``scripts/lab/swarm_probe.py``:
each its own Python and p2pd, node 0 bootstrapping the rest), in two rounds:

1. latency: every process publishes ``--rounds`` small batches, staggered so one batch goes out every
   ``--gap`` seconds across the swarm; p50/p99 over all (batch, receiver) pairs, from wall-clock times
   the processes log (one machine, one clock);
2. pull throughput: every process publishes one ``--pull-mib`` batch at once and pulls everyone else's;
   reports the swarm's total pulled bytes per second (first publish to last arrival) and per node;
3. memory: RSS of each process (Python with the transport, no model) and of its p2pd.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import statistics
import string
import sys
import time

import psutil

from protocol.codec import encode_batch  # noqa: E402
from protocol.identity import Identity  # noqa: E402
from protocol.limits import Limits  # noqa: E402
from protocol.records import Rollout, RolloutBatch, RolloutGroup, SamplingParams  # noqa: E402
from protocol.taskref import TaskRef  # noqa: E402
from scripts.lib.netlab.netns import Probe, delivery, percentile  # noqa: E402
from swarm.core.pull import PullProgress as _PullProgress  # noqa: E402
from swarm.settings import SwarmSettings  # noqa: E402
from swarm.transport import SwarmTransport  # noqa: E402

SWARM_ID = "bench-swarm"
MIB = 1024 * 1024


def make_batch(
    identity: Identity, *, n_groups: int, group_size: int, text_chars: int, tag: int
) -> RolloutBatch:
    rng = random.Random(tag)
    groups = []
    for g in range(n_groups):
        task = TaskRef(source="arith", dataset="add", config_hash="bench", seed=tag, index=g)
        rollouts = tuple(
            Rollout(
                task=task,
                prompt=f"task {tag}/{g}",
                completion="".join(rng.choices(string.ascii_letters, k=text_chars)),
                completion_ids=tuple(range(16)),
                tokenizer_fingerprint="tok",
                behavior_logprobs=(-0.5,) * 16,
                sampling=SamplingParams(temperature=1.0, top_p=1.0),
                model_fingerprint="model",
                policy_step=tag,
                finish_reason="eos",
            )
            for _ in range(group_size)
        )
        groups.append(RolloutGroup(task=task, rollouts=rollouts))
    return RolloutBatch(SWARM_ID, identity.public_key, (), 0, 0, time.time(), tuple(groups))


def start_nodes(n: int, limits: Limits) -> list[SwarmTransport]:
    settings: dict[str, object] = {"swarm_id": SWARM_ID, "collect_interval": 0.25, "request_timeout": 5.0}
    first = SwarmTransport(SwarmSettings.model_validate(settings), Identity.generate(), limits)
    first.start(wait=True)
    nodes = [first]
    for _ in range(n - 1):
        node = SwarmTransport(
            SwarmSettings.model_validate({**settings, "initial_peers": first.visible_multiaddrs()}),
            Identity.generate(),
            limits,
        )
        node.start(wait=False)
        nodes.append(node)
    for node in nodes:
        if not node.wait_until_up(60):
            raise SystemExit("a node did not come up in 60 s")
    return nodes


def measure_latency(nodes: list[SwarmTransport], rounds: int, gap: float) -> list[float]:
    sent: dict[tuple[bytes, int], float] = {}
    latencies: list[float] = []
    pending = 0
    for r in range(rounds):
        for i, node in enumerate(nodes):
            batch = make_batch(node.identity, n_groups=2, group_size=4, text_chars=200, tag=r * 1000 + i)
            sent[(node.identity.public_key, batch.groups[0].task.seed)] = time.monotonic()
            if node.publish(batch) is None:
                raise SystemExit("publish failed")
            pending += len(nodes) - 1
            deadline = time.monotonic() + gap
            while time.monotonic() < deadline:
                pending -= drain(nodes, sent, latencies)
                time.sleep(0.01)
    deadline = time.monotonic() + 20
    while pending > 0 and time.monotonic() < deadline:
        pending -= drain(nodes, sent, latencies)
        time.sleep(0.01)
    if pending:
        print(f"warning: {pending} (batch, receiver) pairs never arrived", file=sys.stderr)
    return latencies


def drain(nodes: list[SwarmTransport], sent: dict[tuple[bytes, int], float], latencies: list[float]) -> int:
    n = 0
    for node in nodes:
        for batch in node.collect():
            now = time.monotonic()
            latencies.append(now - sent[(batch.author, batch.groups[0].task.seed)])
            n += 1
    return n


def measure_pull(nodes: list[SwarmTransport], mib: float, pulls: int) -> tuple[float, int]:
    server, client = nodes[0], nodes[1]
    chars = 8192
    n_groups = max(1, int(mib * MIB / (8 * chars)))
    batch = make_batch(server.identity, n_groups=n_groups, group_size=8, text_chars=chars, tag=999_999)
    data = encode_batch(batch, server.identity, server.limits)
    from protocol.codec import batch_id

    bid = batch_id(data)
    server._call_on_loop(lambda core: core.hold(bid, data))
    peer = server.visible_multiaddrs()[0].rsplit("/", 1)[1]
    from hivemind.p2p import PeerID

    async def pull(core: object) -> float:
        started = time.perf_counter()
        progress = _PullProgress()
        got = await core._fetch_from(PeerID.from_base58(peer), bid, len(data), progress, author=True)  # type: ignore[attr-defined]
        if got != data:
            raise SystemExit("pulled bytes differ")
        return time.perf_counter() - started

    times = [client._await_on_loop(pull) for _ in range(pulls)]
    return len(data) * pulls / sum(times) / MIB, len(data)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3, help="batches published by each node")
    parser.add_argument("--gap", type=float, default=0.3, help="seconds between two publishes")
    parser.add_argument("--pull-mib", type=float, default=4.0)
    parser.add_argument("--pulls", type=int, default=10)
    parser.add_argument("--processes", action="store_true", help="one real process per node (see above)")
    args = parser.parse_args()
    if args.nodes < 2:
        parser.error("--nodes must be >= 2")
    logging.basicConfig(level=logging.WARNING)
    if args.processes:
        multiprocess_main(args)
        return

    me = psutil.Process()
    baseline = me.memory_info().rss
    limits = Limits(max_compressed_bytes=int(args.pull_mib * MIB) + 4 * MIB)
    t0 = time.monotonic()
    nodes = start_nodes(args.nodes, limits)
    try:
        startup = time.monotonic() - t0
        time.sleep(2.0)  # let routing tables settle
        latencies = measure_latency(nodes, args.rounds, args.gap)
        throughput, pull_bytes = measure_pull(nodes, args.pull_mib, args.pulls)
        process_rss = me.memory_info().rss
        p2pd_rss = [psutil.Process(node.p2pd_pid()).memory_info().rss for node in nodes]
        rejected = 0
        for node in nodes:
            reasons = node.stats()["batches_rejected"]
            rejected += sum(reasons.values()) if isinstance(reasons, dict) else 0
    finally:
        for node in nodes:
            node.close()

    mean_p2pd = statistics.mean(p2pd_rss) / MIB
    per_node_python = (process_rss - baseline) / args.nodes / MIB
    print(f"nodes: {args.nodes} on 127.0.0.1, one process, {os.cpu_count()} CPUs; started in {startup:.1f} s")
    print(
        f"publish-to-visible latency over {len(latencies)} (batch, receiver) pairs: "
        f"p50 {percentile(latencies, 50) * 1000:.0f} ms, p99 {percentile(latencies, 99) * 1000:.0f} ms, "
        f"max {max(latencies) * 1000:.0f} ms"
    )
    print(
        f"pull throughput: {throughput:.1f} MiB/s ({args.pulls} pulls of a {pull_bytes / MIB:.2f} MiB signed batch)"
    )
    print(
        f"memory per node: {per_node_python + mean_p2pd:.1f} MiB = {per_node_python:.1f} MiB in-process "
        f"(network thread, DHT, buffers) + {mean_p2pd:.1f} MiB p2pd (max {max(p2pd_rss) / MIB:.1f}); "
        f"shared process baseline after imports {baseline / MIB:.0f} MiB, total {process_rss / MIB:.0f} MiB"
    )
    print(f"rejections across nodes: {rejected}")


def start_probes(n: int, *, seconds: float, publish_every: float, count: int, stagger: float,
                 batch_args: tuple[str, ...]) -> list[Probe]:
    """N probe processes, node 0 bootstrapping the rest, all up and told to start publishing."""
    base = {"swarm_id": SWARM_ID, "collect_interval": 0.25, "request_timeout": 10.0, "startup_timeout": 120.0}
    extra = ("--wait-go", *batch_args)

    def probe(i: int, settings: dict[str, object]) -> Probe:
        return Probe(sys.executable, settings, seconds=seconds, publish_every=publish_every, publish_count=count,
                     publish_after=i * stagger, stats_every=5.0, extra_args=extra)

    boot = probe(0, base)
    boot.wait_up(180)
    probes = [boot] + [probe(i, {**base, "initial_peers": [boot.maddr()]}) for i in range(1, n)]
    for p in probes:
        p.wait_up(300)
    time.sleep(3.0)  # let routing tables settle
    for p in probes:
        p.send("go")
    return probes


def wait_delivered(probes: list[Probe], expected: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and len(delivery(probes)[0]) < expected:
        time.sleep(0.5)


def multiprocess_main(args: argparse.Namespace) -> None:
    n = args.nodes
    load = os.getloadavg()
    t0 = time.monotonic()
    probes = start_probes(n, seconds=600, publish_every=args.gap * n, count=args.rounds, stagger=args.gap,
                          batch_args=("--groups", "2", "--text-chars", "200"))
    try:
        startup = time.monotonic() - t0
        wait_delivered(probes, args.rounds * n * (n - 1), args.rounds * args.gap * n + 60)
        latencies, expected = delivery(probes)
        memory = [(p.of("stats")[-1]["rss"], p.of("stats")[-1]["p2pd_rss"]) for p in probes if p.of("stats")]
    finally:
        for p in probes:
            p.stop()
    chars = 16000  # 16 groups x 4 completions x 16,000 random letters: about 0.75 MiB compressed
    groups = max(1, int(args.pull_mib * MIB / (4 * chars * 0.75)))
    probes = start_probes(n, seconds=600, publish_every=1.0, count=1, stagger=0.0,
                          batch_args=("--groups", str(groups), "--text-chars", str(chars)))
    try:
        go = time.time()
        wait_delivered(probes, n * (n - 1), 300)
        arrivals = [float(e["t"]) for p in probes for e in p.of("got")]
        for p in probes:
            p.send("stop")
        for p in probes:
            p.stop()
        pulled = sum(int(p.of("stats")[-1]["stats"]["bytes_in"]) for p in probes if p.of("stats"))
    finally:
        for p in probes:
            p.stop()
    span = max(arrivals) - go if arrivals else float("nan")
    print(f"nodes: {n} real processes on 127.0.0.1 (each its own Python and p2pd), {os.cpu_count()} CPUs, "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; started in {startup:.1f} s")
    print(f"publish-to-visible latency over {len(latencies)}/{expected} (batch, receiver) pairs: "
          f"p50 {percentile(latencies, 50) * 1000:.0f} ms, p99 {percentile(latencies, 99) * 1000:.0f} ms, "
          f"max {max(latencies) * 1000:.0f} ms")
    print(f"pull throughput: {len(arrivals)}/{n * (n - 1)} large batches, {pulled / MIB:.1f} MiB pulled in {span:.1f} s: "
          f"{pulled / MIB / span:.1f} MiB/s across the swarm, {pulled / MIB / span / n:.2f} MiB/s per node")
    if memory:
        py = statistics.mean(m[0] for m in memory) / MIB
        daemon = statistics.mean(m[1] for m in memory) / MIB
        print(f"memory per node: {py + daemon:.1f} MiB = {py:.1f} MiB Python (transport only, no model; hivemind imports torch) + "
              f"{daemon:.1f} MiB p2pd; total {(py + daemon) * n:.0f} MiB")


if __name__ == "__main__":
    main()
