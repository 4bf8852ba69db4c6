"""``scripts/bench_sapo.py`` and its core: splits (equal compute and on top), the grid and its silo pairs,
the exchange on the real wire path (a tampered batch is rejected), and the end-to-end output (tables, JSON,
plot) with finished runs reused on a rerun."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.scripts import load_script

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def _load(name: str):
    if str(SCRIPTS) not in sys.path:  # bench_sapo imports sapo_lib as a sibling module
        sys.path.insert(0, str(SCRIPTS))
    return load_script(name)


def test_splits_equal_compute_and_on_top():
    lib = _load("sapo_lib")
    assert lib.parse_split("6/2") == (6, 2, False) and lib.generated_groups("6/2") == 8
    assert lib.parse_split("8+4") == (8, 4, True) and lib.generated_groups("8+4") == 8
    assert lib.silo_split("2/6") == lib.silo_split("8+8") == "8/0"
    for bad in ("8", "0/4", "a+b", "4/-1"):
        with pytest.raises(ValueError, match="split"):
            lib.parse_split(bad)
    spec = lib.RunSpec("homogeneous", "topr_corrected", "8+4", 0, nodes=2, steps=3)
    cfg = lib.node_config(spec, 1, "unused")
    assert (cfg.seed, cfg.sapo.local_groups, cfg.sapo.external_groups, cfg.sapo.generated_groups) == (1, 8, 4, 8)
    assert lib.node_type(lib.RunSpec("capability", "silo", "8/0", 0), 3) == "journeyman"


def test_grid_pairs_every_sharing_arm_with_its_silo():
    bench = _load("bench_sapo")
    args = bench.parse_args(["--splits", "8/0", "4/4", "8+4", "--arms", "topr_corrected", "grpo_onpolicy",
                             "--settings", "homogeneous", "--seeds", "2", "--nodes", "2", "--steps", "1"])
    grid = bench.build_grid(args)
    names = {(s.arm, s.split, s.seed_index) for s in grid}
    for seed in (0, 1):
        assert {("silo", "8/0", seed), ("silo_grpo", "8/0", seed)} <= names
        for arm in ("topr_corrected", "grpo_onpolicy"):
            assert {(arm, "4/4", seed), (arm, "8+4", seed)} <= names
    assert len(grid) == 2 * (2 + 4)
    with pytest.raises(SystemExit):
        bench.parse_args(["--splits", "8-4"])


def test_the_benchmarks_exchange_rejects_a_tampered_batch(tmp_path):
    lib = _load("sapo_lib")
    spec = lib.RunSpec("homogeneous", "topr_corrected", "2/2", 0, nodes=2, steps=2, group_size=4, eval_size=8)
    nodes, hub = lib._build_nodes(spec, tmp_path)
    try:
        nodes[0].train_step()
        pending = nodes[1].exchange.transport.pending
        manifest_data, data = pending.popleft()
        pending.append((manifest_data, data[:-1] + bytes([data[-1] ^ 1])))  # one bit flipped on the way
        record = nodes[1].train_step()
        assert record["batches_rejected"] == {"hash_mismatch": 1}
        assert record["batches_accepted"] == 0 and record["n_peer_groups"] == 0
        assert record["ingest_groups_accepted"] == 0
        hub.epoch += 1
        nodes[0].train_step()  # the author is banned for a while: its next batch is refused unread
        assert nodes[1].train_step()["batches_rejected"] == {"hash_mismatch": 1, "banned": 1}
    finally:
        for node in nodes:
            node.close()


def test_main_writes_tables_json_and_plot_and_reuses_finished_runs(tmp_path, capsys):
    bench = _load("bench_sapo")
    out = tmp_path / "out"
    argv = ["--nodes", "2", "--steps", "2", "--seeds", "1", "--splits", "2/2", "--group-size", "4",
            "--settings", "homogeneous", "--arms", "topr_corrected", "--jobs", "1",
            "--set", "tasks.eval_size=8", "--out", str(out)]
    assert bench.main(argv) == 0
    text = capsys.readouterr().out
    assert "4/0" in text and "2/2" in text and "goal homogeneous" in text
    assert "exchange per node step" in text and "last quarter vs silo, homogeneous topr_corrected 2/2: all" in text
    data = json.loads((out / "results.json").read_text())
    assert {(r["arm"], r["split"]) for r in data["rows"]} == {("silo", "4/0"), ("topr_corrected", "2/2")}
    sharing = next(r for r in data["rows"] if r["arm"] == "topr_corrected")
    assert sharing["peer_groups"] > 0 and sharing["cost"]["wire_verify_seconds"] > 0
    assert sharing["paired_seeds"] == 1 and sharing["d_cum"]["all"] is not None
    assert (out / "reward_curves.png").stat().st_size > 0 and "| arm |" in (out / "table.md").read_text()
    assert len(list((out / "runs").glob("*.json"))) == 2
    run = json.loads(next((out / "runs").glob("homogeneous-topr_corrected-*.json")).read_text())
    # Final greedy accuracy of each node on its 8 held-out tasks: a whole number of eighths, logged last.
    assert len(run["accuracy"]) == 2 and all(a * 8 == round(a * 8) for a in run["accuracy"])
    # Node 0 steps first, so its first step has nothing yet; node 1 sees node 0's step-1 batch at once.
    assert run["peer_groups"][0][0] == 0 and run["peer_groups"][1][0] > 0
    assert bench.main(argv) == 0  # a rerun reuses both finished runs
    assert "2 finished runs reused" in capsys.readouterr().out
    # --report runs nothing: a second seed is named as missing, the tables come from the finished seed.
    assert bench.main([*argv, "--seeds", "2", "--report"]) == 0
    text = capsys.readouterr().out
    missing = [line for line in text.splitlines() if "not run (left out of the tables)" in line]
    assert len(missing) == 2 and all(line.endswith("-s1") for line in missing) and "1 seed(s)" in text
    assert len(list((out / "runs").glob("*.json"))) == 2
    assert bench.main([*argv, "--first-seed", "5", "--report"]) == 1  # nothing of this grid has run
