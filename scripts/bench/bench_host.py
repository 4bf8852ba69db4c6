"""What does a swarm's host cost at N members? Memory, CPU and bans of ``swarm-node host`` under load.

    sudo .venv/bin/python scripts/bench/bench_host.py --members 16 --minutes 5 --batch-kib 64 [key=value ...]

A descriptor is signed for one host (``scripts/lib/netlab/swarm.py``), the host runs ``swarm-node host`` in
a network namespace of the lab (``scripts/lib/netlab/netns.py``), and N members run ``scripts/lab/swarm_probe.py``
(a node's transport without its model: all a host sees of a member), half of them behind the lab's NAT
in client mode, handing their batches to the host. Each publishes a batch of ``--batch-kib`` every
``epoch_seconds / 8`` (the rate of a fast node) with the swarm's shared settings from the descriptor and
the member settings of ``configs/public-swarm.yaml``. Once the host has seen every member, for
``--minutes`` it samples the resident memory of the host process and of its p2pd every 5 s and their CPU
time at both ends; at the end it reads the host's ``/api/swarm``: members seen, banned peers, offences,
hand-offs held. Prints one table (with the machine's load average) and, with ``--json``, every figure.
Needs root for the namespaces.
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

import psutil
import yaml

from scripts.lib.netlab import swarm as lab_swarm  # noqa: E402
from scripts.lib.netlab.netns import PROBE, NetLab, netns_unavailable_reason  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def probe_settings(descriptor: Path, ip: str, nat: bool) -> dict[str, Any]:
    """A member's swarm settings: the descriptor's shared ones, configs/public-swarm.yaml's own, its address."""
    doc = yaml.safe_load(descriptor.read_text())
    member = dict(yaml.safe_load((ROOT / "configs" / "public-swarm.yaml").read_text())["swarm"])
    member.pop("p2p_identity_path", None)
    shared = {k.removeprefix("swarm."): v for k, v in doc["settings"].items() if k.startswith("swarm.")}
    return {**member, **shared, "swarm_id": doc["swarm_id"], "initial_peers": doc["hosts"],
            "host_maddrs": [f"/ip4/{ip}/tcp/{lab_swarm.PORT}"], "client_mode": nat}


def start_probe(lab_host: Any, descriptor: Path, args: argparse.Namespace, epoch: float, log: Path) -> subprocess.Popen[Any]:
    chars = 2048  # random letters: about 0.74 compressed bytes each; 4 completions a group
    groups = max(1, round(args.batch_kib * 1024 / (4 * chars * 0.74)))
    cmd = [sys.executable, PROBE, "--seconds", str(args.minutes * 60 + 900), "--publish-every", str(epoch / 8),
           "--stats-every", "30", "--groups", str(groups), "--text-chars", str(chars)]
    for key, value in probe_settings(descriptor, lab_host.ip, lab_host.nat).items():
        cmd += ["--set", f"{key}={json.dumps(value)}"]
    out = open(log, "wb")  # noqa: SIM115 -- kept open by the child
    proc: subprocess.Popen[Any] = lab_host.popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.PIPE,
                                                 env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT)
    return proc


def host_doc(where: Any, url: str) -> dict[str, Any]:
    """The host's ``/api/swarm``, fetched from inside lab host ``where`` (the lab is not routed from here)."""
    code = "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=30).read().decode())"
    done = subprocess.run(where.command(sys.executable, "-c", code, url + "api/swarm?epochs=8"), capture_output=True,
                          text=True, timeout=60, check=True)
    doc: dict[str, Any] = json.loads(done.stdout)
    return doc


def usage(pid: int) -> tuple[float, float, int, int]:
    """CPU seconds and resident bytes of the host process and of its p2pd (its child)."""
    me = psutil.Process(pid)
    kids = [k for k in me.children(recursive=True) if "p2pd" in k.name()]
    cpu = sum(me.cpu_times()[:2])
    p2pd_cpu = sum(sum(k.cpu_times()[:2]) for k in kids)
    return cpu, p2pd_cpu, me.memory_info().rss, sum(k.memory_info().rss for k in kids)


