"""``scripts/lab/scaling_model.py`` (hand-worked costs, the sharded configuration's flat cost, the step limit) and
``scripts/lab/sim_swarm.py`` (a small swarm on lan links delivers everything, at the model's traffic)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]

scaling_model = load_script("lab/scaling_model")
Params, Swarm, per_node = scaling_model.Params, scaling_model.Swarm, scaling_model.per_node


def test_a_poll_at_four_nodes_costs_what_the_formula_says_by_hand() -> None:
    p = Params()
    r = per_node(Swarm(nodes=4, polls_per_second=2.0), p)
    # 4 authors x 8 batches x 1.5 epochs = 48 manifests; 3 replicas besides the reader (4 nodes, 5 replicas);
    # 8 keys, 2 a find request, 3 nodes visited: 12 finds, each naming 2 neighbours for each of its 2 keys.
    values = 3 * 48 * p.manifest_entry
    overhead = 12 * (p.find_base + 2 * 2 * p.neighbour_entry)
    assert r["poll_bytes"] == pytest.approx(values + overhead)
    assert r["dht_down"] == pytest.approx(2.0 * (values + overhead))
    assert r["finds_per_s"] == pytest.approx(24.0)
    # 3 other authors' 8 batches of 64 KiB a minute pulled; as many served to the 3 readers of ours.
    assert r["pull_down"] == pytest.approx(3 * 8 * 65536 / 60)
    assert r["pull_up"] == pytest.approx(r["pull_down"])
    assert r["stores_per_s"] == pytest.approx(8 / 60 * (4 - 1))


def test_sharding_keeps_a_nodes_cost_flat_and_reading_everything_does_not() -> None:
    def cost(n: int, **cfg: float) -> dict[str, float]:
        return per_node(Swarm(nodes=n, collect_interval=2.0, lookup_seconds=0.5, downlink=10e6, **cfg))

    sharded = [cost(n, shards=n // 25, read_shards=2) for n in (1000, 10000)]
    for key in ("dht_down", "pull_down", "pull_up", "replica_up", "cpu"):
        assert sharded[1][key] == pytest.approx(sharded[0][key], rel=0.02), key
    flat = [cost(n, shards=4) for n in (100, 1000)]
    assert flat[1]["pull_down"] > 9 * flat[0]["pull_down"]
    assert flat[1]["pull_slots_busy"] > 8 > sharded[1]["pull_slots_busy"]


def test_the_step_limit_is_the_first_cpu_limit_and_the_links_are_separate() -> None:
    limits = scaling_model.saturation({"shards": 4, "read_shards": 0, "collect_interval": 2.0}, 64, 2.5e6, 0.10)
    cpu = next(n for label, n in limits if label.startswith("CPU"))
    assert cpu is not None and 10 < cpu < 50
    assert scaling_model.largest(limits, cpu=True) == f"N={cpu - 1}"
    others = [n for label, n in limits if not label.startswith("CPU") and n is not None]
    assert scaling_model.largest(limits, cpu=False) == f"N={min(others) - 1}"
    unbounded = scaling_model.saturation({"read_shards": 1, "collect_interval": 2.0}, 64, 2.5e6, 0.5)
    assert scaling_model.largest(unbounded, cpu=True) == "every N up to 100,000"


def test_the_simulation_delivers_a_small_lan_swarm_at_the_models_pull_traffic() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "lab" / "sim_swarm.py"), "--nodes", "4", "--mix", "lan:1",
                          "--epochs", "4", "--json"], capture_output=True, text=True, timeout=120, check=True)
    lan = json.loads(out.stdout)["profiles"]["lan"]
    assert lan["delivered"] == 1.0
    assert lan["latency_p99"] < 10.0
    assert lan["pull_down"] == pytest.approx(per_node(Swarm(nodes=4))["pull_down"], rel=0.1)
