"""A swarm node's SAPO behaviour on the tiny model: paired random streams (a silo node and a swarm node with
one seed draw the same tasks), peers' held-out tasks rejected at ingestion, the selection streams and
signal history checkpointed, dataset preferences from the node's own signal rates."""

from __future__ import annotations

import dataclasses

import pytest

from node.run.node import Node
from protocol.codec import decode_batch, encode_batch, encode_manifest, make_manifest
from swarm.memory import InMemoryHub
from tests.node.conftest import make_config


def _node(run_dir, hub=None, *overrides):
    # Generous ingestion time budgets: these tests are about selection, and a loaded machine reads slowly.
    cfg = make_config(str(run_dir), "train.steps=100", "train.eval_every=100", "tasks.datasets=[add,sub]",
                      "ingest.max_seconds_per_step=600", "ingest.max_seconds_per_peer_step=600", *overrides)
    node = Node(cfg, show_progress=False, transport=hub.join if hub is not None else None)
    node.setup()
    return node


def _record_tasks(node):
    """Wrap the node's task sampling to record the refs of every step."""
    drawn = []
    sample = node.source.sample

    def recording(n, rng):
        refs = sample(n, rng)
        drawn.append(refs)
        return refs

    node.source.sample = recording
    return drawn


def test_silo_and_swarm_nodes_with_one_seed_draw_the_same_tasks(tmp_path):
    hub = InMemoryHub()
    silo = _node(tmp_path / "silo", None, "sapo.generated_groups=4")
    shared = _node(tmp_path / "a", hub, "sapo.local_groups=2", "sapo.external_groups=2",
                   "sapo.generated_groups=4")
    peer = _node(tmp_path / "b", hub, "seed=1", "sapo.local_groups=2", "sapo.external_groups=2",
                 "sapo.generated_groups=4")
    streams = {name: _record_tasks(n) for name, n in (("silo", silo), ("shared", shared))}
    select_state = shared.select_rng.getstate()
    peer_groups = 0
    for _ in range(2):
        peer.train_step()
        peer_groups += shared.train_step()["n_peer_groups"]
        silo.train_step()
        hub.epoch += 1
    for node in (silo, shared, peer):
        node.close()
    assert peer_groups > 0 and shared.select_rng.getstate() != select_state  # peers' groups were picked
    assert streams["shared"] == streams["silo"] and len(streams["silo"]) == 2


def test_held_out_refs_from_a_peer_are_rejected_and_counted(tmp_path):
    """A peer (another seed) sends groups whose tasks are in the held-out split: a property of the problem,
    so held out here too. They are verified, then rejected at ingestion, never trained on."""
    hub = InMemoryHub()
    mine = _node(tmp_path / "mine", hub, "sapo.external_groups=4")
    peer = _node(tmp_path / "peer", hub, "seed=1", "sapo.external_groups=4")
    peer.train_step()  # publishes a batch of ordinary training tasks
    (manifest_data, data), = mine.exchange.transport.pending
    batch = decode_batch(data)
    held = peer.source.eval_refs(2)  # held-out problems, named with the peer's seed and indices
    forged_groups = tuple(
        dataclasses.replace(g, task=ref, rollouts=tuple(dataclasses.replace(r, task=ref) for r in g.rollouts))
        for g, ref in zip(batch.groups, held))
    forged = dataclasses.replace(batch, seq=batch.seq + 1, groups=forged_groups)
    identity = peer.exchange.identity
    forged_data = encode_batch(forged, identity)
    forged_manifest = encode_manifest(make_manifest(forged, forged_data, forged.created_at + 60), identity)
    hub.announce(peer.exchange.transport, forged_manifest, forged_data)  # signed by the peer: passes intake
    groups = mine.exchange.receive(1)
    assert all(mine.source.is_held_out(mine.source.task(ref)) for ref in held)
    assert mine.exchange.ingestor.rejected["held_out"] == 2
    assert {g.key for g in groups}.isdisjoint({ref.key() for ref in held})
    assert len(groups) == len(batch.groups)  # the honest batch's
    assert mine.exchange.metrics()["ingest_rejected"] == {"held_out": 2}
    mine.close()
    peer.close()


def test_selection_stream_and_signal_history_survive_a_checkpoint(tmp_path):
    hub = InMemoryHub()
    node = _node(tmp_path / "n", hub, "sapo.external_groups=2", "sapo.dataset_preference=low_signal",
                 "sapo.signal_window=4")
    node.step = 2
    node._signal_history.extend([{"add": [3, 1]}, {"add": [1, 1], "sub": [3, 0]}])
    node.select_rng.random()  # move the stream so a fresh seed would not match
    rates = node.signal_rates()
    assert rates == {"add": 0.5, "sub": 0.0}
    node.save_checkpoint()
    state = node.select_rng.getstate()
    node.close()
    again = _node(tmp_path / "n", InMemoryHub(), "sapo.external_groups=2", "sapo.dataset_preference=low_signal",
                  "sapo.signal_window=4")
    assert again.step == 2 and again.select_rng.getstate() == state and again.signal_rates() == rates
    again.close()


