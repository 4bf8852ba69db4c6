"""A host and two members on one machine, with docs/swarm.md's commands as written: how soon is each connected?

    sudo .venv/bin/python scripts/lab/one_machine.py [--json OUT]

One namespace of the lab (``scripts/lib/netlab/netns.py``) is the machine; ``host.example.org`` resolves to it.
The commands of "Host a swarm" run there (``swarm init``, ``swarm-node host``), then both members start at
once: the first with "Join a swarm"'s command, the second with it and the documented ``--run-dir
runs/public2 api.port=8771``. A poller in the namespace asks each member's status API (127.0.0.1:8770 and
:8771) every half second. Reported, in seconds from the members' start: when each API answered (the model
loaded and the network side started: the node prints ``ready after N s``), when each said ``connected``,
and when each had accepted a peer batch (``batches_accepted`` in ``metrics.jsonl``). Needs root.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from scripts.lib.netlab import swarm as lab_swarm  # noqa: E402
from scripts.lib.netlab.netns import NetLab, netns_unavailable_reason  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SECOND = "--run-dir runs/public2 api.port=8771"  # docs/swarm.md, "Join a swarm": a second member on one machine

POLL = """
import json, sys, time, urllib.request
until = time.time() + float(sys.argv[1])
seen = {}
while time.time() < until and len(seen) < 4:
    for port in (8770, 8771):
        try:
            doc = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status", timeout=2).read())
        except Exception:
            continue
        seen.setdefault(f"{port}:api", time.time())
        if doc.get("network", {}).get("connected"):
            seen.setdefault(f"{port}:connected", time.time())
    time.sleep(0.5)
print(json.dumps(seen))
"""


def doc_commands(heading: str) -> list[list[str]]:
    """The commands of the first bash block under ``## heading`` in docs/swarm.md, run with this Python."""
    page = (ROOT / "docs" / "swarm.md").read_text()
    block = page[page.index(f"## {heading}\n"):].split("```bash\n", 1)[1].split("```", 1)[0]
    commands = []
    for line in block.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if words:
            assert words[0] == "swarm-node", words
            commands.append(lab_swarm.cli(*words[1:]))
    return commands


def accepted_at(run_dir: Path) -> float | None:
    path = run_dir / "metrics.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        row = json.loads(line)
        if row.get("batches_accepted", 0) > 0:
            return float(row["time"]) if "time" in row else time.time()
    return None


def run(base: Path, timeout: float) -> dict[str, Any]:
    init, host_cmd, _verify = doc_commands("Host a swarm")
    join = doc_commands("Join a swarm")[0]
    lab = NetLab()
    procs: list[subprocess.Popen[Any]] = []
    try:
        machine = lab.add_host()
        here = base / "machine"
        here.mkdir()
        (here / "configs").symlink_to(ROOT / "configs")
        env = lab_swarm.process_env(here)
        with lab_swarm.names_resolved([machine], {"host.example.org": machine.ip}):
            subprocess.run(init, cwd=here, env=env, check=True, timeout=120, capture_output=True)
            host = machine.popen(host_cmd, cwd=here, env=env, stdout=open(base / "host.log", "wb"),  # noqa: SIM115
                                 stderr=subprocess.STDOUT)
            procs.append(host)
            lab_swarm.wait_for_text(base / "host.log", "members join with", 120, host)
            started = time.time()
            poller = machine.popen([sys.executable, "-c", POLL, str(timeout)], stdout=subprocess.PIPE, cwd=here)
            members = {}
            for name, command in (("public", join), ("public2", [*join, *shlex.split(SECOND)])):
                members[name] = machine.popen(command, cwd=here, env=env, stdout=open(base / f"{name}.log", "wb"),  # noqa: SIM115
                                              stderr=subprocess.STDOUT)
                procs.append(members[name])
            out, _ = poller.communicate(timeout=timeout + 60)
            seen = json.loads(out)
            deadline = time.time() + timeout
            accepted: dict[str, float | None] = {}
            while time.time() < deadline and len(accepted) < 2:
                for name in members:
                    if name not in accepted and (at := accepted_at(here / "runs" / name)) is not None:
                        accepted[name] = at
                time.sleep(1)
            for proc in members.values():
                proc.send_signal(signal.SIGTERM)
            for proc in members.values():
                proc.wait(timeout=120)
            host.send_signal(signal.SIGTERM)
            host.wait(timeout=60)
        ready = {}
        for name in members:
            found = re.search(r"ready after (\d+) s", (base / f"{name}.log").read_text())
            ready[name] = int(found.group(1)) if found else None
        rel = lambda t: None if t is None else round(t - started, 1)  # noqa: E731
        return {
            name: {"ready_after_s": ready[name], "api_s": rel(seen.get(f"{port}:api")),
                   "connected_s": rel(seen.get(f"{port}:connected")), "accepted_s": rel(accepted.get(name))}
            for name, port in (("public", 8770), ("public2", 8771))
        }
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        lab.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    reason = netns_unavailable_reason()
    if reason is not None:
        print(f"one_machine: {reason}", file=sys.stderr)
        return 2
    before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="one-machine-") as tmp:
        result = run(Path(tmp), args.timeout)
    result["load_average"] = {"before": before, "after": os.getloadavg()}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    print(f"a host and two members on one machine, docs/swarm.md's commands; load average {before[0]:.1f} before, "
          f"{result['load_average']['after'][0]:.1f} after; seconds from the members' start:")
    for name in ("public", "public2"):
        r = result[name]
        print(f"  runs/{name}: ready (model and network side) {r['ready_after_s']}, status API {r['api_s']}, "
              f"connected {r['connected_s']}, first peer batch accepted {r['accepted_s']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
