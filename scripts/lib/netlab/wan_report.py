"""Figures of one ``scripts/lab/wan_swarm.py`` scenario, from its nodes' traces, metrics and the emulator's counters.

``analyse`` turns what the nodes wrote (``trace.jsonl``: every batch published, accepted, rejected or not
pulled, with times; ``metrics.jsonl``: one row a step with the transport's counters) into per-node rows
and scenario totals; ``print_result`` prints them. Only batches created in the measurement window
``[t0, t1]`` count towards delivery, and a batch counts as delivered to a node when that node accepted it
within two epochs of its creation.
"""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any

from scripts.lib.netlab.netns import percentile

_COUNTERS = ("polls", "poll_ms", "poll_key_timeouts", "pulls_failed", "pulls_stalled", "stalls_forgiven",
             "stalls_retried", "pulls_unreachable", "publish_failed", "handoffs_sent", "handoffs_held",
             "handoff_failed", "handoffs_refused", "bytes_in", "bytes_out", "batches_served", "dht_find_requests",
             "dht_find_keys", "dht_store_requests")
"""Running totals of the transport whose change over the window is reported."""


def _row_at(rows: list[dict[str, Any]], t: float) -> dict[str, Any]:
    """The last metrics row written at or before ``t`` (the first row if none)."""
    before = [r for r in rows if r.get("time", 0.0) <= t]
    return before[-1] if before else (rows[0] if rows else {})


def _delta(rows: list[dict[str, Any]], key: str, t0: float, t1: float) -> float:
    a, b = _row_at(rows, t0), _row_at(rows, t1)
    return float(b.get(key, 0) or 0) - float(a.get(key, 0) or 0)


def _q(values: list[float], q: float) -> float | None:
    return percentile(values, q) if values else None


def analyse(scenario: str, nodes: list[Any], *, t0: float, t1: float, epoch: float,
            links: tuple[dict[str, Any], dict[str, Any]], cpu: tuple[list[tuple[float, float]], list[tuple[float, float]]]
            ) -> dict[str, Any]:
    span = t1 - t0
    traces = {node.index: node.trace() for node in nodes}
    metrics = {node.index: node.metrics() for node in nodes}
    ids = {node.index: node.peer_id() for node in nodes}
    window_pubs: dict[int, dict[str, float]] = {}
    for node in nodes:
        window_pubs[node.index] = {e["id"]: e["created"] for e in traces[node.index]
                                   if e["ev"] == "pub" and t0 <= e["created"] <= t1}
    author_of = {bid: i for i, pubs in window_pubs.items() for bid in pubs}
    delivered_from: Counter[int] = Counter()  # author -> (batch, receiver) pairs delivered in time
    expected_from: Counter[int] = Counter()
    all_latencies: list[float] = []
    rows = []
    for node in nodes:
        i = node.index
        events = traces[i]
        accepted = {e["id"]: e for e in events if e["ev"] == "acc" and e["id"] in author_of and author_of[e["id"]] != i}
        expected = {bid: created for j, pubs in window_pubs.items() if j != i for bid, created in pubs.items()}
        in_time = [bid for bid, e in accepted.items() if e["t"] - expected[bid] <= 2 * epoch]
        latencies = [e["t"] - expected[bid] for bid, e in accepted.items()]
        all_latencies += latencies
        for bid in expected:
            expected_from[author_of[bid]] += 1
        for bid in in_time:
            delivered_from[author_of[bid]] += 1
        pulls = [e for e in accepted.values() if e.get("src") != "local"]
        up = next((e["t"] for e in events if e["ev"] == "up"), None)
        first = next((e["t"] for e in events if e["ev"] == "acc"), None)
        rows_i = metrics[i]
        last = rows_i[-1] if rows_i else {}
        steps = [r["step_seconds"] for r in rows_i if t0 <= r.get("time", 0) <= t1 and "step_seconds" in r]
        exchange = [r["exchange_seconds"] for r in rows_i if t0 <= r.get("time", 0) <= t1 and "exchange_seconds" in r]
        host = node.host.name if node.host is not None else None
        link0 = (links[0].get("stats") or {}).get(host, {}) if host else {}
        link1 = (links[1].get("stats") or {}).get(host, {}) if host else {}
        sent = (link1.get("up", {}).get("bytes", 0) - link0.get("up", {}).get("bytes", 0)) if host else None
        received = (link1.get("down", {}).get("bytes", 0) - link0.get("down", {}).get("bytes", 0)) if host else None
        node_cpu = cpu[1][i][0] - cpu[0][i][0]
        p2pd_cpu = cpu[1][i][1] - cpu[0][i][1]
        counters = {k: _delta(rows_i, k, t0, t1) for k in _COUNTERS}
        rows.append({
            "node": i, "profile": node.profile, "nat": node.nat, "peer": ids[i],
            "join_s": None if up is None else up - node.started,
            "first_accept_s": None if first is None else first - node.started,
            "published": len(window_pubs[i]),
            "published_failed": sum(1 for e in events if e["ev"] == "pub" and not e["ok"] and t0 <= e["created"] <= t1),
            "handoffs_per_batch": statistics.mean([e["handoffs"] for e in events if e["ev"] == "pub"] or [0]),
            "expected": len(expected), "accepted_in_time": len(in_time), "accepted_any": len(accepted),
            "share": len(in_time) / len(expected) if expected else None,
            "latency_p50": _q(latencies, 50), "latency_p99": _q(latencies, 99),
            "pull_p50": _q([e["pull_s"] for e in pulls], 50),
            "pull_bytes": sum(e["bytes"] for e in pulls), "pull_seconds": sum(e["pull_s"] for e in pulls),
            "batch_bytes": statistics.median([e["bytes"] for e in events if e["ev"] == "pub"] or [0]),
            "rejected": last.get("batches_rejected") or {}, "offences": last.get("offences") or {},
            "ingest_offences": last.get("ingest_offences") or {}, "ingest_rejected": last.get("ingest_rejected") or {},
            "trace_rejects": dict(Counter(e["reason"] for e in events if e["ev"] == "rej")),
            "trace_fails": dict(Counter(("stalled:" if e["stalled"] else "failed:") + str(e.get("why", ""))
                                       for e in events if e["ev"] == "fail")),
            "step_p50": _q(steps, 50), "exchange_p50": _q(exchange, 50), "steps": len(steps),
            "sent_bytes_s": None if sent is None else sent / span,
            "received_bytes_s": None if received is None else received / span,
            "cpu_node": node_cpu / span, "cpu_p2pd": p2pd_cpu / span,
            **{f"w_{k}": v for k, v in counters.items()},
        })
    emulator_cpu = None
    if links[0] and links[1]:
        emulator_cpu = (float(links[1]["cpu_s"]) - float(links[0]["cpu_s"])) / span
    nat_authors = [r["node"] for r in rows if r["nat"]]
    shares = [r["share"] for r in rows if r["share"] is not None]
    return {
        "scenario": scenario, "t0": t0, "t1": t1, "epoch": epoch, "rows": rows,
        "min_share": min(shares) if shares else None,
        "pairs_expected": sum(expected_from.values()), "pairs_in_time": sum(delivered_from.values()),
        "latency_p50": _q(all_latencies, 50), "latency_p99": _q(all_latencies, 99),
        "nat_share": (sum(delivered_from[i] for i in nat_authors) / max(1, sum(expected_from[i] for i in nat_authors))
                      if nat_authors else None),
        "offences": sum(sum(r["offences"].values()) + sum(r["ingest_offences"].values()) for r in rows),
        "emulator_cpu": emulator_cpu,
    }


