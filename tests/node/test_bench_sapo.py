"""``scripts/bench/bench_sapo.py`` and its core: splits (equal compute and on top), the grid and its silo pairs,
the exchange on the real wire path (a tampered batch is rejected), and the end-to-end output (tables, JSON,
plot) with finished runs reused on a rerun."""

from __future__ import annotations

import json

import pytest

from scripts.lib.sapo import runs as sapo_runs
from tests.scripts import load_script


def _load(name: str):
    if name == "sapo_runs":
        return sapo_runs
    return load_script("bench/bench_sapo")


def test_splits_equal_compute_and_on_top():
    lib = _load("sapo_runs")
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
    lib = _load("sapo_runs")
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
    assert "honest peers paused by the screen, homogeneous topr_corrected 2/2: 0 (same-stage goal: 0)" in text
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
    # --run-only runs that arm's runs and reports the silo's only if it finished (here: in another folder).
    other = tmp_path / "other"
    assert bench.main([*argv[:-1], str(other), "--run-only", "topr_corrected"]) == 0
    text = capsys.readouterr().out
    assert "not run (left out of the tables): homogeneous-silo-4of0" in text
    assert [p.name.split("-x")[0] for p in (other / "runs").glob("*.json")] == ["homogeneous-topr_corrected-2of2"]
    # --baselines pairs a lever's arm (its own --set) with the silo finished without it in another folder.
    lever = [*argv[:-1], str(tmp_path / "lever"), "--run-only", "topr_corrected", "--set", "tasks.eval_size=8",
             "ingest.screen=false", "--baselines", str(out)]
    assert bench.main(lever) == 0
    text = capsys.readouterr().out
    assert "bench_sapo: baseline homogeneous-silo-4of0" in text and "'tasks.eval_size=8'" in text
    rows = json.loads((tmp_path / "lever" / "results.json").read_text())["rows"]
    lever_row = next(r for r in rows if r["arm"] == "topr_corrected")
    assert lever_row["paired_seeds"] == 1 and lever_row["d_cum"]["all"] is not None
    assert bench.main([*lever[:-2], "--report"]) == 0  # without it, no silo: nothing to pair with
    assert "n/a" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        bench.main([*lever[:-1], str(tmp_path / "nowhere")])
    assert exc.value.code == 2 and "--baselines" in capsys.readouterr().err


def test_model_settings_give_each_type_its_config_and_all_nodes_one_task_hash():
    from node.config import load_config
    from node.tasks import build_task_source

    lib = _load("sapo_runs")
    spec = lib.RunSpec("models", "topr_corrected", "4/4", 1, nodes=4, steps=3, eval_size=8)
    cfgs = [lib.node_config(spec, i, "unused") for i in range(4)]
    assert [c.model.name_or_path for c in cfgs] == ["smollm2-135m", "small-base", "small-base", "small-base"]
    smollm2, small = cfgs[0], cfgs[1]
    assert (smollm2.adapter.rank, small.adapter.rank) == (16, 8)  # each model keeps its own config's settings
    assert smollm2.tasks.prompt.examples and small.train.lr == 0.001 and smollm2.train.lr == 0.0002
    assert [c.seed for c in cfgs] == [100, 101, 102, 103]
    assert all(c.tasks.datasets == ["spell_backward", "gcd"] for c in cfgs)
    assert all(c.tasks.dataset_configs == {"spell_backward": {"max_word_len": 5}, "gcd": {"max_value": 50}}
               for c in cfgs)
    assert all((c.sapo.local_groups, c.sapo.external_groups) == (4, 4) for c in cfgs)
    # TYPE:key=value overrides reach the nodes of that type only.
    typed = lib.RunSpec("models", "silo", "8/0", 0, nodes=2, extra=("smollm2:generation.backend=vllm",
                                                                    "generation.max_new_tokens=40"))
    pair = [lib.node_config(typed, i, "unused") for i in range(2)]
    assert [c.generation.backend for c in pair] == ["vllm", "hf"]
    assert [c.generation.max_new_tokens for c in pair] == [40, 40]
    with pytest.raises(SystemExit):
        _load("bench_sapo").parse_args(["--set", "big:generation.backend=vllm"])

    def task_hash(cfg):
        t = cfg.tasks
        return build_task_source(t.source, t.datasets, t.weights, cfg.seed,
                                 **t.source_options(cfg.model.chat_template)).config_hash

    # The setting's dataset settings are every node's, so all draw and verify the same tasks; without the
    # override small-base's config would bring the library's defaults (words of any length, gcd of values up
    # to 1,000) and a hash of its own.
    assert len({task_hash(c) for c in cfgs}) == 1
    plain = load_config(lib.CONFIGS / "small-silo.yaml", ["tasks.datasets=[spell_backward,gcd]"])
    assert task_hash(plain) != task_hash(cfgs[1])


