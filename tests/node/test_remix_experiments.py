"""``scripts/experiments/remix_mix.py`` and ``remix_swarm.py`` run end to end at toy size (tiny-base and
small-base, two steps), so their long runs are known to start, log what their reports read, and report."""

from __future__ import annotations

import json
import math
import tarfile
from pathlib import Path

import pytest
import torch

from tests.scripts import load_script


def test_dataset_specialisation_by_hand():
    mix = load_script("experiments/remix_mix")
    # One layer, two LoRAs: dataset a always takes LoRA 0, b always LoRA 1: each is all of the entropy.
    assert mix.dataset_specialisation({"a": [[4, 0]], "b": [[0, 4]]}) == {"a": 1.0, "b": 1.0}
    # Routed alike: nothing sets either apart.
    assert mix.dataset_specialisation({"a": [[2, 2]], "b": [[1, 1]]}) == {"a": 0.0, "b": 0.0}
    # a: 3 of 4 on LoRA 0, b: 1 of 4 -> marginal (1/2, 1/2); KL(a) = 3/4 ln 3/2 + 1/4 ln 1/2.
    out = mix.dataset_specialisation({"a": [[3, 1]], "b": [[1, 3]]})
    want = (0.75 * math.log(1.5) + 0.25 * math.log(0.5)) / math.log(2)
    assert math.isclose(out["a"], want) and math.isclose(out["b"], want)


