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


def test_a_batch_id_is_known_only_once_accepted() -> None:
    pb = book()
    assert pb.screen("p", "b1", 10, 1, current_epoch=10, now=0) is None
    assert pb.in_flight("b1") and not pb.is_known("b1")
    pb.accept("p", "b1", 10, 1)
    assert pb.is_known("b1") and not pb.in_flight("b1")


def test_a_rejected_copy_of_an_id_does_not_block_the_genuine_batch() -> None:
    pb = book()
    assert pb.screen("mallory", "b1", 10, 1, current_epoch=10, now=0) is None
    pb.reject("mallory", "b1", 10, 1, "manifest_mismatch", offence=True, now=0)
    assert not pb.is_known("b1") and not pb.in_flight("b1")
    assert pb.screen("alice", "b1", 10, 1, current_epoch=10, now=0) is None
    assert pb.offences == {"manifest_mismatch": 1} and pb.is_banned("mallory", 1)


def test_bans_back_off_exponentially_up_to_a_cap() -> None:
    pb = book()
    assert pb.punish("p", now=0) == 10.0
    assert pb.is_banned("p", 9.9) and not pb.is_banned("p", 10.0)
    assert pb.punish("p", now=30) == 20.0
    assert pb.punish("p", now=30) == 35.0  # 40 capped
    assert pb.ban_remaining("p", 30) == pytest.approx(35.0)
    assert pb.screen("p", "b", 10, 1, current_epoch=10, now=31) == "banned"
    assert pb.banned(31) == ["p"] and pb.banned(100) == []


def test_reject_with_offence_bans_and_gives_back_quota() -> None:
    pb = book()
    assert pb.screen("p", "b1", 10, 500, current_epoch=10, now=0) is None
    pb.reject("p", "b1", 10, 500, "hash_mismatch", offence=True, now=0)
    assert pb.rejected == {"hash_mismatch": 1}
    assert pb.is_banned("p", 5)
    assert pb.screen("p", "b2", 10, 1000, current_epoch=10, now=11) is None  # the 500 bytes were released


def test_failed_pulls_are_retried_then_counted_unreachable_and_punished() -> None:
    pb = book()
    pb.screen("p", "b1", 10, 100, current_epoch=10, now=0)
    assert pb.pull_failed("p", "b1", 10, 100, stalled=False, now=0) is True
    assert not pb.in_flight("b1") and not pb.is_banned("p", 0)  # the next poll screens it again
    pb.screen("p", "b1", 10, 100, current_epoch=10, now=0)
    assert pb.pull_failed("p", "b1", 10, 100, stalled=False, now=0) is False
    assert not pb.is_known("b1") and pb.rejected == {"unreachable": 1}
    assert pb.is_banned("p", 5) and pb.offences == {"unreachable": 1}


def test_a_newcomers_stalled_pull_is_an_offence_at_once() -> None:
    pb = book()
    pb.screen("p", "b1", 10, 600, current_epoch=10, now=0)
    assert pb.pull_failed("p", "b1", 10, 600, stalled=True, now=0) is False
    assert pb.rejected == {"stalled": 1} and pb.ban_remaining("p", 0) == 10.0
    assert pb.screen("p", "b2", 10, 1000, current_epoch=10, now=10) is None  # quota given back


def test_an_established_peer_is_forgiven_stall_grace_stalls_per_window() -> None:
    pb = book(stall_grace=2, max_ban_seconds=100.0, max_pull_attempts=5)
    pb.screen("p", "b0", 10, 100, current_epoch=10, now=0)
    pb.accept("p", "b0", 10, 100)
    for attempt in range(2):  # forgiven: retried, not banned, not rejected
        assert pb.screen("p", "b1", 10, 100, current_epoch=10, now=attempt) is None
        assert pb.pull_failed("p", "b1", 10, 100, stalled=True, now=attempt) is True
        assert not pb.is_banned("p", attempt) and not pb.rejected
    assert pb.stalls_forgiven == 2
    pb.screen("p", "b2", 10, 100, current_epoch=10, now=2)
    assert pb.pull_failed("p", "b2", 10, 100, stalled=True, now=2) is False  # the third: an offence
    assert pb.rejected == {"stalled": 1} and pb.is_banned("p", 3)
    assert pb.stalls_forgiven == 2
    # A window later the grace is back.
    pb.screen("p", "b3", 10, 100, current_epoch=10, now=200)
    assert pb.pull_failed("p", "b3", 10, 100, stalled=True, now=200) is True
    assert not pb.is_banned("p", 200) and pb.stalls_forgiven == 3