def test_remix_arm_has_the_loras_active_rank_and_is_paired_with_the_silo_at_its_split():
    bench = _load("bench_sapo")
    lib = _load("sapo_runs")
    args = bench.parse_args(["--settings", "smollm2", "--arms", "remix", "--splits", "8/0", "--seeds", "2",
                             "--nodes", "1", "--steps", "2"])
    grid = bench.build_grid(args)
    assert sorted((s.arm, s.split, s.seed_index) for s in grid) == [
        ("remix", "8/0", 0), ("remix", "8/0", 1), ("silo", "8/0", 0), ("silo", "8/0", 1)]
    remix = lib.node_config(next(s for s in grid if s.arm == "remix"), 0, "unused")
    lora = lib.node_config(next(s for s in grid if s.arm == "silo"), 0, "unused")
    assert (lora.adapter.kind, lora.adapter.rank) == ("lora", 16)
    assert (remix.adapter.kind, remix.adapter.rank, remix.adapter.remix.k, remix.adapter.remix.n) == ("remix", 8, 2, 8)
    assert remix.generation.backend == "hf" and remix.adapter.target_modules == lora.adapter.target_modules

    def result(arm, seed, reward, step_seconds):
        spec = lib.RunSpec("smollm2", arm, "8/0", seed, nodes=1, steps=2)
        return {"spec": lib.asdict(spec), "name": spec.name, "node_types": ["smollm2"],
                "rewards": [[reward, reward]], "signal": [[0.5, 0.5]], "peer_groups": [[0, 0]],
                "accuracy": [reward], "rejected": {},
                "cost_per_node_step": {"step_seconds": step_seconds, "exchange_seconds": 0.0}}

    # ReMix 25% and 0% above LoRA on the two seeds: +12.5% on average (t-interval of 2 seeds: 12.706 s / sqrt 2).
    rows = bench.summarize([result("silo", 0, 0.25, 30.0), result("silo", 1, 0.5, 30.0),
                            result("remix", 0, 0.3125, 50.0), result("remix", 1, 0.5, 60.0)])
    row = next(r for r in rows if r["arm"] == "remix")
    assert row["paired_seeds"] == 2 and row["d_cum"]["all"] == (12.5, pytest.approx(12.706 * 12.5))
    goal = [line for line in bench.goals(rows) if "remix" in line]
    assert goal == ["goal smollm2, remix >= +5% reward over LoRA at 8/0: MET -- reward +12.5% ±158.8, accuracy "
                    "+12.5% ±158.8, step time 55.00 s against 30.00 s"]
    assert any("| remix | 8/0 | 2 paired |" in line for line in bench.table_lines(rows, markdown=True))


