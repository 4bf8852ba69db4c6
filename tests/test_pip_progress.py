"""``scripts/dev/pip_progress.sh``: a long install shows where it stands (what is installed, that it takes
minutes, each package on a terminal, a line every tenth elsewhere) without printing pip's every line, lets
pip's errors through and keeps its exit status."""

from __future__ import annotations

import os
import pty
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = [f"pkg{i}" for i in range(25)]


def _fake_pip(tmp_path: Path, status: int = 0) -> Path:
    """A stand-in for pip that prints what ``pip install`` prints into a pipe (and one warning on stderr)."""
    lines = ["Looking in indexes: https://pypi.org/simple", "Obtaining file:///src/swarm-node"]
    for name in PACKAGES[1:]:
        lines += [f"Collecting {name}>=1.0", f"  Downloading {name}-1.0-py3-none-any.whl (12.3 MB)",
                  f"Requirement already satisfied: other in ./lib (from {name})"]
    lines += [f"Installing collected packages: {', '.join(PACKAGES)}",
              "Successfully installed " + " ".join(f"{n}-1.0" for n in PACKAGES)]
    script = tmp_path / "fake-pip"
    body = "".join(f"echo '{line}'\n" for line in lines)
    script.write_text(f"#!/bin/bash\n{body}echo 'WARNING: a warning of pip' >&2\nexit {status}\n")
    script.chmod(0o755)
    return script


def _run(tmp_path: Path, status: int = 0) -> subprocess.CompletedProcess[str]:
    command = (f"set -euo pipefail; source scripts/dev/pip_progress.sh; pip_progress 'the project' "
               f"{_fake_pip(tmp_path, status)}; echo after")
    return subprocess.run(["bash", "-c", command], cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_a_log_gets_a_line_every_tenth_package_and_what_is_installed(tmp_path):
    proc = _run(tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == ("installing the project: this takes minutes on a fresh machine (pip downloads and unpacks "
                        "each package)")
    assert lines[1:6] == ["  [1] obtaining file:///src/swarm-node", "  [11] collecting pkg10>=1.0",
                          "  [21] collecting pkg20>=1.0", "  unpacking and installing 25 packages",
                          "  done: 25 packages installed"]
    assert lines[6].startswith("installed the project in ") and lines[7:] == ["after"]
    assert proc.stderr == "WARNING: a warning of pip\n"  # pip's own warnings and errors are not filtered


def test_a_failed_install_keeps_its_status_and_stops_the_script(tmp_path):
    proc = _run(tmp_path, status=1)
    assert proc.returncode == 1 and "after" not in proc.stdout and "installed the project in" not in proc.stdout


def test_a_terminal_gets_one_line_rewritten_in_place(tmp_path):
    controller, terminal = pty.openpty()
    command = f"source scripts/dev/pip_progress.sh; pip_progress 'the project' {_fake_pip(tmp_path)}"
    proc = subprocess.Popen(["bash", "-c", command], cwd=ROOT, stdout=terminal, stderr=subprocess.DEVNULL,
                            env={**os.environ, "COLUMNS": "60"})
    os.close(terminal)
    output = b""
    while True:
        try:
            chunk = os.read(controller, 4096)
        except OSError:  # the other side closed
            break
        if not chunk:
            break
        output += chunk
    os.close(controller)
    assert proc.wait(timeout=60) == 0
    text = output.decode().replace("\r\n", "\n")
    assert len([line for line in text.split("\n") if line]) == 3  # the header, the status line, the summary
    statuses = [part.split("\n")[0] for part in text.split("\r\x1b[K")[1:]]
    assert len(statuses) >= 50  # every package and download, each shown in place of the one before
    assert "  [25] downloading pkg24-1.0-py3-none-any.whl (12.3 MB)" in statuses
    assert all(len(status) <= 59 for status in statuses)  # cut to the terminal's width: no wrapped lines