def test_the_screens_profile_and_verdicts_survive_a_checkpoint(tmp_path):
    """A paused author stays paused across a restart, one on probation or on trial stays so, and the own profile's
    bounds hold at once (mutation: the screen left out of the checkpoint frees "x" and empties the profile, whose
    floors then wait for 64 own completions again)."""
    settings = ("ingest.screen_pause_window=8", "ingest.screen_pause_share=0.5", "ingest.screen_trial=3")
    node = _node(tmp_path / "n", InMemoryHub(), *settings)
    book = node.exchange.ingestor.book
    book.profile.observe("add", [[-0.5, -1.0, -2.0]] * 70)
    book.record({"x": _counts(judged=4, failed=4), "y": _counts(judged=2, failed=0)}, 5)
    node.step = 5
    before = (book.profile.span_floor(), book.profile.max_length("add"), book.profile.sequence_floors(),
              {a: book.verdicts.summary(a) for a in ("x", "y")})
    assert before[0] is not None and book.verdicts.paused("x") and book.verdicts.summary("y")["trial"] == 1
    node.save_checkpoint()
    node.close()
    again = _node(tmp_path / "n", InMemoryHub(), *settings)
    book = again.exchange.ingestor.book
    assert (book.profile.span_floor(), book.profile.max_length("add"), book.profile.sequence_floors(),
            {a: book.verdicts.summary(a) for a in ("x", "y")}) == before
    assert again.exchange.paused("x") and book.verdicts.paused_until("x") == 5 + 32
    assert book.verdicts.trusted() == frozenset()
    book.record({"y": _counts(judged=1, failed=0)}, 6)
    assert book.verdicts.trusted() == {"y"}
    again.close()


def _counts(judged, failed):
    """A step's screen counts of one author (``node.train.peer_rows.COUNTS``): ``judged`` rows, ``failed`` of them."""
    from node.train.peer_rows import COUNTS

    values = dict.fromkeys(COUNTS, 0.0) | {"rows": judged, "judged": judged, "failed": failed, "dropped": failed}
    return [values[k] for k in COUNTS]


def test_signal_rates_count_own_groups_by_dataset_over_the_window(tmp_path):
    node = _node(tmp_path / "n", None, "sapo.signal_window=2", "sapo.dataset_preference=both",
                 "tasks.weights=[0.8,0.2]")
    node._signal_history.extend([{"add": [4, 1]}, {"add": [2, 2], "sub": [2, 0]}, {"add": [4, 4]}])
    # Window 2: the first step is forgotten. add: (2 + 4) of (2 + 4) with signal; sub: 0 of 2.
    assert node.signal_rates() == {"add": 1.0, "sub": 0.0}
    assert node.success_rates() == {}  # entries of checkpoints written before mean rewards were kept
    weights = node._dataset_weights(["add", "sub", "mul"])
    assert weights == pytest.approx({"add": 0.1, "sub": 0.25, "mul": 0.0})  # mixture x max(0.1, 1 - rate)
    node.close()


def test_a_peer_group_of_a_dataset_of_weight_zero_is_not_selected(tmp_path):
    hub = InMemoryHub()
    mine = _node(tmp_path / "mine", hub, "tasks.weights=[0.0,1.0]", "sapo.external_groups=8",
                 "sapo.dataset_preference=own_mixture")
    peer = _node(tmp_path / "peer", hub, "seed=3", "tasks.weights=[0.5,0.5]", "sapo.external_groups=8",
                 "sapo.local_groups=8")
    peer.train_step()
    picked = mine._select_external(0)
    pool = mine._external_pool
    mine.close()
    peer.close()
    # J = 8 has room for every add group with signal, but add has weight 0 here: ingested (it is one of
    # the node's datasets), left in the pool, never trained on.
    assert all(g.dataset == "sub" for g in picked)
    assert pool and all(g.dataset == "add" for g in pool)


def test_success_rates_average_the_own_groups_mean_rewards_by_dataset_over_the_window(tmp_path):
    node = _node(tmp_path / "n", None, "sapo.signal_window=2", "sapo.peer_filter=above_own")
    node._signal_history.extend([{"add": [4, 1, 3.0]}, {"add": [2, 2, 0.5], "sub": [2, 0, 0.0]},
                                 {"add": [2, 1, 1.5], "sub": [1, 1, 0.25]}])
    # Window 2: add (0.5 + 1.5) / (2 + 2) groups; sub (0 + 0.25) / (2 + 1).
    assert node.success_rates() == pytest.approx({"add": 0.5, "sub": 0.25 / 3})
    node.close()


def test_with_the_peer_filter_a_node_trains_only_on_peer_groups_that_beat_its_own_rate(tmp_path):
    hub = InMemoryHub()
    mine = _node(tmp_path / "mine", hub, "sapo.external_groups=8", "sapo.peer_filter=above_own")
    peer = _node(tmp_path / "peer", hub, "seed=3", "sapo.external_groups=8", "sapo.local_groups=8")
    peer.train_step()
    mine._signal_history.append({"add": [1, 1, 0.4], "sub": [1, 1, 1.0]})  # sub: nothing can beat 1.0
    picked = mine._select_external(0)
    pool = list(mine._external_pool)
    mine.close()
    peer.close()
    assert picked and all(g.dataset == "add" and sum(g.rewards) / len(g.rewards) > 0.4 for g in picked)
    assert any(g.dataset == "sub" for g in pool)  # ingested, kept in the pool, never picked


