"""``scripts/gpu_check.sh`` and its bundle (``scripts/dev/gpu_bundle.py``), as far as a machine without a GPU
can try them: the bundle's packing into bounded parts that join back byte for byte, the script's syntax, and
its one-line answer on a Python without torch."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def _bundle_module():
    return load_script("dev/gpu_bundle")


def test_the_bundle_packs_files_into_bounded_parts_that_join_back(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    sizes = {"big.whl": 2500, "a.whl": 700, "b.tar.gz": 300, "c.whl": 900, "d.whl": 50}
    for i, (name, size) in enumerate(sizes.items()):
        (src / name).write_bytes(bytes((i + k) % 251 for k in range(size)))
    parts = _bundle_module().pack(sorted(src.iterdir()), tmp_path / "out", 1000)
    assert all(sum(f.stat().st_size for f in p.iterdir()) <= 1000 for p in parts)
    assert len(parts) == 5  # 4450 bytes: big.whl cut in 1000, 1000, 500, the rest fitted around them
    found = {f.name: f for p in parts for f in p.iterdir()}
    assert sorted(n for n in found if n.startswith("big.whl.part")) == ["big.whl.part0", "big.whl.part1",
                                                                       "big.whl.part2"]
    joined = b"".join(found[f"big.whl.part{i}"].read_bytes() for i in range(3))
    assert hashlib.sha256(joined).digest() == hashlib.sha256((src / "big.whl").read_bytes()).digest()
    assert all(found[n].read_bytes() == (src / n).read_bytes() for n in sizes if n != "big.whl")


def test_the_script_parses_and_passes_shellcheck_where_it_is_installed():
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed")
    proc = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_without_torch_it_says_in_one_line_what_to_install(tmp_path):
    """This interpreter, with torch, transformers and peft made unimportable (a package of each name first on
    its path, whose import fails), as on a bare machine: so the test runs wherever the tests do."""
    hidden = tmp_path / "hidden"
    for name in ("torch", "transformers", "peft"):
        (hidden / name).mkdir(parents=True)
        (hidden / name / "__init__.py").write_text(f"raise ImportError('no {name} on this machine')\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "PYTHONPATH": str(hidden),
           "GPU_CHECK_OUT": str(tmp_path / "out")}
    assert subprocess.run([sys.executable, "-c", "import torch"], env=env, capture_output=True).returncode == 1
    proc = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_check: install first: torch transformers peft"), lines


def test_a_package_that_a_dependency_pins_is_bundled_even_where_a_cuda_image_holds_it():
    # reasoning-gym pins tabulate==0.9.0; a CUDA image has another tabulate, and the offline install then
    # found no tabulate 0.9.0 (the first bundle tried on an H100)
    bundle = _bundle_module()
    assert "tabulate" in bundle.IMAGE and "tabulate" in bundle.pinned(bundle.closure(["swarm-node"]))
    assert "tabulate" in bundle.wanted() and "aiohttp" not in bundle.wanted()
