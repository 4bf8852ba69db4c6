"""The attack suite at small scale (``scripts/lib/poison``): every attack of ``SUITE``, each from its own
attacker node with a payload of its own, against one small-base victim beside an honest peer, all on an
in-memory swarm (signed batches through the same checks as the hivemind path). The undefended victim
(``ingest.screen=false``) is poisoned: the payload's log-prob under it rises by nats a token within a few
steps (small-base is too small to start saying an English sentence in so few; smollm2 does, and its attack
success rates are measured by ``scripts/lab/poison.py``: docs/results/poison.md). The defended victim, the
same seeds and attackers, does not move toward any payload, bans the attackers, and still learns."""

from __future__ import annotations

import pytest

from scripts.lib.poison.attacks import SUITE, together
from scripts.lib.poison.lab import LabSpec, run

ATTACKS = together(list(SUITE))  # each attack its own payload, so the victim's move toward each is measured apart
VICTIM = ("tasks.datasets=[calendar_arithmetic]", "tasks.eval_size=16", "sapo.local_groups=2", "sapo.external_groups=8",
          "generation.max_new_tokens=64", "ingest.screen_ban_window=16")  # a ban within the few steps
POISONED = 1.5  # nats a token the undefended victim moves toward each payload, at least
HELD = 1.0  # nats a token the defended victim may move, at most


def _run(arm: tuple[str, ...]):
    return run(LabSpec(None, "configs/small-silo.yaml", VICTIM, arm, steps=6, attacks=ATTACKS, eval_tasks=8,
                       samples=0, attacker_groups=2))


@pytest.fixture(scope="module")
def undefended():
    return _run(("ingest.screen=false",))


@pytest.fixture(scope="module")
def defended():
    return _run(())


@pytest.mark.parametrize("name", list(SUITE))
def test_each_attack_poisons_the_undefended_node_and_not_the_defended_one(undefended, defended, name):
    moved = undefended.payload_after[name] - undefended.payload_before[name]
    assert moved >= POISONED, f"{name}: the undefended victim moved only {moved:.2f} nats a token"
    held = defended.payload_after[name] - defended.payload_before[name]
    assert held <= HELD, f"{name}: the defended victim moved {held:.2f} nats a token toward the payload"


def test_the_defence_drops_bans_and_keeps_learning_from_the_honest_peer(undefended, defended):
    v = defended.victim
    assert v["peers_banned"] >= len(ATTACKS)  # every attacker identity but a late one: they keep failing
    assert v["ingest_offences"].get("implausible_text", 0) >= len(ATTACKS)
    assert undefended.victim["peers_banned"] == 0 and not undefended.victim["ingest_rejected"]
    assert defended.greedy_reward >= undefended.greedy_reward - 0.05  # learning goes on (it fell undefended)
    assert defended.honest_read >= 64 and defended.honest_dropped <= 0.05 * defended.honest_read
