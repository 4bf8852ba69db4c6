"""What a peer's text may teach (``node.exchange.plausibility``): the statistics against hand-worked values,
the bounds an own profile sets, and the ingestor dropping and masking a peer's completions by them."""

from __future__ import annotations

import math

import pytest

from node.exchange.plausibility import OwnProfile, ScreenSettings, least_plausible_span, quantile, token_keep


def test_least_plausible_span_is_the_lowest_window_mean():
    lps = [-1.0, -1.0, -5.0, -5.0, -1.0]
    assert least_plausible_span(lps, 2) == -5.0
    assert least_plausible_span(lps, 3) == pytest.approx(-11 / 3)
    assert least_plausible_span(lps, 5) == pytest.approx(-13 / 5)
    assert least_plausible_span(lps, 9) == pytest.approx(-13 / 5)  # shorter than the window: the mean
    assert least_plausible_span([], 3) == 0.0
    assert least_plausible_span([-2.0], 1) == -2.0


def test_token_keep_and_quantile():
    assert token_keep([-0.1, -9.3, -9.2, -20.0], -9.2) == [True, False, True, False]
    values = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert quantile(values, 0.2) == 1.0 and quantile(values, 0.5) == 3.0 and quantile(values, 1.0) == 5.0
    assert quantile(values, 0.01) == 1.0


def _profile(**kw) -> OwnProfile:
    settings = ScreenSettings(**{"window": 2, "span_quantile": 0.25, "span_margin": 0.5, "length_quantile": 0.5,
                                 "length_ratio": 2.0, "min_own": 4, **kw})
    return OwnProfile(settings)


def test_bounds_wait_for_enough_own_completions_then_follow_them():
    profile = _profile()
    own = [[-1.0, -1.0, -1.0], [-2.0, -2.0], [-0.5, -3.5, -0.5, -0.5], [-1.0] * 6]
    profile.observe("add", own[:3])
    assert profile.span_floor() is None and profile.max_length("add") is None
    assert profile.verdict("add", [-50.0] * 40) is None  # no bound yet: only the token floor holds
    profile.observe("add", own[3:])
    # spans: -1, -2, -2 (window 2 of [-0.5, -3.5, ...]), -1 -> the 0.25 quantile is -2, less 0.5
    assert profile.span_floor() == -2.5
    # lengths 3, 2, 4, 6 -> the median (lower) is 3, twice that is 6
    assert profile.max_length("add") == 6 and profile.max_length("sub") is None
    assert profile.verdict("add", [-1.0] * 7) == "too_long_for_us"
    assert profile.verdict("add", [-1.0, -3.0, -3.0]) == "implausible"
    assert profile.verdict("add", [-1.0, -2.0, -3.0]) is None  # span -2.5 is not below -2.5
    assert profile.verdict("sub", [-1.0] * 40) is None  # no own completions of sub: no length bound


def test_profile_keeps_only_recent_history():
    profile = _profile(history=4)
    profile.observe("add", [[-10.0, -10.0]] * 4)
    assert profile.span_floor() == -10.5
    profile.observe("add", [[-1.0, -1.0]] * 4)
    assert profile.span_floor() == -1.5 and math.isclose(profile.max_length("add") or 0, 4)