def _fmt(value: float | None, scale: float = 1.0, digits: int = 0, unit: str = "") -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}{unit}"


def print_result(result: dict[str, Any], epoch: float) -> None:
    name = result["scenario"]
    if "error" in result:
        print(f"== {name}: FAILED: {result['error']}", flush=True)
        return
    lb, ld = result["load_before"], result["load_during"]
    print(f"== {name}: load average {lb[0]:.1f} before, {ld[0]:.1f} {ld[1]:.1f} {ld[2]:.1f} at the end; "
          f"window {result['t1'] - result['t0']:.0f} s", flush=True)
    print("node profile           join  1st-acc  pub  share(2ep)  any   lat p50/p99 s   pull p50  step p50  "
          "sent/recv KB/s  cpu node+p2pd  polls ms  dht-to  rejected / offences")
    for r in result["rows"]:
        rejected = {**r["rejected"], **{f"ingest:{k}": v for k, v in r["ingest_rejected"].items()}}
        offences = {**r["offences"], **{f"ingest:{k}": v for k, v in r["ingest_offences"].items()}}
        polls = r["w_polls"]
        poll_ms = r["w_poll_ms"] / polls if polls else None
        traffic = "-" if r["sent_bytes_s"] is None else f"{r['sent_bytes_s'] / 1024:.1f}/{r['received_bytes_s'] / 1024:.1f}"
        print(f"{r['node']:4d} {r['profile'] + (' NAT' if r['nat'] else ''):16s} {_fmt(r['join_s'], digits=1):>5s} "
              f"{_fmt(r['first_accept_s'], digits=1):>7s} {r['published']:4d}  "
              f"{_fmt(r['share'], 100, 0, '%'):>9s}  {r['accepted_any']:3d}/{r['expected']:<3d} "
              f"{_fmt(r['latency_p50'], digits=2):>6s}/{_fmt(r['latency_p99'], digits=2):<6s} "
              f"{_fmt(r['pull_p50'], digits=2):>8s}  {_fmt(r['step_p50'], 1000, 0, 'ms'):>8s}  {traffic:>14s}  "
              f"{100 * r['cpu_node']:5.1f}%+{100 * r['cpu_p2pd']:4.1f}%  {_fmt(poll_ms, digits=0):>8s}  "
              f"{r['w_poll_key_timeouts']:6.0f}  {rejected or '-'} / {offences or '-'}")
    share = result["pairs_in_time"] / result["pairs_expected"] if result["pairs_expected"] else None
    print(f"   {name}: delivered within 2 epochs ({2 * epoch:.0f} s): {result['pairs_in_time']}/{result['pairs_expected']} "
          f"pairs ({_fmt(share, 100, 1, '%')}), lowest node {_fmt(result['min_share'], 100, 1, '%')}; latency p50 "
          f"{_fmt(result['latency_p50'], digits=2)} s, p99 {_fmt(result['latency_p99'], digits=2)} s; offences "
          f"(bans) {result['offences']}"
          + ("" if result["nat_share"] is None else f"; NATed authors' batches delivered {100 * result['nat_share']:.1f}%")
          + ("" if result["emulator_cpu"] is None else f"; link emulator {100 * result['emulator_cpu']:.1f}% of a core")
          + (f"; LEFT BEHIND {result['left_behind']}" if result["left_behind"] else ""), flush=True)