def test_remix_mix_runs_reports_and_plots(tmp_path, capsys):
    mix = load_script("experiments/remix_mix")
    out = tmp_path / "runs"
    for arm in ("remix", "lora16"):
        assert mix.main(["run", arm, "--lr", "0.001", "--steps", "2", "--eval-every", "1", "--out", str(out),
                         "--config", "configs/tiny-silo.yaml", "--extra", "tasks.eval_size=8",
                         "sapo.local_groups=4"]) == 0
    rows = [json.loads(line) for line in (out / "remix-lr0.001-s0" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "eval_by_dataset" in r] == [1, 2]
    assert {"routing_usage", "routing_balance", "routing_specialisation"} <= set(rows[-1])
    capsys.readouterr()
    assert mix.main(["report", "--out", str(out), "--pick", "remix=0.001", "lora16=0.001", "--sweep-step", "2",
                     "--plots", str(tmp_path / "plots")]) == 0
    text = capsys.readouterr().out
    assert "| remix-lr0.001-s0 | 2 |" in text and "| lora16-lr0.001-s0 | 2 |" in text
    assert "seed 0, step 2: all " in text and "remix specialisation add" in text
    assert {p.name for p in (tmp_path / "plots").iterdir()} == {"remix_mix_eval.png", "remix_mix_routing.png"}


def test_remix_swarm_runs_and_reports(tmp_path, capsys):
    swarm = load_script("experiments/remix_swarm")
    out = tmp_path / "runs"
    for focus, peers in (("remix", "1"), ("remix", "0")):
        assert swarm.main(["run", "--focus", focus, "--peers", peers, "--steps", "2", "--eval-every", "2",
                           "--eval-size", "8", "--out", str(out), "--extra", "adapter.remix.centre=true"]) == 0
    result = json.loads((out / "remix-p1-s0.json").read_text())
    assert [e["step"] for e in result["evals"]] == [2]
    assert {"calendar_arithmetic", "propositional_logic", "all"} <= set(result["evals"][0])
    assert result["peer_groups"][0] == 0 and result["peer_groups"][1] > 0  # peers' step-1 groups, taken at 2
    assert result["specialisation"] and {"adapter.kind=remix", "adapter.remix.centre=true"} <= set(result["config"])
    capsys.readouterr()
    assert swarm.main(["report", "--out", str(out)]) == 0
    assert "remix seed 0: own " in capsys.readouterr().out


def test_grid_parses_arms_rates_and_seeds_and_refuses_a_bad_entry_with_exit_2(capsys):
    mix = load_script("experiments/remix_mix")
    assert mix.grid_specs(["remix=4e-4,8e-4", "lora16=2e-4"], [0, 1]) == [
        ("remix", 4e-4, 0), ("remix", 4e-4, 1), ("remix", 8e-4, 0), ("remix", 8e-4, 1),
        ("lora16", 2e-4, 0), ("lora16", 2e-4, 1)]
    for bad in ("remixx=1e-3", "remix", "remix=fast"):
        with pytest.raises(SystemExit) as stop:
            mix.grid_specs([bad], [0])
        assert stop.value.code == 2 and "--runs" in capsys.readouterr().err


def test_grid_runs_side_by_side_packs_as_it_goes_and_stops_at_its_deadline(tmp_path, capsys):
    mix = load_script("experiments/remix_mix")
    common = ["--seeds", "0", "--eval-every", "1", "--every", "1", "--config", "configs/tiny-silo.yaml",
              "--extra", "tasks.eval_size=8", "sapo.local_groups=4"]
    out, packed = tmp_path / "runs", tmp_path / "runs.tgz"
    assert mix.main(["grid", "--runs", "remix=0.001", "lora16=0.001", "--steps", "1", "--out", str(out),
                     "--pack", str(packed), *common]) == 0
    with tarfile.open(packed) as tar:
        names = set(tar.getnames())
        rows = [json.loads(line) for line in tar.extractfile("remix-lr0.001-s0/metrics.jsonl").read().splitlines()]
    assert {"remix-lr0.001-s0/config.yaml", "lora16-lr0.001-s0/metrics.jsonl", "lora16-lr0.001-s0/run.log"} <= names
    assert rows[-1]["step"] == 1 and "routing_usage" in rows[-1]
    assert "remix-lr0.001-s0:step 1 lora16-lr0.001-s0:step 1" in capsys.readouterr().out
    # A run far longer than its deadline: stopped (exit 3), named, and its process group gone.
    assert mix.main(["grid", "--runs", "lora16=0.002", "--steps", "100000", "--deadline", "2", "--out", str(out),
                     "--pack", str(packed), *common]) == 3
    assert "stopped at the deadline (2 s): lora16-lr0.002-s0 (step " in capsys.readouterr().out
    with tarfile.open(packed) as tar:
        assert "lora16-lr0.002-s0/run.log" in tar.getnames()
    assert not [cmd for cmd in map(_cmdline, Path("/proc").glob("[0-9]*/cmdline")) if "lora16-lr0.002-s0" in cmd]


def _cmdline(path: Path) -> str:
    try:
        return path.read_bytes().decode(errors="replace")
    except OSError:  # the process ended while we looked
        return ""


def test_probe_routing_measures_by_hand_and_runs_at_toy_size(tmp_path, capsys):
    probe = load_script("experiments/probe_routing")
    same = torch.tensor([[1.0, 2.0], [1.0, 2.0]])
    assert probe.common_share(same) == pytest.approx(1.0)
    assert probe.common_share(torch.tensor([[1.0, 0.0], [-1.0, 0.0]])) == pytest.approx(0.0)
    # Rows (0, 0), (2, 0) of dataset a and (0, 2), (0, 4) of b: mean (0.5, 1.5), the rows 2.5, 4.5, 0.5 and
    # 6.5 from it (squared): 14 in all; the datasets' means (1, 0) and (0, 3) 2.5 each: between 4 * 2.5 = 10.
    x = torch.tensor([[0.0, 0.0], [2.0, 0.0], [0.0, 2.0], [0.0, 4.0]])
    assert probe.dataset_r2(x, ["a", "a", "b", "b"]) == pytest.approx(10 / 14)
    assert probe.dataset_r2(x, ["a", "b", "a", "b"]) < probe.dataset_r2(x, ["a", "a", "b", "b"])
    assert probe.same_pair_share(same.repeat(3, 1), n=8, k=2, routers=3) == 1.0  # identical inputs: one pair
    out = tmp_path / "probe.json"
    assert probe.main(["-c", "configs/tiny-silo.yaml", "--per-dataset", "3", "--routers", "2", "--threads", "1",
                       "--json", str(out), "tasks.datasets=[add,sub]"]) == 0
    result = json.loads(out.read_text())
    assert result["datasets"] == {"add": 3, "sub": 3} and 0 < result["task_token_share"] <= 1
    assert set(result["layers"]) == {"prompt", "no-first", "task"} and len(result["layers"]["prompt"]) == 2
    assert "| prompt | same_pair | " in capsys.readouterr().out
