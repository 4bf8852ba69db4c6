"""``HandoffStore``: quotas per author identity and epoch, a global byte cap, expiry (pure, no network)."""

from __future__ import annotations

from swarm.handoff import HandoffStatus, HandoffStore

S = HandoffStatus
MAX_BATCH = 1000


def store(**overrides: int) -> HandoffStore:
    limits = {"max_per_author_epoch": 2, "max_bytes_per_author_epoch": 250, "max_total_bytes": 400, "read_epochs": 2}
    limits.update(overrides)
    return HandoffStore(**limits)


def test_precheck_refuses_before_any_byte_is_sent() -> None:
    s = store()
    assert s.precheck("a" * 64, 100, MAX_BATCH) == S.GO
    assert s.precheck("a" * 64, MAX_BATCH + 1, MAX_BATCH) == S.TOO_LARGE
    assert s.precheck("a" * 64, 401, MAX_BATCH) == S.FULL  # more than the global cap
    assert s.add("a" * 64, b"x" * 100, "alice", epoch=10, current_epoch=10) == S.OK
    assert s.precheck("a" * 64, 100, MAX_BATCH) == S.HAVE  # already held: nothing is sent again
    assert s.precheck("b" * 64, 301, MAX_BATCH) == S.FULL  # 100 held + 301 > 400
    assert dict(s.refused) == {"too_large": 1, "full": 2}


def test_quota_per_author_and_epoch_in_batches_and_bytes() -> None:
    s = store(max_total_bytes=500)
    assert s.add("1" * 64, b"x" * 100, "alice", 10, 10) == S.OK
    assert s.add("2" * 64, b"x" * 100, "alice", 10, 10) == S.OK
    assert s.add("3" * 64, b"x" * 10, "alice", 10, 10) == S.QUOTA  # third batch of alice in epoch 10
    assert s.add("3" * 64, b"x" * 10, "alice", 9, 10) == S.OK  # another epoch has its own quota
    assert s.add("4" * 64, b"x" * 200, "bob", 10, 10) == S.OK
    assert s.add("5" * 64, b"x" * 60, "bob", 10, 10) == S.QUOTA  # 200 + 60 > 250 bytes for bob
    assert s.add("5" * 64, b"x" * 100, "carol", 10, 10) == S.FULL  # 410 + 100 > 500 over everyone
    assert (len(s), s.total_bytes, s.accepted) == (4, 100 + 100 + 10 + 200, 4)
    assert s.get("4" * 64) == b"x" * 200 and s.get("5" * 64) is None


def test_stale_and_future_epochs_are_refused_and_old_ones_expire() -> None:
    s = store()
    assert s.add("1" * 64, b"x", "alice", 8, 10) == S.STALE  # read_epochs 2: epochs 9 and 10 only
    assert s.add("2" * 64, b"x", "alice", 12, 10) == S.STALE  # more than one epoch ahead
    assert s.add("3" * 64, b"x" * 50, "alice", 9, 10) == S.OK
    assert s.add("4" * 64, b"x" * 70, "alice", 10, 10) == S.OK
    s.prune(current_epoch=11)  # epoch 9 leaves the window
    assert s.get("3" * 64) is None and s.get("4" * 64) is not None and s.total_bytes == 70
    s.prune(current_epoch=12)
    assert len(s) == 0 and s.total_bytes == 0
    assert s.add("5" * 64, b"x", "alice", 12, 12) == S.OK  # quotas of pruned epochs are gone too
