"""A swarm whose only host goes away and comes back: does the exchange go on, and how soon is everyone back?

    sudo .venv/bin/python scripts/lab/host_outage.py --public 2 --nat 2 --epoch-seconds 60 --down 180 [--json OUT]
    sudo .venv/bin/python scripts/lab/host_outage.py --public 0 --nat 3 --epoch-seconds 60 --down 180

A descriptor is signed for one host (``scripts/lib/netlab/swarm.py``), the host runs ``swarm-node host`` in a
network namespace of the lab (``scripts/lib/netlab/netns.py``), and the members run ``scripts/lab/swarm_probe.py``
(a node's transport without its model) with the descriptor's shared settings and the member settings of
``configs/public-swarm.yaml`` (``client_mode: auto``), ``--public`` of them on public addresses and
``--nat`` behind the lab's NAT, each publishing a small batch every ``epoch_seconds / 8``. Once every member
accepted a batch of every other, the host is killed (``kill -9``) for ``--down`` seconds, then started again
with its key and address. From the members' traces (``scripts/lib/netlab/checks.py``) it reports:

* which members found out that peers can dial them (full members) and which stayed clients;
* of the batches published while the host was down (and at least two epochs before it returned), the
  share the other members accepted within two epochs of their creation;
* members that lost every peer, and after the host's return (from when it listens again), the seconds until
  each member had the host among its DHT neighbours again (and until it had any neighbour: for a member
  that had lost every peer, its way back).

Prints one table with the machine's load average, and with ``--json`` every figure. Needs root.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from scripts.lib.netlab import checks as swarm_checks  # noqa: E402
from scripts.lib.netlab import swarm as lab_swarm  # noqa: E402
from scripts.lib.netlab.netns import PROBE, NetLab, netns_unavailable_reason  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


class ProbeMember:
    """A probe process and its trace (what ``swarm_checks`` reads)."""

    def __init__(self, lab_host: Any, descriptor: Path, folder: Path, epoch: float, seconds: float) -> None:
        self.name, self.nat = folder.name, lab_host.nat
        self.trace_path = folder / "trace.jsonl"
        folder.mkdir(parents=True)
        doc = yaml.safe_load(descriptor.read_text())
        member = dict(yaml.safe_load((ROOT / "configs" / "public-swarm.yaml").read_text())["swarm"])
        member.pop("p2p_identity_path", None)
        shared = {k.removeprefix("swarm."): v for k, v in doc["settings"].items() if k.startswith("swarm.")}
        settings = {**member, **shared, "swarm_id": doc["swarm_id"], "initial_peers": doc["hosts"],
                    "host_maddrs": [f"/ip4/{lab_host.ip}/tcp/{lab_swarm.PORT}"], "trace_path": str(self.trace_path)}
        cmd = [sys.executable, PROBE, "--seconds", str(seconds), "--publish-every", str(epoch / 8), "--stats-every", "30"]
        for key, value in settings.items():
            cmd += ["--set", f"{key}={json.dumps(value)}"]
        self.out = folder / "probe.jsonl"
        self.proc = lab_host.popen(cmd, stdout=open(self.out, "wb"), stderr=subprocess.STDOUT,  # noqa: SIM115
                                   stdin=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT)

    def peer(self, timeout: float = 120) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.out.read_text().splitlines() if self.out.exists() else []:
                if '"ev": "up"' in line:
                    return str(json.loads(line)["peer"])
            time.sleep(0.5)
        raise RuntimeError(f"{self.name} did not start")

    def trace(self) -> list[dict[str, Any]]:
        events = []
        if self.trace_path.exists():
            for line in self.trace_path.read_text().splitlines():
                try:
                    events.append(json.loads(line))
                except ValueError:
                    continue
        return events

    def accepted_from(self, peer: str) -> int:
        return sum(1 for e in self.trace() if e.get("ev") == "acc" and peer.startswith(e.get("author", "-")))


def wait_until(predicate: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(1.0)
    return bool(predicate())


def back_after(member: ProbeMember, host_p2p: str, since: float) -> tuple[float | None, float | None]:
    """Seconds after ``since`` until the host was among ``member``'s neighbours again (its ``initial`` event),
    and until it had any neighbour (``up``, for a member that had lost every peer)."""
    events = [e for e in member.trace() if float(e.get("t", 0)) >= since]
    host = next((float(e["t"]) - since for e in events if e.get("ev") == "initial"
                 and any(host_p2p.startswith(p) for p in e.get("peers", []))), None)
    up = next((float(e["t"]) - since for e in events if e.get("ev") == "up"), None)
    return host, up


def run(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    epoch = args.epoch_seconds
    lab = NetLab()
    procs: list[subprocess.Popen[Any]] = []
    try:
        h = lab.add_host()
        places = [lab.add_host() for _ in range(args.public)] + [lab.add_host(nat=True) for _ in range(args.nat)]
        descriptor, keys = lab_swarm.init_swarm(base, [h.ip], overrides=[f"swarm.epoch_seconds={epoch}"])
        host_p2p = lab_swarm.host_peer_id(descriptor)

        def start_host(i: int) -> subprocess.Popen[Any]:
            proc = lab_swarm.start_host(h.popen, str(descriptor), base / f"host{i}", keys[0])
            lab_swarm.wait_for_text(base / f"host{i}.log", "members join with", 120, proc)
            return proc

        host = start_host(0)
        seconds = args.warmup_max + args.down + args.after + 600
        members = [ProbeMember(p, descriptor, base / f"m{i}", epoch, seconds) for i, p in enumerate(places)]
        procs += [m.proc for m in members]
        ids = {m: m.peer(300) for m in members}
        started = time.time()
        exchanged = wait_until(lambda: all(m.accepted_from(ids[o]) for m in members for o in members if o is not m),
                               args.warmup_max)
        warm = time.time() - started
        time.sleep(epoch)  # reachability found out, and one more epoch of exchange with the host
        full = [m.name for m in members if any(e.get("ev") == "reachable" for e in m.trace())]

        host.kill()
        host.wait(timeout=30)
        killed = time.time()
        time.sleep(args.down)
        returned = time.time()
        host = start_host(1)
        listening = time.time()
        time.sleep(args.after)
        host.terminate()
        host.wait(timeout=60)
        for m in members:
            m.proc.terminate()
        for m in members:
            m.proc.wait(timeout=60)

        during = swarm_checks.delivery(members, ids, after=killed, until=returned - 2 * epoch, window=2 * epoch)
        lost = [m.name for m in members if any(e.get("ev") == "lost" and killed <= float(e["t"]) <= returned
                                               for e in m.trace())]
        back = {m.name: back_after(m, host_p2p, listening) for m in members}
        return {
            "epoch_seconds": epoch, "public": args.public, "nat": args.nat, "down_s": args.down,
            "warm_exchange_s": round(warm, 1), "exchanged_before_kill": exchanged, "full_members": full,
            "clients": [m.name for m in members if m.name not in full],
            "delivered_while_down": {"pairs": during.pairs, "within_2_epochs": during.within, "late": during.late,
                                     "share": round(during.share, 4), "missing": during.missing[:5]},
            "lost_every_peer": lost,
            "host_restart_to_listening_s": round(listening - returned, 1),
            "back_after_restart_s": {name: {"host_neighbour": None if a is None else round(a, 1),
                                            "any_neighbour": None if b is None else round(b, 1)}
                                     for name, (a, b) in back.items()},
            "load_average": os.getloadavg(),
        }
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        lab.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--public", type=int, default=2, help="members on public addresses")
    parser.add_argument("--nat", type=int, default=2, help="members behind the lab's NAT")
    parser.add_argument("--epoch-seconds", type=float, default=60.0)
    parser.add_argument("--down", type=float, default=180.0, help="seconds the host stays down")
    parser.add_argument("--after", type=float, default=90.0, help="seconds watched after the host is back")
    parser.add_argument("--warmup-max", type=float, default=300.0)
    parser.add_argument("--json", help="write every figure here")
    args = parser.parse_args()
    reason = netns_unavailable_reason()
    if reason is not None:
        print(f"host_outage: {reason}", file=sys.stderr)
        return 2
    before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="host-outage-") as tmp:
        result = run(args, Path(tmp))
    result["load_average_before"] = before
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    d = result["delivered_while_down"]
    print(f"members: {args.public} public, {args.nat} NATed; {args.epoch_seconds:g} s epochs; host down {args.down:g} s; "
          f"load average {before[0]:.1f} before, {result['load_average'][0]:.1f} after")
    print(f"full members: {result['full_members']}; clients: {result['clients']}")
    print(f"while the host was down: {d['within_2_epochs']}/{d['pairs']} (batch, receiver) pairs accepted within two "
          f"epochs ({100 * d['share']:.1f}%), {d['late']} later; lost every peer: {result['lost_every_peer']}")
    print(f"host listening {result['host_restart_to_listening_s']} s after its restart; members back after it (s):")
    for name, back in result["back_after_restart_s"].items():
        print(f"  {name}: host a neighbour again {back['host_neighbour']}, any neighbour {back['any_neighbour']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
