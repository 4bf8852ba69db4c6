"""``scripts/experiments/sharing_regime.py``: runs read from a bench_sapo folder (finished and in progress),
each sharing run paired with its silo of the same seed, and the window table worked out by hand."""

from __future__ import annotations

import json

from tests.scripts import load_script


def _regime():
    return load_script("experiments/sharing_regime")


def _run(arm: str, split: str, seed: int, signal: list[list[float]], rewards: list[list[float]],
         peers: list[list[float]]) -> dict:
    name = f"small-{arm}-{split.replace('/', 'of').replace('+', 'plus')}-s{seed}"
    spec = {"setting": "small", "arm": arm, "split": split, "seed_index": seed}
    return {"name": name, "spec": spec, "signal": signal, "rewards": rewards, "peer_groups": peers,
            "local_groups": signal, "accuracy": [0.5] * len(signal)}


def test_the_window_table_averages_nodes_then_steps_and_marks_unfinished_windows(tmp_path):
    regime = _regime()
    (tmp_path / "runs").mkdir()
    silo = _run("silo", "8/0", 0, [[1.0, 0.5, 0.25, 0.25], [0.5, 0.5, 0.25, 0.75]],
                [[0.0, 0.5, 1.0, 1.0], [0.5, 0.5, 0.0, 1.0]], [[0.0] * 4, [0.0] * 4])
    share = _run("topr_fill", "8+8", 0, [[1.0, 1.0, 0.5], [0.0, 0.5, 0.5]],
                 [[0.5, 0.5, 1.0], [0.5, 0.5, 0.0]], [[1.0, 2.0, 4.0], [3.0, 2.0, 0.0]])
    for run in (silo, share):
        (tmp_path / "runs" / f"{run['name']}.json").write_text(json.dumps(run))
    runs = regime.load([tmp_path])
    assert sorted(runs) == [silo["name"], share["name"]]
    (paired, its_silo), = regime.pairs(runs)
    assert paired["name"] == share["name"] and its_silo["name"] == silo["name"]
    assert len(its_silo["rewards"][0]) == 3  # cut to the steps both have
    rows = regime.table(runs, 2)
    assert rows[0] == "| run: curve | 1-2 | 3-4 |"
    # silo signal: node means 0.75, 0.5, 0.25, 0.5 -> windows 0.625 and 0.375; the silo has no peer row
    assert rows[2:] == [
        "| small-silo-8of0-s0: own groups with signal | 0.62 | 0.38 |",
        "| small-silo-8of0-s0: sampled reward | 0.38 | 0.75 |",
        "| small-topr_fill-8plus8-s0: own groups with signal | 0.62 | - |",
        "| small-topr_fill-8plus8-s0: sampled reward | 0.50 | - |",
        "| small-topr_fill-8plus8-s0: peer groups a node-step | 2.00 | - |",
    ]