@pytest.mark.slow
def test_a_smollm2_node_and_a_small_base_node_ingest_each_others_groups(tmp_path, smollm2):
    """The ``models`` setting on the wire path for real, with a tiny batch: each receiver re-tokenizes the
    other model's completions (two tokenizers) and accepts its groups after re-scoring them."""
    lib = _load("sapo_runs")
    spec = lib.RunSpec("models", "topr_corrected", "2/2", 0, nodes=2, steps=2, group_size=2, eval_size=2,
                       extra=("generation.max_new_tokens=8",))
    nodes, hub = lib._build_nodes(spec, tmp_path)
    try:
        assert [n.cfg.model.name_or_path for n in nodes] == ["smollm2-135m", "small-base"]
        nodes[0].train_step()
        small = nodes[1].train_step()  # smollm2's batch of this epoch is already there
        hub.epoch += 1
        big = nodes[0].train_step()  # and small-base's
        for record in (small, big):
            assert record["batches_accepted"] == 1 and record["batches_rejected"] == {}
            assert record["ingest_groups_accepted"] >= 1 and record["ingest_retokenized"] >= 2
    finally:
        for node in nodes:
            node.close()


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_run_that_fails_is_named_and_left_unsaved_while_the_others_finish(tmp_path, capsys, jobs):
    """A run that raises (here a setting no worker knows, as a run killed for memory would) is printed with
    its error; the grid's other runs still finish and are saved, and a rerun retries only the failed one."""
    bench = _load("bench_sapo")
    lib = _load("sapo_runs")
    good = lib.RunSpec("homogeneous", "silo", "2/0", 0, nodes=1, steps=1, group_size=2, eval_size=4)
    bad = lib.RunSpec("no-such-setting", "silo", "2/0", 0, nodes=1, steps=1)
    results = bench.execute([bad, good], jobs, tmp_path)
    text = capsys.readouterr().out
    assert [r["name"] for r in results] == [good.name]
    assert f"run {bad.name} failed: KeyError" in text and "1 run(s) failed" in text
    assert [p.stem for p in (tmp_path / "runs").glob("*.json")] == [good.name]
    assert [r["name"] for r in bench.execute([bad, good], 1, tmp_path)] == [good.name]  # reused; bad tried again
    assert f"run {bad.name} failed" in capsys.readouterr().out


def test_the_learning_rate_arms_double_the_rate_and_pair_remix_with_the_lora_at_that_rate():
    bench = _load("bench_sapo")
    lib = _load("sapo_runs")
    args = bench.parse_args(["--settings", "smollm2", "--arms", "remix", "lora_lr2", "remix_lr2", "--splits", "8/0",
                             "--seeds", "1", "--nodes", "1", "--steps", "2"])
    grid = bench.build_grid(args)
    # lora_lr2 is both an arm and remix_lr2's baseline: it runs once.
    assert sorted(s.arm for s in grid) == ["lora_lr2", "remix", "remix_lr2", "silo"]
    cfgs = {s.arm: lib.node_config(s, 0, "unused") for s in grid}
    assert cfgs["silo"].train.lr == cfgs["remix"].train.lr == 2e-4  # configs/smollm2-silo.yaml's
    assert cfgs["lora_lr2"].train.lr == cfgs["remix_lr2"].train.lr == 4e-4
    assert (cfgs["lora_lr2"].adapter.kind, cfgs["lora_lr2"].adapter.rank) == ("lora", 16)
    assert (cfgs["remix_lr2"].adapter.kind, cfgs["remix_lr2"].adapter.rank) == ("remix", 8)
    assert lib.BASELINE_OF["remix_lr2"] == "lora_lr2" and lib.BASELINE_OF["lora_lr2"] == "silo"

    def result(arm, reward):
        spec = lib.RunSpec("smollm2", arm, "8/0", 0, nodes=1, steps=2)
        return {"spec": lib.asdict(spec), "name": spec.name, "node_types": ["smollm2"],
                "rewards": [[reward, reward]], "signal": [[0.5, 0.5]], "peer_groups": [[0, 0]],
                "accuracy": [reward], "rejected": {},
                "cost_per_node_step": {"step_seconds": 30.0, "exchange_seconds": 0.0}}

    rows = bench.summarize([result("silo", 0.2), result("lora_lr2", 0.3), result("remix_lr2", 0.27)])
    by_arm = {r["arm"]: r for r in rows}
    assert by_arm["lora_lr2"]["d_cum"]["all"][0] == pytest.approx(50.0)  # against the silo
    assert by_arm["remix_lr2"]["d_cum"]["all"][0] == pytest.approx(-10.0)  # against lora_lr2, not the silo
    goals = [line for line in bench.goals(rows) if line.startswith("goal smollm2")]
    assert goals == ["goal smollm2, remix_lr2 >= +5% reward over LoRA (lora_lr2) at 8/0: NOT MET -- reward -10.0%, "
                     "accuracy -10.0%, step time 30.00 s against 30.00 s"]


