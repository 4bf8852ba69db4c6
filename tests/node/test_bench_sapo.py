"""Smoke test of ``scripts/bench_sapo.py``: its core runs 2 tiny nodes x 2 steps, peers' groups arrive and are
trained on, and the table, goals, JSON and plot come out."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def _load(name: str):
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_two_nodes_share_and_train_on_peer_groups():
    lib = _load("sapo_lib")
    spec = lib.RunSpec(setting="heterogeneous", family="topr_corrected", local_groups=2, external_groups=2,
                       seed_index=0, nodes=2, steps=2, group_size=4, eval_size=8)
    res = lib.run_one(spec)
    assert len(res["rewards"]) == 2 and all(len(r) == 2 for r in res["rewards"])
    # Final greedy accuracy of each node on its 8 held-out tasks: a whole number of eighths, logged last.
    assert len(res["accuracy"]) == 2 and all(a * 8 == round(a * 8) for a in res["accuracy"])
    # Node 0 steps first, so its first step has nothing yet; node 1 sees node 0's step-1 batch at once.
    assert sum(res["peer_groups"][1]) > 0
    cfg0, cfg1 = (lib.node_config(spec, i, "unused") for i in range(2))
    assert (cfg0.seed, cfg1.seed) == (0, 1)
    assert cfg0.tasks.weights != cfg1.tasks.weights  # heterogeneous mixtures
    assert cfg0.sapo.generated_groups == 4  # equal generation compute: I + J


def test_main_writes_table_json_and_plot(tmp_path, capsys):
    bench = _load("bench_sapo")
    out = tmp_path / "out"
    assert bench.main(["--nodes", "2", "--steps", "2", "--seeds", "1", "--splits", "2/2", "--group-size", "4",
                       "--settings", "homogeneous", "--families", "topr_corrected", "--jobs", "1",
                       "--set", "tasks.eval_size=8", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "4/0" in text and "2/2" in text and "goal homogeneous" in text
    data = json.loads((out / "results.json").read_text())
    assert {r["split"] for r in data["rows"]} == {"4/0", "2/2"}
    assert (out / "reward_curves.png").stat().st_size > 0