def test_with_flat_slots_peer_groups_fill_only_the_steps_flat_own_groups(tmp_path):
    hub = InMemoryHub()
    mine = _node(tmp_path / "mine", hub, "sapo.external_groups=4", "sapo.peer_slots=flat")
    peer = _node(tmp_path / "peer", hub, "seed=3", "sapo.external_groups=4", "sapo.local_groups=8")
    steps = []  # (own flat groups, peer groups in the pool before the pick, peer groups trained on)
    for _ in range(4):
        peer.train_step()
        r = mine.train_step()
        flat = round(4 * (1 - r["local_signal_fraction"]))
        assert r["n_local_groups"] == 4 - flat  # every own group with signal is trained on
        steps.append((flat, len(mine._external_pool) + r["n_peer_groups"], r["n_peer_groups"]))
        hub.epoch += 1
    mine.close()
    peer.close()
    # 4 own groups generated a step: as many peer groups as flat own ones (J = 4 caps them) where the pool
    # holds enough, else the whole pool.
    assert [peers for _, _, peers in steps] == [min(4, flat, pooled) for flat, pooled, _ in steps], steps
    # A step with fewer flat groups than J and more peer groups pooled than flat ones (fixed slots would train
    # on more), and one with a flat group filled (a step that took none would not pass).
    assert any(flat < 4 and pooled > flat for flat, pooled, _ in steps), steps
    assert any(peers > 0 for _, _, peers in steps), steps


def test_a_deciding_node_reports_its_decisions_and_keeps_its_estimate_across_a_checkpoint(tmp_path):
    hub = InMemoryHub()
    args = ("sapo.external_groups=4", "sapo.take_peers=decide", "sapo.decide_warmup=2", "sapo.decide_window=4")
    mine = _node(tmp_path / "mine", hub, *args)
    peer = _node(tmp_path / "peer", hub, "seed=3", "sapo.external_groups=4", "sapo.local_groups=8")
    assert mine.trainer.measure_alignment and not peer.trainer.measure_alignment
    records = []
    for _ in range(3):
        peer.train_step()
        records.append(mine.train_step())
        hub.epoch += 1
    assert records[0]["peer_decision"] == "warmup" and records[0]["peer_steps_taken"] == 1
    assert [r["peer_steps_taken"] + r["peer_steps_declined"] for r in records] == [1, 2, 3]
    measured = [r["train/peer_alignment"] for r in records if "train/peer_alignment" in r]
    assert measured and all(-1.0 <= a <= 1.0 for a in measured)
    assert records[-1]["peer_alignment_n"] == len(measured)
    state = mine.decider.state()
    mine.save_checkpoint()
    mine.close()
    again = _node(tmp_path / "mine", InMemoryHub(), *args)
    assert again.decider.state() == state
    again.close()
    peer.close()


def test_a_deciding_node_that_finds_peers_do_not_pay_trains_as_a_silo_but_on_its_probe_steps(tmp_path):
    """An estimate that says peers do not pay (16 alignments of -1: their gradient against the node's own)
    declines peer groups that are there to take: those steps train on every own group with signal and no
    peer's; every third step (``decide_probe_every=3``) a probe takes them anyway."""
    hub = InMemoryHub()
    mine = _node(tmp_path / "mine", hub, "sapo.external_groups=4", "sapo.take_peers=decide",
                 "sapo.decide_warmup=2", "sapo.decide_probe_every=3")
    peer = _node(tmp_path / "peer", hub, "seed=3", "sapo.external_groups=4", "sapo.local_groups=8")
    assert mine.decider is not None
    mine.decider.load_state({"alignments": [-1.0] * 16, "measured": 16})
    assert mine.decider.pays() is False
    records, pooled = [], []
    for _ in range(3):
        peer.train_step()
        records.append(mine.train_step())
        pooled.append(len(mine._external_pool))  # peer groups received and not trained on
        hub.epoch += 1
    mine.close()
    peer.close()
    assert [r["peer_decision"] for r in records] == ["does_not_pay", "does_not_pay", "probe"]
    assert [(r["peer_steps_taken"], r["peer_steps_declined"], r["peer_probes"]) for r in records] == [
        (0, 1, 0), (0, 2, 0), (1, 2, 1)]
    declined, probe = records[:2], records[2]
    assert all(n > 0 for n in pooled[:2]), pooled  # there were peer groups to take
    assert [r["n_peer_groups"] for r in declined] == [0, 0]
    assert [r["n_local_groups"] for r in declined] == [round(4 * r["local_signal_fraction"]) for r in declined]
    assert probe["n_peer_groups"] > 0 and "train/peer_alignment" not in declined[0]
