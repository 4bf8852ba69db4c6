"""The peer book: what this node accepts from whom (pure bookkeeping, no I/O, no clock of its own).

It screens each announced batch before it is pulled (ban list, staleness window, deduplication by batch
id, quotas per author and epoch), records the outcome after it is verified, bans authors of invalid data
with exponential backoff, and counts every accepted and rejected batch (rejections by reason).

Callers pass ``now`` (seconds, any monotonic clock) and the current epoch, so tests need no sleeping.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

__all__ = ["PeerBook", "RejectReason"]


class RejectReason:
    """Labels of rejections decided by ``swarm`` (protocol errors add their own ``reason``)."""

    BANNED = "banned"
    STALE = "stale"
    FUTURE_EPOCH = "future_epoch"
    QUOTA_BATCHES = "quota_batches"
    QUOTA_BYTES = "quota_bytes"
    WRONG_SWARM = "wrong_swarm"
    SIZE_MISMATCH = "size_mismatch"
    HASH_MISMATCH = "hash_mismatch"
    MANIFEST_MISMATCH = "manifest_mismatch"
    UNREACHABLE = "unreachable"
    DROPPED_INBOX_FULL = "inbox_full"


@dataclass
class _Quota:
    batches: int = 0
    nbytes: int = 0


class PeerBook:
    """Per-author quotas, bans, a staleness window and dedup; counters of accepted/rejected batches."""

    def __init__(
        self,
        *,
        max_batches_per_peer_epoch: int,
        max_bytes_per_peer_epoch: int,
        read_epochs: int,
        ban_seconds: float,
        ban_backoff: float = 2.0,
        max_ban_seconds: float = 3600.0,
        max_pull_attempts: int = 3,
    ) -> None:
        if read_epochs < 1 or max_batches_per_peer_epoch < 1 or max_bytes_per_peer_epoch < 1:
            raise ValueError("read_epochs and quotas must be >= 1")
        self.max_batches = max_batches_per_peer_epoch
        self.max_bytes = max_bytes_per_peer_epoch
        self.read_epochs = read_epochs
        self.ban_seconds = ban_seconds
        self.ban_backoff = ban_backoff
        self.max_ban_seconds = max_ban_seconds
        self.max_pull_attempts = max_pull_attempts
        self.accepted = 0
        self.accepted_bytes = 0
        self.rejected: Counter[str] = Counter()
        self._known: dict[str, int] = {}  # batch id -> epoch, for every decided or in-flight batch
        self._attempts: dict[str, int] = {}
        self._quotas: dict[tuple[str, int], _Quota] = {}
        self._strikes: dict[str, int] = {}
        self._banned_until: dict[str, float] = {}
        self._authors_seen: set[str] = set()

    # -- screening, before a pull ------------------------------------------------------------------

    def is_known(self, batch_id: str) -> bool:
        """True for a batch already accepted, rejected or being pulled: it is skipped silently."""
        return batch_id in self._known

    def is_banned(self, author: str, now: float) -> bool:
        return self._banned_until.get(author, float("-inf")) > now

    def ban_remaining(self, author: str, now: float) -> float:
        return max(0.0, self._banned_until.get(author, now) - now)

    def screen(
        self, author: str, batch_id: str, epoch: int, byte_size: int, current_epoch: int, now: float
    ) -> str | None:
        """Decide whether to pull a batch: None (go, quota reserved) or the counted rejection reason.

        Every batch id is screened once: afterwards it is known, whatever the outcome.
        """
        self._known[batch_id] = epoch
        self._authors_seen.add(author)
        reason = self._screen_reason(author, epoch, byte_size, current_epoch, now)
        if reason is not None:
            self.rejected[reason] += 1
            return reason
        quota = self._quotas.setdefault((author, epoch), _Quota())
        quota.batches += 1
        quota.nbytes += byte_size
        return None

    def refuse(self, author: str, batch_id: str, epoch: int, reason: str) -> str:
        """Reject an announced batch without pulling it (e.g. announced larger than allowed)."""
        self._known[batch_id] = epoch
        self._authors_seen.add(author)
        self.rejected[reason] += 1
        return reason

    def _screen_reason(
        self, author: str, epoch: int, byte_size: int, current_epoch: int, now: float
    ) -> str | None:
        if self.is_banned(author, now):
            return RejectReason.BANNED
        if epoch <= current_epoch - self.read_epochs:
            return RejectReason.STALE
        if epoch > current_epoch + 1:  # one epoch of clock skew is tolerated
            return RejectReason.FUTURE_EPOCH
        quota = self._quotas.get((author, epoch), _Quota())
        if quota.batches + 1 > self.max_batches:
            return RejectReason.QUOTA_BATCHES
        if quota.nbytes + byte_size > self.max_bytes:
            return RejectReason.QUOTA_BYTES
        return None

    # -- outcomes, after a pull ---------------------------------------------------------------------

    def accept(self, batch_id: str, nbytes: int) -> None:
        """A pulled batch passed every check."""
        self._attempts.pop(batch_id, None)
        self.accepted += 1
        self.accepted_bytes += nbytes

    def reject(
        self,
        author: str,
        batch_id: str,
        epoch: int,
        byte_size: int,
        reason: str,
        *,
        offence: bool,
        now: float,
    ) -> None:
        """A pulled batch failed a check: count it, give back its quota, ban the author if ``offence``."""
        self._attempts.pop(batch_id, None)
        self._release(author, epoch, byte_size)
        self.rejected[reason] += 1
        if offence:
            self.punish(author, now)

    def pull_failed(self, author: str, batch_id: str, epoch: int, byte_size: int) -> bool:
        """A pull did not complete (peer unreachable, timeout). Returns True if it will be retried.

        The quota is given back and the batch forgotten so the next poll screens it again, until
        ``max_pull_attempts`` failures; then it is rejected as unreachable and stays known.
        """
        self._release(author, epoch, byte_size)
        attempts = self._attempts.get(batch_id, 0) + 1
        if attempts >= self.max_pull_attempts:
            self._attempts.pop(batch_id, None)
            self.rejected[RejectReason.UNREACHABLE] += 1
            return False
        self._attempts[batch_id] = attempts
        self._known.pop(batch_id, None)
        return True

    def punish(self, author: str, now: float) -> float:
        """Ban ``author``: ``ban_seconds * ban_backoff ** (offences - 1)``, capped. Returns the length."""
        strikes = self._strikes.get(author, 0) + 1
        self._strikes[author] = strikes
        length = min(self.max_ban_seconds, self.ban_seconds * self.ban_backoff ** (strikes - 1))
        self._banned_until[author] = max(self._banned_until.get(author, now), now + length)
        return length

    def count(self, reason: str, n: int = 1) -> None:
        """Count a rejection decided elsewhere (a DHT record validator, a full inbox)."""
        self.rejected[reason] += n

    def _release(self, author: str, epoch: int, byte_size: int) -> None:
        quota = self._quotas.get((author, epoch))
        if quota is not None:
            quota.batches = max(0, quota.batches - 1)
            quota.nbytes = max(0, quota.nbytes - byte_size)

    # -- housekeeping ---------------------------------------------------------------------------------

    def prune(self, current_epoch: int, now: float) -> None:
        """Forget batch ids and quotas of epochs outside the window, and expired bans."""
        oldest = current_epoch - self.read_epochs  # kept one extra epoch so late polls stay deduped
        self._known = {b: e for b, e in self._known.items() if e >= oldest}
        self._quotas = {k: q for k, q in self._quotas.items() if k[1] >= oldest}
        self._banned_until = {a: t for a, t in self._banned_until.items() if t > now}

    def authors_seen(self) -> int:
        return len(self._authors_seen)

    def banned(self, now: float) -> list[str]:
        return sorted(a for a, t in self._banned_until.items() if t > now)
