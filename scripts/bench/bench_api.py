"""The status API under load: does serving 200 concurrent clients slow the training step?

Usage: python scripts/bench/bench_api.py [--rounds 6] [--steps 8] [--clients 200] [--threads 2] [key=value ...]

One silo node (``configs/tiny-silo.yaml`` plus the overrides) trains in this process with its API on a
free port, exactly as ``swarm-node silo`` runs it (the API in its own thread). A load generator in a
separate process keeps ``--clients`` requests in flight at all times (each client sends its next request
as soon as the previous answer arrives), spread over every endpoint the dashboard and a Prometheus
scraper use. Phases alternate, ``--steps`` steps each: quiet, loaded, loaded, quiet, ... (ABBA, so drift
in machine load hits both alike), and the median step time of each side is compared. Goal: loaded /
quiet <= 1.10. Also prints requests served per second and their latency under load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PATHS = ["api/status", "api/peers", "api/metrics?since={since}", "healthz", "metrics", "api/status"]


# -- the load generator (a child process) -----------------------------------------------------------

async def _client(session, base: str, paths: list[str], stats: dict, stop: asyncio.Event, offset: int) -> None:
    import aiohttp

    i = offset
    while not stop.is_set():
        path = paths[i % len(paths)].format(since=max(0, stats["step"] - 5))
        i += 1
        t0 = time.perf_counter()
        try:
            async with session.get(base + path) as resp:
                body = await resp.read()
                if resp.status == 200:
                    stats["ok"] += 1
                    if path.startswith("api/status"):
                        stats["step"] = json.loads(body)["step"]
                else:
                    stats["errors"] += 1
        except (aiohttp.ClientError, asyncio.TimeoutError):
            stats["errors"] += 1
        stats["latencies"].append(time.perf_counter() - t0)


async def _load_main(base: str, clients: int) -> None:
    """Reads 'on' / 'off' / 'quit' lines on stdin; after each 'off', prints the phase's counts as JSON."""
    import aiohttp

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    connector = aiohttp.TCPConnector(limit=clients)
    timeout = aiohttp.ClientTimeout(total=120)  # a flood waits in line for seconds: only a lost answer is an error
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        stats = {"ok": 0, "errors": 0, "latencies": [], "step": 0}
        while True:
            command = (await reader.readline()).decode().strip()
            if command in ("quit", ""):
                return
            if command != "on":
                continue
            stats.update(ok=0, errors=0, latencies=[])
            stop = asyncio.Event()
            t0 = time.perf_counter()
            tasks = [asyncio.create_task(_client(session, base, PATHS, stats, stop, k)) for k in range(clients)]
            await reader.readline()  # 'off'
            stop.set()
            await asyncio.gather(*tasks)
            lat = sorted(stats["latencies"]) or [0.0]
            print(json.dumps({"ok": stats["ok"], "errors": stats["errors"], "seconds": time.perf_counter() - t0,
                              "p50": lat[len(lat) // 2], "p99": lat[int(len(lat) * 0.99)]}), flush=True)


# -- the node and the measurement ---------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6, help="ABBA rounds: each is one quiet and one loaded phase")
    parser.add_argument("--steps", type=int, default=8, help="training steps per phase")
    parser.add_argument("--clients", type=int, default=200, help="requests kept in flight under load")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the node")
    parser.add_argument("--load", metavar="URL", help=argparse.SUPPRESS)  # internal: run as the load generator
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_args()
    if args.load:
        asyncio.run(_load_main(args.load, args.clients))
        return

    import psutil
    import torch

    from node.config import load_config
    from node.run.node import Node

    torch.set_num_threads(args.threads)
    run_dir = tempfile.mkdtemp(prefix="bench_api-")
    cfg = load_config(ROOT / "configs" / "tiny-silo.yaml",
                      [f"run_dir={run_dir}", "train.steps=100000", "train.checkpoint_every=100000",
                       "train.eval_every=100000", "api.port=0", *args.overrides])
    node = Node(cfg, show_progress=False)
    node.setup()
    assert node.api is not None
    load = subprocess.Popen([sys.executable, __file__, "--load", node.api.url, "--clients", str(args.clients)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert load.stdin is not None and load.stdout is not None
    quiet: list[float] = []
    loaded: list[float] = []
    phases: list[dict] = []
    quiet_medians: list[float] = []  # per round, paired with the loaded phase next to it
    loaded_medians: list[float] = []
    cpu = {"api": 0.0, "clients": 0.0, "loaded_wall": 0.0}
    me, clients = psutil.Process(), psutil.Process(load.pid)

    def api_cpu() -> float:
        return next((t.user_time + t.system_time for t in me.threads() if t.id == node.api.thread_native_id), 0.0)

    def client_cpu() -> float:
        times = clients.cpu_times()
        return times.user + times.system
    try:
        for _ in range(3):  # warm-up
            node.train_step()
        for r in range(args.rounds):
            for is_loaded in ((False, True) if r % 2 == 0 else (True, False)):
                if is_loaded:
                    load.stdin.write("on\n")
                    load.stdin.flush()
                    time.sleep(0.5)  # the clients are connected and busy before the first timed step
                    marks = (api_cpu(), client_cpu(), time.perf_counter())
                for _ in range(args.steps):
                    t0 = time.perf_counter()
                    node.train_step()
                    (loaded if is_loaded else quiet).append(time.perf_counter() - t0)
                if is_loaded:
                    cpu["api"] += api_cpu() - marks[0]
                    cpu["clients"] += client_cpu() - marks[1]
                    cpu["loaded_wall"] += time.perf_counter() - marks[2]
                    load.stdin.write("off\n")
                    load.stdin.flush()
                    phases.append(json.loads(load.stdout.readline()))
                side = loaded if is_loaded else quiet
                (loaded_medians if is_loaded else quiet_medians).append(statistics.median(side[-args.steps:]))
                print(f"round {r + 1}: {'loaded' if is_loaded else 'quiet '} median "
                      f"{statistics.median(side[-args.steps:]) * 1000:.0f} ms"
                      + (f", {phases[-1]['ok']} answers" if is_loaded else ""), flush=True)
    finally:
        load.stdin.write("quit\n")
        load.stdin.flush()
        load.wait(timeout=30)
        node.close()

    q, lo = statistics.median(quiet), statistics.median(loaded)
    served = sum(p["ok"] for p in phases)
    seconds = sum(p["seconds"] for p in phases)
    print(f"machine: {os.cpu_count()} cores, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} (at the end)")
    print(f"node: {cfg.sapo.local_groups} tasks x {cfg.generation.group_size} completions a step, "
          f"{args.threads} torch threads; {len(quiet)} quiet and {len(loaded)} loaded steps, ABBA order")
    print(f"step time quiet  median {q * 1000:.1f} ms (mean {statistics.mean(quiet) * 1000:.1f})")
    print(f"step time loaded median {lo * 1000:.1f} ms (mean {statistics.mean(loaded) * 1000:.1f})")
    print(f"under load: {args.clients} requests in flight, {served} answered ({served / seconds:.0f}/s), "
          f"{sum(p['errors'] for p in phases)} errors, latency p50 {max(p['p50'] for p in phases) * 1000:.0f} ms, "
          f"p99 {max(p['p99'] for p in phases) * 1000:.0f} ms (worst phase)")
    wall = cpu["loaded_wall"]
    print(f"CPU while loaded: API thread {cpu['api'] / wall:.1%} of a core (budget api.max_cpu_share="
          f"{cfg.api.max_cpu_share}), load generator {cpu['clients'] / wall:.1%}")
    paired = sorted(lm / qm for lm, qm in zip(loaded_medians, quiet_medians))
    print(f"paired: median of the {len(paired)} per-round ratios {statistics.median(paired):.3f} "
          f"(range {paired[0]:.2f} to {paired[-1]:.2f})")
    print(f"ratio loaded/quiet: {lo / q:.3f} (goal <= 1.10)")


if __name__ == "__main__":
    main()
