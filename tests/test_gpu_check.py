"""``scripts/gpu_check.sh`` and its bundle (``scripts/dev/gpu_bundle.py``), as far as a machine without a GPU
can try them: the bundle's packing into bounded parts that join back byte for byte, the script's syntax, and
its one-line answer on a Python without torch."""

from __future__ import annotations

import hashlib
import os
import re
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
        if os.environ.get("SWARM_NODE_REQUIRE_SHELLCHECK"):  # set by .ci/run, whose ci_deps.sh installs it
            raise AssertionError("shellcheck is required here (SWARM_NODE_REQUIRE_SHELLCHECK) but not installed")
        pytest.skip("shellcheck is not installed")
    proc = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_every_step_has_a_time_limit_and_the_gpu_marked_tests_all_run():
    """Each ``step NAME LIMIT ...`` of the script names a limit in seconds (``step`` runs it under
    ``timeout``); a ``gpu-tests`` step runs ``-m gpu`` over the folder that holds every gpu-marked test, on
    either device (caught: a gpu test added elsewhere, which the step would never run)."""
    text = SCRIPT.read_text()
    steps = re.findall(r"^\s*step\s+(\S+)\s+(\S+)", text, re.M)
    assert len(steps) >= 10 and all(limit.isdigit() and 0 < int(limit) <= 300 for _, limit in steps), steps
    runs = re.findall(r"^\s*step gpu-tests \d+ .* -m gpu (\S+)", text, re.M)
    assert len(runs) == 2 and set(runs) == {"tests/node"}, runs  # the CUDA branch and the CPU's
    mark = re.compile(r"@pytest\.mark\.gpu\b|marks=\[?pytest\.mark\.gpu\b|pytestmark = .*\bgpu\b")
    marked = {p for p in (ROOT / "tests").rglob("test_*.py") if mark.search(p.read_text())}
    assert {p.name for p in marked} >= {"test_fused_families.py", "test_generation_static.py",
                                         "test_special_tokens.py"}
    assert all(ROOT / runs[0] in p.parents for p in marked), sorted(map(str, marked))


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


def _swarm_module():
    sys.path.insert(0, str(ROOT / "scripts" / "dev"))
    try:
        import gpu_swarm
    finally:
        sys.path.remove(str(ROOT / "scripts" / "dev"))
    return gpu_swarm


def test_the_swarms_tokens_per_second_count_the_window_in_which_every_node_ran():
    """Node a steps at t = 10, 11, 12, 13 and b at 11.5, 12.5, 14: all ran from 11.5 (b's first step) to 13
    (a's last), 1.5 s, in which a finished its steps at 12 and 13 (100 tokens each, 40 generated) and b its
    step at 12.5 (300, 90): 200/1.5 and 300/1.5 tokens/s, 500/1.5 in all."""
    def step(t, tokens, generated):
        return {"time": t, "tokens_per_s": tokens / 2, "step_seconds": 2.0, "gen_tokens_per_s": generated,
                "gen_seconds": 1.0}

    rows = {"a": [step(10, 100, 40), step(11, 100, 40), step(12, 100, 40), step(13, 100, 40)],
            "b": [step(11.5, 300, 90), step(12.5, 300, 90), step(14, 300, 90)]}
    t = _swarm_module().throughput(rows)
    assert t["window_s"] == pytest.approx(1.5)
    assert t["nodes"]["a"]["tokens_per_s"] == pytest.approx(200 / 1.5)
    assert t["nodes"]["b"]["tokens_per_s"] == pytest.approx(300 / 1.5)
    assert t["tokens_per_s"] == pytest.approx(500 / 1.5) and t["gen_tokens_per_s"] == pytest.approx(170 / 1.5)
    assert _swarm_module().throughput({"a": rows["a"], "b": []})["tokens_per_s"] == 0.0


def test_the_swarm_passes_only_when_every_node_took_its_steps_and_accepted_both_others():
    gpu_swarm = _swarm_module()
    nodes = [{"node": n, "exit_code": 0, "steps": 5} for n in "abc"]
    pairs = [{"receiver": r, "author": a, "groups_accepted": 3} for r in "abc" for a in "abc" if a != r]
    assert gpu_swarm.passed({"steps_asked": 5, "nodes": nodes, "pairs": pairs})
    assert not gpu_swarm.passed({"steps_asked": 6, "nodes": nodes, "pairs": pairs})
    pairs[-1]["groups_accepted"] = 0
    assert not gpu_swarm.passed({"steps_asked": 5, "nodes": nodes, "pairs": pairs})


@pytest.mark.slow
def test_on_the_cpu_the_swarm_script_runs_three_nodes_of_two_tokenizers_that_accept_each_others_groups(tmp_path):
    """``scripts/dev/gpu_swarm.py --device cpu``: two tiny-base nodes and a small-base node, each its own
    process with its own p2pd, until each took 3 steps and accepted groups of both others."""
    out = tmp_path / "swarm"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "dev" / "gpu_swarm.py"), "--device", "cpu",
                           "--steps", "3", "--seconds", "600", "--out", str(out), "--json", str(tmp_path / "s.json")],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    import json
    summary = json.loads((tmp_path / "s.json").read_text())
    assert [n["node"] for n in summary["nodes"]] == ["tiny-a", "tiny-b", "small"]
    assert all(n["steps"] >= 3 and n["exit_code"] == 0 for n in summary["nodes"])
    assert len(summary["pairs"]) == 6 and all(r["groups_accepted"] > 0 for r in summary["pairs"])
    assert summary["throughput"]["tokens_per_s"] > 0
    assert "gpu_swarm: pass" in proc.stdout