def test_the_pair_setting_starts_its_strong_nodes_from_the_trained_run_and_names_the_command_if_missing(
        tmp_path, monkeypatch):
    lib = _load("sapo_runs")
    monkeypatch.setattr(lib, "ROOT", tmp_path)
    spec = lib.RunSpec("smollm2-pair", "topr_corrected", "8+4", 0, nodes=4, steps=2)
    with pytest.raises(SystemExit, match="train it first .*: swarm-node silo -c configs/smollm2-silo.yaml --run-dir "
                                         "runs/trained-adapters/smollm2-silo20 "):
        lib.node_config(spec, 0, "unused")
    (tmp_path / "runs" / "trained-adapters" / "smollm2-silo20" / "checkpoints").mkdir(parents=True)
    cfgs = [lib.node_config(spec, i, "unused") for i in range(4)]
    assert [lib.node_type(spec, i) for i in range(4)] == ["smollm2-trained", "smollm2"] * 2
    trained = str(tmp_path / "runs" / "trained-adapters" / "smollm2-silo20")
    assert [c.adapter.init_from for c in cfgs] == [trained, None, trained, None]
    assert {c.model.name_or_path for c in cfgs} == {"smollm2-135m"} and {c.adapter.rank for c in cfgs} == {16}


def test_a_stopped_run_resumes_from_its_checkpoint_and_gives_the_uninterrupted_result(tmp_path, monkeypatch):
    """A silo run stopped after step 3 (its last checkpoint at step 2) and run again resumes at step 2 and
    ends where the run that was never stopped ends: the same rewards, signal and held-out accuracy."""
    lib = _load("sapo_runs")
    spec = lib.RunSpec("homogeneous", "silo", "2/0", 0, nodes=2, steps=4, group_size=4, eval_size=8, eval_every=2)
    whole = lib.run_one(spec, work=tmp_path / "whole", checkpoint_every=2)
    assert [step for step, _ in whole["evals"]] == [2, 4] and whole["accuracy"] == whole["evals"][-1][1]

    from node.run.node import Node

    real_step, calls, stopped = Node.train_step, [], []

    class Stopped(Exception):
        pass

    def stop_at_step_4(self):
        calls.append(self.step)
        if self.step == 3 and not stopped:  # as if the process were stopped during step 4
            stopped.append(True)
            raise Stopped
        return real_step(self)

    monkeypatch.setattr(Node, "train_step", stop_at_step_4)
    work = tmp_path / "stopped"
    with pytest.raises(Stopped):
        lib.run_one(spec, work=work, checkpoint_every=2)
    saved = json.loads((work / "progress.json").read_text())
    assert saved["step"] == 2 and len(saved["rewards"][0]) == 2
    assert len(saved["segments"]) == 1 and len(saved["segments"][0]["load_start"]) == 3
    calls.clear()
    again = lib.run_one(spec, work=work, checkpoint_every=2)
    assert calls == [2, 2, 3, 3]  # both nodes resumed at step 2: steps 3 and 4 only
    for key in ("rewards", "signal", "local_groups", "accuracy", "evals"):
        assert again[key] == whole[key], key
    assert [s["from_step"] for s in again["segments"]] == [0, 2] and again["segments"][1]["to_step"] == 4