def test_an_established_peer_given_up_as_unreachable_is_forgiven_within_the_grace() -> None:
    pb = book(stall_grace=1, max_pull_attempts=1)
    pb.screen("p", "b0", 10, 100, current_epoch=10, now=0)
    pb.accept("p", "b0", 10, 100)
    pb.screen("p", "b1", 10, 100, current_epoch=10, now=1)
    assert pb.pull_failed("p", "b1", 10, 100, stalled=False, now=1) is False  # given up, not punished
    assert pb.rejected == {"unreachable": 1} and not pb.offences and not pb.is_banned("p", 1)
    pb.screen("p", "b2", 10, 100, current_epoch=10, now=2)
    assert pb.pull_failed("p", "b2", 10, 100, stalled=False, now=2) is False  # grace used up: banned
    assert pb.offences == {"unreachable": 1} and pb.is_banned("p", 3) and pb.stalls_forgiven == 1


def test_a_forgiven_stall_still_counts_as_a_failed_attempt() -> None:
    pb = book(stall_grace=1, max_pull_attempts=2)
    pb.screen("p", "b0", 10, 100, current_epoch=10, now=0)
    pb.accept("p", "b0", 10, 100)
    pb.screen("p", "b1", 10, 100, current_epoch=10, now=0)
    assert pb.pull_failed("p", "b1", 10, 100, stalled=True, now=0) is True
    pb.screen("p", "b1", 10, 100, current_epoch=10, now=1)
    assert pb.pull_failed("p", "b1", 10, 100, stalled=False, now=1) is False  # second failure of b1
    assert pb.rejected == {"unreachable": 1}


def test_no_stall_grace_bans_established_peers_at_once() -> None:
    pb = book(stall_grace=0)
    pb.screen("p", "b0", 10, 100, current_epoch=10, now=0)
    pb.accept("p", "b0", 10, 100)
    pb.screen("p", "b1", 10, 100, current_epoch=10, now=0)
    assert pb.pull_failed("p", "b1", 10, 100, stalled=True, now=0) is False
    assert pb.rejected == {"stalled": 1} and pb.is_banned("p", 1) and pb.stalls_forgiven == 0


def test_accept_counts_and_prune_forgets_old_epochs() -> None:
    pb = book()
    pb.screen("p", "b1", 9, 100, current_epoch=9, now=0)
    pb.accept("p", "b1", 9, 100)
    assert (pb.accepted, pb.accepted_bytes, pb.authors_seen()) == (1, 100, 1)
    assert pb.is_established("p")
    pb.prune(current_epoch=11, now=0)  # keeps epochs >= 9
    assert pb.is_known("b1") and pb.authors_seen() == 1
    pb.prune(current_epoch=12, now=0)
    assert not pb.is_known("b1") and pb.authors_seen() == 0


def test_refuse_counts_without_quota_and_may_punish() -> None:
    pb = book()
    assert pb.refuse("p", 10, "too_large", offence=True, now=0) == "too_large"
    assert not pb.is_known("big") and pb.rejected == {"too_large": 1}
    assert pb.is_banned("p", 1)
    assert pb.screen("q", "b1", 10, 1000, current_epoch=10, now=0) is None


def test_global_quota_leaves_room_for_established_authors() -> None:
    pb = book(max_batches_per_peer_epoch=10, max_batches_per_epoch=6, newcomer_share=0.5)
    assert pb.screen("old", "b0", 10, 1, current_epoch=10, now=0) is None  # a newcomer's batch, then...
    pb.accept("old", "b0", 10, 1)  # ... established
    assert pb.screen("sybil-1", "s1", 10, 1, current_epoch=10, now=0) is None
    assert pb.screen("sybil-2", "s2", 10, 1, current_epoch=10, now=0) is None
    assert pb.screen("sybil-3", "s3", 10, 1, current_epoch=10, now=0) == "quota_global"  # 3 = half of 6
    for bid in ("b1", "b2", "b3"):
        assert pb.screen("old", bid, 10, 1, current_epoch=10, now=0) is None
    assert pb.screen("old", "b4", 10, 1, current_epoch=10, now=0) == "quota_global"  # 6 in all
    assert pb.rejected == {"quota_global": 2}


def test_payload_quota_is_charged_before_decoding() -> None:
    pb = book(max_payload_bytes_per_peer_epoch=1000)
    assert pb.charge_payload("p", 10, 600) is None
    assert pb.charge_payload("p", 10, 401) == "quota_payload"
    assert pb.charge_payload("p", 11, 1000) is None


