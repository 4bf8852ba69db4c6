"""``silo``, ``eval``, ``export``, ``fetch`` and ``doctor`` import no network code: they run where hivemind and
multiaddr cannot be imported (a process where importing either raises), on the tiny model, and ``start``
says in one line that it needs hivemind."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
NETWORK_MODULES = ("hivemind", "multiaddr", "_swarm_node_hivemind_multiaddr", "swarm.transport", "swarm.dht")

SCRIPT = textwrap.dedent("""
    import sys
    if sys.argv[1] == "without-hivemind":
        for name in ("hivemind", "multiaddr"):
            sys.modules[name] = None  # importing either raises ImportError, as where it is not installed
    from node.cli import main
    run = sys.argv[2]
    commands = [
        ["silo", "-c", "configs/tiny-silo.yaml", "--run-dir", run + "/a", "--no-progress", "train.steps=1",
         "tasks.eval_size=4", "sapo.local_groups=2", "generation.group_size=2"],
        ["eval", "--run-dir", run + "/a", "--n", "2", "--json"],
        ["export", run + "/a", "--out", run + "/exported"],
        ["silo", "-c", "configs/tiny-silo.yaml", "--run-dir", run + "/b", "--no-progress", "train.steps=1",
         "tasks.eval_size=4", "sapo.local_groups=2", "generation.group_size=2", "adapter.init_from=" + run + "/a"],
        ["fetch", "smollm2-135m"],
        ["doctor", "--model", "tiny-base", "--no-vllm"],
        ["start", "-c", "configs/tiny-silo.yaml", "--run-dir", run + "/c"],
    ]
    for command in commands[: int(sys.argv[3])]:
        print("exit", command[0], main(command), flush=True)
    loaded = sorted(m for m in sys.modules if m.startswith(NETWORK_MODULES) and sys.modules[m] is not None)
    print("network modules", loaded, flush=True)
""").replace("NETWORK_MODULES", repr(NETWORK_MODULES))


def _run(mode: str, run: Path, n_commands: int) -> list[str]:
    proc = subprocess.run([sys.executable, "-c", SCRIPT, mode, str(run), str(n_commands)], capture_output=True,
                          text=True, cwd=REPO_ROOT, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    return [line for line in proc.stdout.splitlines() if line.startswith(("exit ", "network modules"))]


def test_commands_that_use_no_network_run_without_hivemind(tmp_path: Path, smollm2: Path) -> None:
    lines = _run("without-hivemind", tmp_path, 7)
    assert lines == ["exit silo 0", "exit eval 0", "exit export 0", "exit silo 0", "exit fetch 0", "exit doctor 0",
                     "exit start 2", "network modules []"]


def test_with_hivemind_installed_they_load_none_of_it(tmp_path: Path) -> None:
    assert _run("with-hivemind", tmp_path, 4) == ["exit silo 0", "exit eval 0", "exit export 0", "exit silo 0",
                                                  "network modules []"]