def test_a_sharing_run_repeats_bit_for_bit_with_node_ids_drawn_from_the_seeds(tmp_path):
    """Round-robin selection walks peers in the order of their ids: with each node's key drawn from its seed,
    two runs of one spec give every node the same id and the same rewards, and record the groups left unread."""
    lib = _load("sapo_runs")
    spec = lib.RunSpec("homogeneous", "topr_corrected", "2+2", 0, nodes=3, steps=3, group_size=4, eval_size=8,
                       extra=("sapo.selection=round_robin",))
    runs = [lib.run_one(spec, work=tmp_path / name) for name in ("a", "b")]
    keys = [[(tmp_path / name / f"node{i}" / "identity.pem").read_bytes() for i in range(3)] for name in ("a", "b")]
    assert keys[0] == keys[1] and len(set(keys[0])) == 3
    assert runs[0]["rewards"] == runs[1]["rewards"] and runs[0]["peer_groups"] == runs[1]["peer_groups"]
    assert sum(map(sum, runs[0]["peer_groups"])) > 0  # the nodes did train on each other's groups
    assert isinstance(runs[0]["surplus"], dict)


def test_a_seeded_identity_is_written_once_and_a_resumed_run_keeps_its_own(tmp_path):
    lib = _load("sapo_runs")
    path = tmp_path / "node0" / "identity.pem"
    lib.seed_identity(path, 7)
    first = path.read_bytes()
    lib.seed_identity(path, 8)  # a file already there is the node's: never replaced
    assert path.read_bytes() == first
    other = tmp_path / "other.pem"
    lib.seed_identity(other, 8)
    assert other.read_bytes() != first


def test_a_run_keeps_which_nodes_screen_paused_which(tmp_path, monkeypatch):
    """Every node of a bench run is honest: the run keeps each pause by the peer-text screen (step, the node that
    paused, the node paused), once when the pause starts (here every author is paused)."""
    from node.exchange.ingest import Ingestor

    lib = _load("sapo_runs")
    spec = lib.RunSpec("homogeneous", "topr_corrected", "2/2", 0, nodes=2, steps=2, group_size=4, eval_size=8)
    monkeypatch.setattr(Ingestor, "paused", lambda self, peer_id: True)
    run = lib.run_one(spec, work=tmp_path)
    assert sorted(pause[:3] for pause in run["screen_pauses"]) == [[1, 0, 1], [1, 1, 0]]
    assert all(set(pause[3]) >= {"judged", "failed", "dropped", "mean_weight"} for pause in run["screen_pauses"])
    # every step, each pair whose text was judged: how an author's failures grew, paused or not
    assert {tuple(f[:3]) for f in run["screen_figures"]} <= {(s, i, j) for s in (1, 2) for i, j in ((0, 1), (1, 0))}
    assert all(f[3]["judged"] > 0 and "sequence_failed" in f[3] for f in run["screen_figures"])


def test_a_pause_is_kept_when_it_starts_and_again_when_it_starts_anew():
    from types import SimpleNamespace

    from scripts.lib.sapo.progress import pauses_into

    paused: list[set[str]] = [set(), set(), set()]

    def node(i):
        ingestor = SimpleNamespace(paused=lambda peer_id: peer_id in paused[i],
                                   book=SimpleNamespace(verdicts=SimpleNamespace(summary=lambda a: {"judged": 64, "failed": 13})))
        return SimpleNamespace(exchange=SimpleNamespace(identity=SimpleNamespace(peer_id=f"p{i}"), ingestor=ingestor))

    nodes, progress = [node(i) for i in range(3)], {"step": 0}
    for step, now in enumerate([set(), {"p2", "p0"}, {"p2"}, set(), {"p2"}], start=1):
        paused[0] = now  # node 0's screen; its own id is never a peer of its own
        progress["step"] = step
        pauses_into(progress, nodes)
    figures = {"judged": 64, "failed": 13}
    assert progress["screen_pauses"] == [[2, 0, 2, figures], [5, 0, 2, figures]]
    assert progress["screen_paused_now"] == [[0, 2]]
    assert len(progress["screen_figures"]) == 5 * 6  # every judged pair (all of them here), every step