def run(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    epoch = args.epoch_seconds
    load_before = os.getloadavg()
    with NetLab() as lab:
        host_ns = lab.add_host()
        members = [lab.add_host(nat=i % 2 == 1) for i in range(args.members)]
        descriptor, keys = lab_swarm.init_swarm(base, [host_ns.ip], overrides=[f"swarm.epoch_seconds={epoch}"])
        host = lab_swarm.start_host(host_ns.popen, str(descriptor), base / "host", keys[0], *args.overrides)
        lab_swarm.wait_for_text(base / "host.log", "members join with", 180, host)
        url = f"http://{host_ns.ip}:{lab_swarm.API_PORT}/"
        probes = [start_probe(m, descriptor, args, epoch, base / f"member{i}.log") for i, m in enumerate(members)]
        deadline = time.monotonic() + args.join_timeout

        def seen() -> int:
            try:
                return sum(1 for m in host_doc(members[0], url)["members"] if m["announced"] > 0)
            except (subprocess.SubprocessError, ValueError):
                return 0

        while seen() < args.members and time.monotonic() < deadline:
            time.sleep(5)
        joined_after = args.join_timeout - (deadline - time.monotonic())
        time.sleep(args.warmup)
        cpu0, p2pd0, _, _ = usage(host.pid)
        t0 = time.monotonic()
        rss, p2pd_rss = [], []
        while time.monotonic() - t0 < args.minutes * 60:
            _, _, r, pr = usage(host.pid)
            rss.append(r)
            p2pd_rss.append(pr)
            time.sleep(5)
        cpu1, p2pd1, _, _ = usage(host.pid)
        window = time.monotonic() - t0
        doc = host_doc(members[0], url)
        load_during = os.getloadavg()
        for probe in probes:
            if probe.stdin is not None:
                probe.stdin.close()  # a probe stops at the end of its input
        for probe in probes:
            try:
                probe.wait(timeout=60)
            except subprocess.TimeoutExpired:
                probe.kill()
        host.terminate()
        host.wait(timeout=60)
    c = doc["host"]["counters"]
    return {
        "members": args.members, "members_seen": len(doc["members"]), "natted_seen": sum(m["natted"] for m in doc["members"]),
        "joined_after_s": round(joined_after, 1), "window_s": round(window, 1), "batch_kib": args.batch_kib,
        "epoch_seconds": epoch,
        "host_cpu_share": round((cpu1 - cpu0) / window, 4), "p2pd_cpu_share": round((p2pd1 - p2pd0) / window, 4),
        "host_rss_mb_max": round(max(rss) / 2**20, 1), "host_rss_mb_mean": round(sum(rss) / len(rss) / 2**20, 1),
        "p2pd_rss_mb_max": round(max(p2pd_rss) / 2**20, 1),
        "peers_banned": c["peers_banned"], "offences": c["offences"], "rejected": c["batches_rejected"],
        "batches_pulled": c["batches_accepted"], "handoffs_held": c["handoffs_held"],
        "handoffs_refused": c["handoffs_refused"], "bytes_in": c["bytes_in"], "bytes_out": c["bytes_out"],
        "announced_last_8_epochs": sum(m["announced"] for m in doc["members"]),
        "load_before": load_before, "load_during": load_during, "cpus": os.cpu_count(), "exit_code": host.returncode,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--members", type=int, default=16)
    parser.add_argument("--minutes", type=float, default=5.0, help="the measured window")
    parser.add_argument("--batch-kib", type=float, default=64.0, help="each member's batch size")
    parser.add_argument("--epoch-seconds", type=float, default=60.0, help="the swarm's epoch (shared)")
    parser.add_argument("--warmup", type=float, default=60.0, help="seconds after every member was seen")
    parser.add_argument("--join-timeout", type=float, default=600.0)
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="the host's config overrides, e.g. "
                        "swarm.collect_interval=5")
    args = parser.parse_args()
    reason = netns_unavailable_reason()
    if reason is not None:
        print(f"bench_host: {reason}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="bench-host-") as tmp:
        result = run(args, Path(tmp))
    print(f"bench_host: {args.members} members ({args.members // 2} behind NAT), batches of {args.batch_kib:.0f} KiB "
          f"every {args.epoch_seconds / 8:.1f} s each, {result['window_s']:.0f} s window; {result['cpus']} CPUs, "
          f"load average {result['load_before'][0]:.2f} before, {result['load_during'][0]:.2f} during")
    print(f"  members seen          {result['members_seen']} ({result['natted_seen']} behind NAT), all after "
          f"{result['joined_after_s']:.0f} s")
    print(f"  host process          {result['host_cpu_share'] * 100:.2f}% of a core, RSS {result['host_rss_mb_mean']:.1f} MB "
          f"mean, {result['host_rss_mb_max']:.1f} MB max")
    print(f"  its p2pd              {result['p2pd_cpu_share'] * 100:.2f}% of a core, RSS {result['p2pd_rss_mb_max']:.1f} MB max")
    print(f"  bans, offences        {result['peers_banned']} banned, offences {result['offences'] or 'none'}, "
          f"rejected {result['rejected'] or 'none'}")
    print(f"  traffic               {result['batches_pulled']} batches verified, {result['handoffs_held']} hand-offs held "
          f"({result['handoffs_refused']} refused), {result['bytes_in'] / 2**20:.1f} MiB in, "
          f"{result['bytes_out'] / 2**20:.1f} MiB out")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "result": result}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
