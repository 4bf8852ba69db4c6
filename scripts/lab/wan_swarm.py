"""A swarm of real nodes over emulated wide-area links, beside a loopback run, in one invocation.

    sudo .venv/bin/python scripts/lab/wan_swarm.py --nodes 8 --scenarios silo,loopback,lan,intercontinental,bad-home,mix

Each scenario starts N ``swarm-node start`` processes (tiny-base, ``configs/public-swarm.yaml`` and the shared
settings of ``configs/swarm-shared.yaml``, as a public swarm's descriptor gives them, with small
per-step settings: 16 groups of 4 completions generated a step, 8 own and up to 8 peer groups trained on,
against 16 own in silo; every node its own Python and p2pd) and lets them train and exchange:

* ``loopback``: all on 127.0.0.1, no namespaces (the figures of docs/results/local-swarm.md);
* ``silo``: the same N processes as ``swarm-node silo``: the step time with no network at all;
* a profile (``lan``, ``continental``, ``intercontinental``, ``bad-home``): every node in its own
  network namespace of the lab (``scripts/lib/netlab/netns.py``), its link emulated (``scripts/lab/linkem.py``:
  delay, jitter, loss, rate limit); ``bad-home`` nodes sit behind the lab's NAT router in client mode,
  handing their batches to the 2 public nodes (``continental``) the scenario adds for them;
* ``mix``: the profiles in turn (node 0 ``continental``, then lan, intercontinental, bad-home, ...);
* or a comma list of profiles joined by ``+`` (``continental+bad-home+bad-home``).

``--hosts K`` forms the swarm as docs/swarm.md does instead: the owner signs a descriptor
(``configs/swarm-shared.yaml``, the scenario's epoch) for K model-less hosts (``swarm-node host``, on the
scenario's first public profile), and every node starts with ``swarm-node start --swarm URL`` (host 0's
URL) and only its own settings; nobody bootstraps from node 0. Its "1st-acc" column is then the time
from ``swarm-node start --swarm`` to the first accepted peer batch.

``--kind probe`` runs ``scripts/lab/swarm_probe.py`` instead of real nodes: the same transport and settings
(the ``swarm:`` section of the config and the overrides), no model, publishing an incompressible batch of
``--batch-kib`` every ``epoch_seconds / 8`` (the rate a fast node publishes at): pulls of the size a real
model's batch has (tiny-base's batches are about 3 KB), without the CPU of N models.

Nodes pace their steps to ``--step-seconds`` (the step's own time, then a sleep: a node whose accelerator
does the work leaves its CPU to the network side), so N nodes fit on a small machine and the figures are
about the network. Node 0 bootstraps the others. Once every node has joined (or after ``--join-timeout``),
``--warmup`` seconds pass, then the measurement window (``--window``) and two epochs of grace, so every
batch of the window has two epochs to arrive. Per scenario it prints, from each node's trace
(``swarm.trace_path``) and metrics: time to join and to the first accepted peer batch; the share of the
others' window batches each node accepted within two epochs (and at all); publish-to-accepted latency
p50/p99 over every (batch, receiver) pair; pull time and throughput; rejections, offences and bans by
reason (an honest node must never be banned); DHT poll time-outs and mean poll time; hand-offs; the
median step time; bytes each node sent and received (the emulator's counters) and the CPU seconds of
nodes, p2pd and emulator. The machine's load average is printed with every scenario.

Every process is stopped and every namespace removed at the end of a scenario, failed or not (the lab's
``close``); loopback nodes get SIGTERM, then SIGKILL, and a ``ps`` check. ``--json PATH`` saves all
figures. Needs root for the namespaces (loopback and silo do not).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import yaml

from scripts.lib.netlab.netns import PROBE, PROFILES, Host, NetLab, netns_unavailable_reason  # noqa: E402
from scripts.lib.netlab.processes import p2pd_of, stop_all, watchdogs_of  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PORT = 31337
MEMBER_CONFIG = "configs/public-swarm.yaml"
SHARED_CONFIG = "configs/swarm-shared.yaml"
NODE_SETTINGS = [
    "api.port=null",  # configs/public-swarm.yaml serves one on 8770: nodes sharing 127.0.0.1 would collide
    "train.steps=1000000000",  # bounded by time
    "train.checkpoint_every=1000000",
    "train.eval_every=1000000",
    "tasks.eval_size=16",
    "sapo.generated_groups=16",
    "generation.group_size=4",
    "swarm.trace_path=trace.jsonl",
]
# Equal compute (SAPO's I/J split): every node generates 16 groups a step and trains on 16, its own 8 and up
# to 8 of its peers' in a swarm, 16 of its own in silo; so the step times compare what the swarm costs.
SWARM_SETTINGS = ["sapo.local_groups=8", "sapo.external_groups=8"]
SILO_SETTINGS = ["sapo.local_groups=16", "sapo.external_groups=0"]
MIX = ["continental", "lan", "intercontinental", "bad-home"]
HOLDER = "continental"  # the public nodes a scenario of NATed nodes adds for them to hand off to


def layout(scenario: str, n: int) -> list[str] | None:
    """Each node's profile for a scenario (None for loopback and silo: no lab)."""
    if scenario in ("loopback", "silo"):
        return None
    if scenario == "mix":
        return [MIX[i % len(MIX)] for i in range(n)]
    if "+" in scenario:
        names = scenario.split("+")
    elif scenario in PROFILES and PROFILES[scenario].nat:
        names = [HOLDER, HOLDER] + [scenario] * (n - 2)
    else:
        names = [scenario] * n
    unknown = [p for p in names if p not in PROFILES]
    if unknown:
        raise SystemExit(f"unknown profile(s) {unknown}; known: {', '.join(PROFILES)}, loopback, silo, mix")
    if PROFILES[names[0]].nat:
        raise SystemExit(f"{scenario}: node 0 bootstraps the swarm and cannot be behind NAT")
    return names


