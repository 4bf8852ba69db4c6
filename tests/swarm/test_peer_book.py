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
    pb.reject("p", "b1", 10, 500, "hash_mismatch", nbytes=500, offence=True, now=0)
    assert pb.rejected == {"hash_mismatch": 1}
    assert pb.is_banned("p", 5)
    assert pb.screen("p", "b2", 10, 1000, current_epoch=10, now=11) is None  # the 500 bytes were released


def test_failed_pulls_are_retried_then_counted_unreachable() -> None:
    pb = book()
    pb.screen("p", "b1", 10, 100, current_epoch=10, now=0)
    assert pb.pull_failed("p", "b1", 10, 100, now=0) is True
    assert not pb.is_known("b1")  # the next poll screens it again
    pb.screen("p", "b1", 10, 100, current_epoch=10, now=0)
    assert pb.pull_failed("p", "b1", 10, 100, now=0) is False
    assert pb.is_known("b1") and pb.rejected == {"unreachable": 1}


def test_accept_counts_and_prune_forgets_old_epochs() -> None:
    pb = book()
    pb.screen("p", "b1", 9, 100, current_epoch=9, now=0)
    pb.accept("p", "b1", 100, groups=4, now=0)
    assert (pb.accepted, pb.accepted_bytes, pb.authors_seen()) == (1, 100, 1)
    pb.prune(current_epoch=11, now=0)  # keeps epochs >= 9
    assert pb.is_known("b1")
    pb.prune(current_epoch=12, now=0)
    assert not pb.is_known("b1")


def test_refuse_counts_without_quota() -> None:
    pb = book()
    assert pb.refuse("p", "big", 10, "too_large", now=0) == "too_large"
    assert pb.is_known("big") and pb.rejected == {"too_large": 1}
    assert pb.screen("p", "b1", 10, 1000, current_epoch=10, now=0) is None


def test_per_peer_counts_add_up_to_the_totals() -> None:
    pb = book()
    pb.screen("p", "b1", 10, 100, current_epoch=10, now=1)
    pb.accept("p", "b1", 100, groups=4, now=2)
    pb.screen("p", "b2", 10, 300, current_epoch=10, now=3)
    pb.reject("p", "b2", 10, 300, "bad_signature", nbytes=290, offence=True, now=4)  # banned 4..14
    pb.screen("p", "b3", 10, 100, current_epoch=10, now=5)  # banned: not pulled
    pb.screen("q", "b4", 7, 100, current_epoch=10, now=6)  # stale
    pb.refuse("q", "b5", 10, "too_large", now=7)
    pb.screen("q", "b6", 10, 100, current_epoch=10, now=8)
    pb.pull_failed("q", "b6", 10, 100, now=9)
    pb.screen("q", "b6", 10, 100, current_epoch=10, now=10)
    pb.pull_failed("q", "b6", 10, 100, now=11)  # second failure: unreachable
    rows = {r.peer_id: r for r in pb.peer_table(now=12)}
    p, q = rows["p"], rows["q"]
    assert (p.batches_accepted, p.groups_accepted, p.bytes_in, p.last_seen) == (1, 4, 100 + 290, 5)
    assert p.rejected == {"bad_signature": 1, "banned": 1} and p.banned_until == 14
    assert (q.batches_accepted, q.bytes_in, q.last_seen, q.banned_until) == (0, 0, 11, None)
    assert q.rejected == {"stale": 1, "too_large": 1, "unreachable": 1}
    assert [r.peer_id for r in pb.peer_table(now=12)] == ["q", "p"]  # most recently seen first
    total: dict[str, int] = {}
    for row in rows.values():
        for reason, n in row.rejected.items():
            total[reason] = total.get(reason, 0) + n
    assert total == dict(pb.rejected)
    assert pb.peer_table(now=20)[1].banned_until is None  # the ban is over


def test_bytes_served_are_counted_for_the_author_behind_a_libp2p_id() -> None:
    pb = book()
    pb.served("L1", 50, now=1)  # someone we do not know yet pulled 50 bytes
    assert [(r.peer_id, r.published, r.bytes_out) for r in pb.peer_table(now=1)] == [("L1", False, 50)]
    pb.note_addresses("p", ["L1"], now=2)  # p's manifest names L1: those bytes were p's
    pb.screen("p", "b1", 10, 100, current_epoch=10, now=2)
    pb.served("L1", 70, now=3)
    [row] = pb.peer_table(now=3)
    assert (row.peer_id, row.published, row.bytes_out, row.libp2p_ids) == ("p", True, 120, ("L1",))


def test_per_peer_rows_are_bounded_and_idle_peers_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    import swarm.peer_book as peer_book

    monkeypatch.setattr(peer_book, "MAX_TRACKED_PEERS", 3)
    pb = book(ban_seconds=5000.0, max_ban_seconds=5000.0)
    for i, author in enumerate("abcd"):
        pb.refuse(author, f"b{i}", 10, "too_large", now=float(i))
    assert sorted(r.peer_id for r in pb.peer_table(now=4)) == ["b", "c", "d"]  # a, seen longest ago, went
    pb.punish("b", now=4)  # banned until 5004: kept while banned, although idle
    now = 2.5 + peer_book.PEER_FORGET_SECONDS  # c (seen at 2) is idle; d (seen at 3) is not
    pb.prune(current_epoch=10, now=now)
    assert sorted(r.peer_id for r in pb.peer_table(now=now)) == ["b", "d"]