def test_strikes_are_forgotten_after_a_quiet_period() -> None:
    pb = book()  # max_ban_seconds 35
    assert pb.penalize("p", "text_mismatch", now=0) == 10.0
    assert pb.punish("p", now=35) == 20.0  # within 35 s of the last offence: backoff
    assert pb.punish("p", now=35 + 36) == 10.0  # quiet for longer: starts over
    assert pb.rejected == {"text_mismatch": 1}


def test_authors_are_pruned_and_bounded_in_number() -> None:
    pb = book(max_peers=16)
    for i in range(100):
        pb.screen(f"sybil-{i}", f"b{i}", 10, 1, current_epoch=10, now=0)
    assert pb.authors_seen() <= 16
    pb.punish("sybil-99", now=0)
    pb.prune(current_epoch=20, now=1)
    assert pb.banned(1) == ["sybil-99"] and pb.authors_seen() == 1
    pb.prune(current_epoch=20, now=40)
    assert pb.authors_seen() == 0


def test_per_peer_counts_add_up_to_the_totals() -> None:
    pb = book(max_pull_attempts=2)
    pb.screen("p", "b1", 10, 100, current_epoch=10, now=1)
    pb.received("p", 100, now=2)
    pb.accept("p", "b1", 10, 100, groups=4)
    pb.screen("p", "b2", 10, 300, current_epoch=10, now=3)
    pb.received("p", 290, now=4)
    pb.reject("p", "b2", 10, 300, "bad_signature", offence=True, now=4)  # banned 4..14
    pb.screen("p", "b3", 10, 100, current_epoch=10, now=5)  # banned: not pulled
    pb.screen("q", "b4", 7, 100, current_epoch=10, now=6)  # stale
    pb.refuse("q", 10, "too_large", offence=False, now=7)
    pb.screen("q", "b6", 10, 100, current_epoch=10, now=8)
    pb.pull_failed("q", "b6", 10, 100, stalled=False, now=9)
    pb.screen("q", "b6", 10, 100, current_epoch=10, now=10)
    pb.pull_failed("q", "b6", 10, 100, stalled=False, now=11)  # second failure: unreachable, banned 11..21
    rows = {r.peer_id: r for r in pb.peer_table(now=12)}
    p, q = rows["p"], rows["q"]
    assert (p.batches_accepted, p.groups_accepted, p.bytes_in, p.last_seen) == (1, 4, 100 + 290, 5)
    assert p.rejected == {"bad_signature": 1, "banned": 1} and p.banned_until == 14
    assert (q.batches_accepted, q.bytes_in, q.last_seen, q.banned_until) == (0, 0, 11, 21)
    assert q.rejected == {"stale": 1, "too_large": 1, "unreachable": 1}
    assert [r.peer_id for r in pb.peer_table(now=12)] == ["q", "p"]  # most recently seen first
    total: dict[str, int] = {}
    for row in rows.values():
        for reason, n in row.rejected.items():
            total[reason] = total.get(reason, 0) + n
    assert total == dict(pb.rejected)
    assert pb.peer_table(now=30)[1].banned_until is None  # the ban is over


def test_bytes_served_are_counted_for_the_author_behind_a_libp2p_id() -> None:
    pb = book()
    pb.served("L1", 50, now=1)  # someone we do not know yet pulled 50 bytes
    assert [(r.peer_id, r.published, r.bytes_out) for r in pb.peer_table(now=1)] == [("L1", False, 50)]
    pb.note_addresses("p", ["L1"], now=2)  # p's manifest names L1: those bytes were p's
    pb.served("L1", 70, now=3)
    [row] = pb.peer_table(now=3)
    assert (row.peer_id, row.published, row.bytes_out, row.libp2p_ids) == ("p", True, 120, ("L1",))


def test_per_peer_rows_are_bounded_and_idle_peers_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    import swarm.peer_book as peer_book

    monkeypatch.setattr(peer_book, "MAX_TRACKED_PEERS", 3)
    pb = book(ban_seconds=5000.0, max_ban_seconds=5000.0)
    for i, author in enumerate("abcd"):
        pb.refuse(author, 10, "too_large", offence=False, now=float(i))
    assert sorted(r.peer_id for r in pb.peer_table(now=4)) == ["b", "c", "d"]  # a, seen longest ago, went
    pb.punish("b", now=4)  # banned until 5004: kept while banned, although idle
    pb.note_addresses("d", [f"L{i}" for i in range(20)], now=4)
    assert len(pb.peer_table(now=4)[0].libp2p_ids) == 8  # bounded, whatever a manifest claims
    now = 3.5 + peer_book.PEER_FORGET_SECONDS  # c (seen at 2) is idle; d (seen at 4) is not
    pb.prune(current_epoch=10, now=now)
    assert sorted(r.peer_id for r in pb.peer_table(now=now)) == ["b", "d"]
