"""PeerBook: quotas, staleness, dedup, bans with backoff, pull retries (pure, hand-computed values)."""

from __future__ import annotations

import pytest

from swarm.peer_book import PeerBook


def book(**overrides: float) -> PeerBook:
    args: dict[str, float] = {
        "max_batches_per_peer_epoch": 2,
        "max_bytes_per_peer_epoch": 1000,
        "read_epochs": 2,
        "ban_seconds": 10.0,
        "ban_backoff": 2.0,
        "max_ban_seconds": 35.0,
        "max_pull_attempts": 2,
    }
    args.update(overrides)
    return PeerBook(**args)  # type: ignore[arg-type]


def test_quota_of_batches_per_author_and_epoch() -> None:
    pb = book()
    assert pb.screen("p", "b1", 10, 100, current_epoch=10, now=0) is None
    assert pb.screen("p", "b2", 10, 100, current_epoch=10, now=0) is None
    assert pb.screen("p", "b3", 10, 100, current_epoch=10, now=0) == "quota_batches"
    assert pb.screen("p", "b4", 9, 100, current_epoch=10, now=0) is None  # other epoch, own quota
    assert pb.screen("q", "b5", 10, 100, current_epoch=10, now=0) is None  # other author
    assert pb.rejected == {"quota_batches": 1}


def test_quota_of_bytes() -> None:
    pb = book()
    assert pb.screen("p", "b1", 10, 600, current_epoch=10, now=0) is None
    assert pb.screen("p", "b2", 10, 401, current_epoch=10, now=0) == "quota_bytes"
    assert pb.screen("p", "b3", 10, 400, current_epoch=10, now=0) is None


def test_staleness_window_and_future_epochs() -> None:
    pb = book()
    assert pb.screen("p", "old", 8, 1, current_epoch=10, now=0) == "stale"  # window is {9, 10}
    assert pb.screen("p", "prev", 9, 1, current_epoch=10, now=0) is None
    assert pb.screen("p", "skew", 11, 1, current_epoch=10, now=0) is None
    assert pb.screen("q", "far", 12, 1, current_epoch=10, now=0) == "future_epoch"


def test_every_batch_id_is_screened_once() -> None:
    pb = book()
    assert not pb.is_known("b1")
    pb.screen("p", "b1", 10, 1, current_epoch=10, now=0)
    assert pb.is_known("b1")


def test_bans_back_off_exponentially_up_to_a_cap() -> None:
    pb = book()
    assert pb.punish("p", now=0) == 10.0
    assert pb.is_banned("p", 9.9) and not pb.is_banned("p", 10.0)
    assert pb.punish("p", now=100) == 20.0
    assert pb.punish("p", now=100) == 35.0  # 40 capped
    assert pb.ban_remaining("p", 100) == pytest.approx(35.0)
    assert pb.screen("p", "b", 10, 1, current_epoch=10, now=101) == "banned"
    assert pb.banned(101) == ["p"] and pb.banned(200) == []


def test_reject_with_offence_bans_and_gives_back_quota() -> None:
    pb = book()
    assert pb.screen("p", "b1", 10, 500, current_epoch=10, now=0) is None
    pb.reject("p", "b1", 10, 500, "hash_mismatch", offence=True, now=0)
    assert pb.rejected == {"hash_mismatch": 1}
    assert pb.is_banned("p", 5)
    assert pb.screen("p", "b2", 10, 1000, current_epoch=10, now=11) is None  # the 500 bytes were released


def test_failed_pulls_are_retried_then_counted_unreachable() -> None:
    pb = book()
    pb.screen("p", "b1", 10, 100, current_epoch=10, now=0)
    assert pb.pull_failed("p", "b1", 10, 100) is True
    assert not pb.is_known("b1")  # the next poll screens it again
    pb.screen("p", "b1", 10, 100, current_epoch=10, now=0)
    assert pb.pull_failed("p", "b1", 10, 100) is False
    assert pb.is_known("b1") and pb.rejected == {"unreachable": 1}


def test_accept_counts_and_prune_forgets_old_epochs() -> None:
    pb = book()
    pb.screen("p", "b1", 9, 100, current_epoch=9, now=0)
    pb.accept("b1", 100)
    assert (pb.accepted, pb.accepted_bytes, pb.authors_seen()) == (1, 100, 1)
    pb.prune(current_epoch=11, now=0)  # keeps epochs >= 9
    assert pb.is_known("b1")
    pb.prune(current_epoch=12, now=0)
    assert not pb.is_known("b1")


def test_refuse_counts_without_quota() -> None:
    pb = book()
    assert pb.refuse("p", "big", 10, "too_large") == "too_large"
    assert pb.is_known("big") and pb.rejected == {"too_large": 1}
    assert pb.screen("p", "b1", 10, 1000, current_epoch=10, now=0) is None
