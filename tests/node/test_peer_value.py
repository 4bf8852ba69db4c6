"""The deciding node's estimator (``node.train.peer_value``) on hand-made sequences of alignments: warm-up,
declines once the window's mean plus one standard error is at or below the bar, probes while declining,
and its checkpoint."""

from __future__ import annotations

import math

import pytest

from node.train.peer_value import PeerDecider, cosine


def _run(decider: PeerDecider, alignments: list[float | None]) -> list[str]:
    """Each step: decide, then observe that step's alignment; the reasons, one a step."""
    reasons = []
    for value in alignments:
        decider.decide()
        reasons.append(decider.last_reason)
        decider.observe(value)
    return reasons


def test_peers_that_agree_with_the_nodes_own_gradient_are_taken_every_step() -> None:
    decider = PeerDecider(window=4, warmup=2, probe_every=3)
    # Window after step 3: [0.2, 0.1, 0.3], mean 0.2 > 0 (whatever the standard error).
    reasons = _run(decider, [0.2, 0.1, 0.3, 0.2, 0.25])
    assert reasons == ["warmup", "warmup", "pays", "pays", "pays"]
    assert (decider.steps_taken, decider.steps_declined, decider.probes) == (5, 0, 0)
    mean, se = decider.estimate()
    assert mean == pytest.approx((0.1 + 0.3 + 0.2 + 0.25) / 4)  # the window keeps the last 4
    assert se == pytest.approx(0.0853913 / 2, abs=1e-6)  # sample sd of [0.1, 0.3, 0.2, 0.25] / sqrt(4)


def test_peers_that_pull_against_it_are_declined_with_a_probe_every_few_steps() -> None:
    decider = PeerDecider(window=8, warmup=2, probe_every=3)
    # Steps 1-2 warm up on -0.1, -0.2. From step 3 on, mean -0.15 + se 0.05 <= 0: declined; nothing is measured
    # while declining (None), so the window stays; the third step since the last take is a probe.
    reasons = _run(decider, [-0.1, -0.2, None, None, -0.3, None, None, -0.05])
    assert reasons == ["warmup", "warmup", "does_not_pay", "does_not_pay", "probe", "does_not_pay",
                       "does_not_pay", "probe"]
    assert (decider.steps_taken, decider.steps_declined, decider.probes) == (4, 4, 2)
    metrics = decider.metrics()
    assert metrics["peer_decision"] == "probe" and metrics["peer_alignment_n"] == 4
    assert metrics["peer_alignment_mean"] == pytest.approx(-0.1625)


def test_a_noisy_mean_near_zero_is_no_evidence_but_a_clearly_negative_one_is() -> None:
    """Window [0.2, -0.3, 0.15, -0.1]: mean -0.0125, sample sd 0.2323, se 0.1161: mean + se = 0.104 > 0,
    so peers are still taken. Window [-0.2, -0.3, -0.1, -0.25]: mean -0.2125, se 0.0427: declined. A probe
    (every second step) then measures 0.3: window [-0.3, -0.1, -0.25, 0.3], mean -0.0875, se 0.1360,
    mean + se = 0.0485 > 0: taken again."""
    noisy = PeerDecider(window=4, warmup=4, probe_every=2)
    assert _run(noisy, [0.2, -0.3, 0.15, -0.1, None]) == ["warmup"] * 4 + ["pays"]
    mean, se = noisy.estimate()
    assert (mean, se) == (pytest.approx(-0.0125), pytest.approx(0.11614, abs=1e-5))
    against = PeerDecider(window=4, warmup=4, probe_every=2)
    _run(against, [-0.2, -0.3, -0.1, -0.25])
    assert against.pays() is False
    assert _run(against, [None, 0.3, None]) == ["does_not_pay", "probe", "pays"]
    assert against.estimate() == (pytest.approx(-0.0875), pytest.approx(0.13598, abs=1e-5))


def test_min_alignment_raises_the_bar() -> None:
    steady = [0.1] * 6
    assert _run(PeerDecider(window=4, warmup=2, probe_every=9), steady)[-1] == "pays"
    assert _run(PeerDecider(window=4, warmup=2, probe_every=9, min_alignment=0.2), steady)[-1] == "does_not_pay"


def test_state_round_trips_and_bad_values_are_ignored() -> None:
    decider = PeerDecider(window=3, warmup=1, probe_every=2)
    _run(decider, [0.5, float("nan"), -2.0, None, 0.1])
    assert list(decider.alignments) == [0.5, -1.0, 0.1]  # NaN and None ignored, -2 clamped to -1
    again = PeerDecider(window=3, warmup=1, probe_every=2)
    again.load_state(decider.state())
    assert again.state() == decider.state() and again.decide() == decider.decide()
    with pytest.raises(ValueError):
        PeerDecider(window=1)
    with pytest.raises(ValueError):
        PeerDecider(min_alignment=1.0)


def test_cosine() -> None:
    assert cosine(2.0, 1.0, 4.0) == 0.5
    assert cosine(1.0, 0.0, 1.0) is None and cosine(0.0, 1.0, 0.0) is None
    assert math.isclose(cosine(-3.0, math.sqrt(3), math.sqrt(3)), -1.0)