@dataclass
class NodeRun:
    index: int
    profile: str
    nat: bool
    run_dir: Path
    proc: subprocess.Popen[Any]
    started: float
    host: Host | None = None
    kind: str = "node"
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.run_dir.parent / f"node{self.index}.log"

    def _probe_events(self, kind: str) -> list[dict[str, Any]]:
        events = []
        for line in (self.log.read_text(errors="replace") if self.log.exists() else "").splitlines():
            if line.startswith("{"):
                with contextlib.suppress(json.JSONDecodeError):
                    event = json.loads(line)
                    if event.get("ev") == kind:
                        events.append(event)
        return events

    def peer_id(self) -> str | None:
        if self.kind == "probe":
            up = self._probe_events("up")
            return str(up[0]["peer"]) if up else None
        m = re.search(r"swarm-node: peer id (\S+)", self.log.read_text(errors="replace"))
        return m.group(1) if m else None

    def address(self, timeout: float) -> str:
        """The multiaddr this node printed for others (its namespace's address when it has one): the daemon's
        ``--initial-peers`` line, or the network side's log line once it listens (the daemon prints its
        address only if it had one within a few seconds of starting)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log.read_text(errors="replace") if self.log.exists() else ""
            m = re.search(r"(?:--initial-peers |others can join with: )(/\S+(?:[ ,]/\S+)*)", text)
            up = self._probe_events("up") if self.kind == "probe" else []
            if m or up:
                maddrs = [str(a) for a in up[0]["maddrs"]] if up else re.split(r"[ ,]", m.group(1))  # type: ignore[union-attr]
                wanted = [a for a in maddrs if self.host is None or f"/{self.host.ip}/" in a]
                return (wanted or maddrs)[0]
            if self.proc.poll() is not None:
                raise RuntimeError(f"node{self.index} exited ({self.proc.returncode}); see {self.log}")
            time.sleep(0.5)
        raise RuntimeError(f"node{self.index} printed no address in {timeout:.0f} s; see {self.log}")

    def trace(self) -> list[dict[str, Any]]:
        path = self.run_dir / "trace.jsonl"
        events = []
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    events.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
        return events

    def metrics(self) -> list[dict[str, Any]]:
        """Metrics rows (a probe's: its periodic transport stats, as rows with ``time``)."""
        if self.kind == "probe":
            return [{"time": e["t"], **e["stats"]} for e in self._probe_events("stats")]
        path = self.run_dir / "metrics.jsonl"
        rows = []
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
        return rows

    def cpu_seconds(self) -> tuple[float, float]:
        """CPU seconds of the node (with its children but p2pd) and of its p2pd, while it runs."""
        try:
            me = psutil.Process(self.proc.pid)
            kids = me.children(recursive=True)
            node = sum(me.cpu_times()[:2])
            daemon = sum(sum(k.cpu_times()[:2]) for k in kids if "p2pd" in k.name())
            others = sum(sum(k.cpu_times()[:2]) for k in kids if "p2pd" not in k.name())
            return node + others, daemon
        except psutil.Error:
            return 0.0, 0.0


def _merge(into: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    for key, value in top.items():
        into[key] = _merge(dict(into.get(key) or {}), value) if isinstance(value, dict) else value
    return into


def public_config(base: Path) -> Path:
    """A public swarm member's config as the swarm's descriptor completes it: the member's own settings
    (``configs/public-swarm.yaml``) with the shared ones (``configs/swarm-shared.yaml``) and tiny-base."""
    merged = _merge(yaml.safe_load((ROOT / MEMBER_CONFIG).read_text()), yaml.safe_load((ROOT / SHARED_CONFIG).read_text()))
    merged = _merge(merged, {"model": {"name_or_path": "tiny-base"}, "swarm": {"swarm_id": "tiny-public",
                                                                                "p2p_identity_path": None}})
    base.mkdir(parents=True, exist_ok=True)
    path = base / "public-swarm.yaml"
    path.write_text(yaml.safe_dump(merged, sort_keys=False))
    return path


def node_command(args: argparse.Namespace, mode: str, i: int, run_dir: Path, settings: list[str]) -> list[str]:
    head = [sys.executable, os.path.abspath(__file__), "node", "--step-seconds", str(args.step_seconds), "--"]
    if args.swarm_url is not None:  # from the descriptor: the member's own settings only, its seed its identity's
        return [*head, mode, "--swarm", args.swarm_url, "-c", MEMBER_CONFIG, "--run-dir", str(run_dir),
                "--no-progress", *NODE_SETTINGS, *SWARM_SETTINGS, "swarm.p2p_identity_path=null", *settings,
                *args.overrides]
    return [*head, mode, "-c", str(args.config), "--run-dir", str(run_dir), "--no-progress", f"seed={i}",
            *NODE_SETTINGS, *(SILO_SETTINGS if mode == "silo" else SWARM_SETTINGS),
            f"swarm.epoch_seconds={args.epoch_seconds}", *settings, *args.overrides]


def probe_command(args: argparse.Namespace, run_dir: Path, settings: list[str], initial: list[str]) -> list[str]:
    """A ``swarm_probe.py`` with the config's ``swarm:`` section, the swarm overrides and ``settings``."""
    values: dict[str, Any] = dict((yaml.safe_load(Path(args.config).read_text()) or {}).get("swarm") or {})
    for item in [f"swarm.epoch_seconds={args.epoch_seconds}", *settings, *args.overrides]:
        key, _, raw = item.partition("=")
        if key.startswith("swarm."):
            values[key[len("swarm."):]] = yaml.safe_load(raw)
    values.update(trace_path=str(run_dir / "trace.jsonl"), initial_peers=initial)
    values.pop("p2p_identity_path", None)
    chars = 2048  # random letters: about 0.74 compressed bytes each; 4 completions a group
    groups = max(1, round(args.batch_kib * 1024 / (4 * chars * 0.74)))
    cmd = [sys.executable, PROBE, "--seconds", "86400", "--publish-every", str(args.epoch_seconds / 8),
           "--stats-every", "5", "--groups", str(groups), "--text-chars", str(chars)]
    for key, value in values.items():
        cmd += ["--set", f"{key}={json.dumps(value)}"]
    return cmd


def start_node(args: argparse.Namespace, base: Path, i: int, profile: str, host: Host | None,
               initial: list[str], mode: str = "start") -> NodeRun:
    run_dir = base / f"node{i}"
    run_dir.mkdir(parents=True, exist_ok=True)
    nat = host is not None and host.nat
    ip = host.ip if host is not None else "127.0.0.1"
    port = PORT if host is not None else 0
    settings = [f"swarm.host_maddrs=[/ip4/{ip}/tcp/{port}]", f"swarm.client_mode={'true' if nat else 'false'}"]
    if args.kind == "probe":
        cmd = probe_command(args, run_dir, settings, initial)
    else:
        cmd = node_command(args, mode, i, run_dir, settings if mode == "start" else [])
        if initial and mode == "start":
            cmd += ["--initial-peers", ",".join(initial)]
    log = open(base / f"node{i}.log", "wb")  # noqa: SIM115 -- kept open by the child
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT),
           "SWARM_NODE_KNOWN_SWARMS": str(run_dir / "known_swarms")}
    kwargs: dict[str, Any] = dict(cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    if args.kind == "probe":
        kwargs["stdin"] = subprocess.PIPE  # a probe stops at the end of its input
    started = time.time()
    proc = host.popen(cmd, **kwargs) if host is not None else subprocess.Popen(cmd, **kwargs)
    return NodeRun(i, profile, nat, run_dir, proc, started, host, kind=args.kind)


def start_hosts(args: argparse.Namespace, base: Path, profile: str, lab: NetLab) -> list[subprocess.Popen[Any]]:
    """``--hosts K``: K model-less hosts on ``profile`` links and the descriptor they serve; sets
    ``args.swarm_url`` (host 0's URL of it)."""
    from scripts.lib.netlab.swarm import API_PORT, init_swarm, start_host, wait_for_text  # noqa: PLC0415

    hosts = [lab.add_host(link=PROFILES[profile]) for _ in range(args.hosts)]
    descriptor, keys = init_swarm(base / "swarm", [h.ip for h in hosts],
                                  overrides=[f"swarm.epoch_seconds={args.epoch_seconds}"])
    procs = [start_host(h.popen, str(descriptor), base / f"host{i}", keys[i]) for i, h in enumerate(hosts)]
    for i, proc in enumerate(procs):
        wait_for_text(base / f"host{i}.log", "members join with", args.join_timeout, proc)
    args.swarm_url = f"http://{hosts[0].ip}:{API_PORT}/swarm.yaml"
    return procs


def start_swarm(args: argparse.Namespace, base: Path, profiles: list[str] | None, lab: NetLab | None,
                mode: str) -> list[NodeRun]:
    n = args.nodes
    names = profiles or ["loopback"] * n
    hosts: list[Host | None] = [lab.add_host(link=PROFILES[p]) for p in names] if lab is not None else [None] * n
    if args.swarm_url is not None and mode == "start":  # every node joins from the descriptor, at once
        return [start_node(args, base, i, names[i], hosts[i], [], mode) for i in range(n)]
    nodes = [start_node(args, base, 0, names[0], hosts[0], [], mode)]
    if mode != "start":
        return nodes + [start_node(args, base, i, names[i], hosts[i], [], mode) for i in range(1, n)]
    boot = nodes[0].address(args.join_timeout)
    public = [i for i in range(1, n) if not (hosts[i] is not None and hosts[i].nat)]  # type: ignore[union-attr]
    natted = [i for i in range(1, n) if i not in public]
    nodes += [start_node(args, base, i, names[i], hosts[i], [boot]) for i in public]
    if natted:
        holders = [boot] + [node.address(args.join_timeout) for node in nodes[1:3]]
        nodes += [start_node(args, base, i, names[i], hosts[i], holders) for i in natted]
    nodes.sort(key=lambda node: node.index)
    return nodes


def wait_joined(nodes: list[NodeRun], timeout: float) -> float:
    """Wait until every node traced ``up`` (or ``timeout``); returns the wall time then."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(any(e["ev"] == "up" for e in node.trace()) for node in nodes):
            break
        dead = [node.index for node in nodes if node.proc.poll() is not None]
        if dead:
            raise RuntimeError(f"nodes {dead} exited during start-up; see their logs")
        time.sleep(1.0)
    return time.time()


def stop_nodes(nodes: list[NodeRun], timeout: float) -> list[int]:
    """SIGTERM every node (their sessions), SIGKILL stragglers; pids of processes of ours left."""
    procs = [node.proc for node in nodes]
    daemons = {p for proc in procs for p in p2pd_of(proc.pid)}
    left = stop_all(procs, timeout)
    return left + watchdogs_of(daemons)


def run_scenario(args: argparse.Namespace, scenario: str, base: Path) -> dict[str, Any]:
    profiles = layout(scenario, args.nodes)
    mode = "silo" if scenario == "silo" else "start"
    load_before = os.getloadavg()
    lab = NetLab() if profiles is not None else None
    nodes: list[NodeRun] = []
    left: list[int] = []
    args.swarm_url = None
    try:
        if args.hosts and lab is not None and profiles is not None and mode == "start":
            start_hosts(args, base, next(p for p in profiles if not PROFILES[p].nat), lab)
        nodes = start_swarm(args, base, profiles, lab, mode)
        joined = wait_joined(nodes, args.join_timeout) if mode == "start" else time.time()
        t0 = joined + args.warmup
        t1 = t0 + args.window
        sleep_until(t0)
        links0 = lab.link_stats() if lab is not None else {}
        cpu0 = [node.cpu_seconds() for node in nodes]
        sleep_until(t1)
        links1 = lab.link_stats() if lab is not None else {}
        cpu1 = [node.cpu_seconds() for node in nodes]
        if mode == "start":
            sleep_until(t1 + 2 * args.epoch_seconds + 5)
        load_during = os.getloadavg()
    finally:
        if nodes and lab is None:
            left = stop_nodes(nodes, args.stop_timeout)
        elif nodes:
            for node in nodes:
                if node.proc.poll() is None:
                    node.proc.send_signal(signal.SIGTERM)
            for node in nodes:
                try:
                    node.proc.wait(timeout=args.stop_timeout)
                except subprocess.TimeoutExpired:
                    node.proc.kill()
        if lab is not None:
            lab.close()
    from scripts.lib.netlab.wan_report import analyse  # noqa: PLC0415 -- the analysis is only needed here

    result = analyse(scenario, nodes, t0=t0, t1=t1, epoch=args.epoch_seconds, links=(links0, links1),
                     cpu=(cpu0, cpu1))
    result.update(load_before=load_before, load_during=load_during, left_behind=left,
                  exit_codes=[node.proc.returncode for node in nodes])
    return result


def sleep_until(t: float) -> None:
    while time.time() < t:
        time.sleep(min(1.0, max(0.0, t - time.time())))


def node_main(argv: list[str]) -> int:
    """``wan_swarm.py node --step-seconds S -- <swarm-node args>``: a node whose steps take at least S."""
    parser = argparse.ArgumentParser(prog="wan_swarm.py node")
    parser.add_argument("--step-seconds", type=float, default=0.0)
    parser.add_argument("rest", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
    from node.cli import main  # noqa: PLC0415
    from node.run import node as runner  # noqa: PLC0415 -- torch is imported only in node processes

    original = runner.Node.train_step
    pace = args.step_seconds

    def paced(self: Any) -> dict[str, Any]:
        started = time.monotonic()
        record = original(self)
        rest_s = pace - (time.monotonic() - started)
        while rest_s > 0 and not self.stop_requested:
            time.sleep(min(rest_s, 0.5))
            rest_s = pace - (time.monotonic() - started)
        return record

    runner.Node.train_step = paced  # type: ignore[method-assign]
    return main(rest)


def main() -> int:
    if sys.argv[1:2] == ["node"]:
        return node_main(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--kind", choices=("node", "probe"), default="node",
                        help="real swarm-node processes (tiny-base), or transport-only probes (see above)")
    parser.add_argument("--batch-kib", type=float, default=256.0, help="probes: the size of each batch")
    parser.add_argument("--scenarios", default="silo,loopback,lan,continental,intercontinental,bad-home,mix")
    parser.add_argument("--epoch-seconds", type=float, default=60.0, help="swarm.epoch_seconds of every node")
    parser.add_argument("--step-seconds", type=float, default=2.0, help="each node's step is padded to this")
    parser.add_argument("--warmup", type=float, default=30.0, help="seconds after every node joined")
    parser.add_argument("--window", type=float, default=120.0, help="seconds of batches that are measured")
    parser.add_argument("--join-timeout", type=float, default=240.0)
    parser.add_argument("--stop-timeout", type=float, default=60.0)
    parser.add_argument("--hosts", type=int, default=0, help="form the swarm from a signed descriptor with this many "
                        "model-less hosts (lab scenarios only): every node starts with --swarm URL")
    parser.add_argument("--base", default=None, help="run dirs (default: a temporary folder, removed)")
    parser.add_argument("--json", default=None, help="write every figure here")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides for every node")
    args = parser.parse_args()
    scenarios = args.scenarios.split(",")
    if args.nodes < 2:
        parser.error("--nodes must be >= 2")
    if args.kind == "probe" and "silo" in scenarios:
        parser.error("--kind probe has no silo scenario (probes have no model)")
    for scenario in scenarios:
        profiles = layout(scenario, args.nodes)
        if profiles is not None and (reason := netns_unavailable_reason()) is not None:
            print(f"cannot run {scenario}: {reason}", file=sys.stderr)
            return 1
    from scripts.lib.netlab.wan_report import print_result  # noqa: PLC0415

    what = f"probes, batches of {args.batch_kib:.0f} KiB" if args.kind == "probe" else f"nodes, steps paced to {args.step_seconds} s"
    print(f"wan_swarm: {args.nodes} {what}, epoch {args.epoch_seconds:.0f} s, "
          f"window {args.window:.0f} s; {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f}", flush=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="wan-swarm-") as tmp:
        root = Path(args.base or tmp)
        args.config = public_config(root)
        for scenario in scenarios:
            try:
                result = run_scenario(args, scenario, root / scenario)
            except RuntimeError as exc:  # a node died or never came up: say so, go on with the next scenario
                result = {"scenario": scenario, "error": str(exc), "left_behind": []}
            results.append(result)
            print_result(result, args.epoch_seconds)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=1, default=str))
    bad = [r["scenario"] for r in results if r["left_behind"]]
    if bad:
        print(f"processes left behind in {bad}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
