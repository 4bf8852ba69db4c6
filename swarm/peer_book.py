"""The peer book: what this node accepts from whom (pure bookkeeping, no I/O, no clock of its own).

It screens each announced batch before it is pulled (ban list, staleness window, deduplication by batch
id, quotas per author and epoch and for all authors together), records the outcome after it is
verified, bans authors of invalid data, of stalled pulls and of rejected rollouts with exponential
backoff, and counts every accepted and rejected batch (rejections by reason).

A batch id becomes known only once bytes hashing to it were verified and accepted: a manifest that
copies another author's fresh id (front-running) is refused on its own merits and cannot block the
genuine batch. Everything kept per author is pruned with the epoch window and bounded in count, so a
flood of fresh identities cannot grow it without bound.

Authors with an accepted batch are "established"; newcomers together get at most ``newcomer_share`` of
each epoch's global quota (the pull slots are split the same way by the caller), so identities created
for a flood cannot starve the peers this node already trades with.

For status pages it also keeps counters per peer (``peer_table``): batches and groups accepted, rejections
by reason, bytes each way, last seen. They are kept apart from the admission state above, bounded by
``MAX_TRACKED_PEERS`` (the least recently seen row goes first) and forgotten after
``PEER_FORGET_SECONDS`` without news, so a status page still shows a peer that went quiet a while ago.

Callers pass ``now`` (seconds, any monotonic clock) and the current epoch, so tests need no sleeping.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

__all__ = ["PeerBook", "PeerRow", "RejectReason"]

MAX_TRACKED_PEERS = 1024  # per-peer counter rows kept at most
PEER_FORGET_SECONDS = 3600.0  # a row unseen (and not banned) this long is dropped
_MAX_IDS_PER_PEER = 8  # libp2p ids remembered per author (bytes served to others count under their own id)


class RejectReason:
    """Labels of rejections decided by ``swarm`` (protocol errors add their own ``reason``)."""

    BANNED = "banned"
    STALE = "stale"
    FUTURE_EPOCH = "future_epoch"
    QUOTA_BATCHES = "quota_batches"
    QUOTA_BYTES = "quota_bytes"
    QUOTA_GLOBAL = "quota_global"
    QUOTA_PAYLOAD = "quota_payload"
    PAYLOAD_TOO_LARGE = "payload_too_large"
    TOO_LARGE = "too_large"
    WRONG_SWARM = "wrong_swarm"
    SIZE_MISMATCH = "size_mismatch"
    HASH_MISMATCH = "hash_mismatch"
    MANIFEST_MISMATCH = "manifest_mismatch"
    DUPLICATE_CONTENT = "duplicate_content"
    UNREACHABLE = "unreachable"
    STALLED = "stalled"
    DROPPED_INBOX_FULL = "inbox_full"


@dataclass
class _Quota:
    batches: int = 0
    nbytes: int = 0
    payload: int = 0


@dataclass
class _PeerStats:
    """Counters of one peer, keyed by its swarm peer id (or by its libp2p id until it publishes)."""

    last_seen: float
    published: bool = False
    batches_accepted: int = 0
    groups_accepted: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    libp2p_ids: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class PeerRow:
    """One peer's counters at one moment (a copy: safe to hand to another thread).

    ``peer_id`` is the author's swarm peer id, or the libp2p id of a peer that pulled from us but whose
    batches we never saw (``published`` False). Times are in the caller's clock (``now``).
    """

    peer_id: str
    published: bool
    batches_accepted: int
    groups_accepted: int
    rejected: dict[str, int]
    bytes_in: int
    bytes_out: int
    last_seen: float
    banned_until: float | None
    libp2p_ids: tuple[str, ...]


@dataclass
class _Peer:
    """What is remembered of one author: last epoch seen, offences, ban, accepted batches."""

    last_epoch: int
    strikes: int = 0
    banned_until: float = float("-inf")
    last_offence: float = float("-inf")
    accepted: int = 0
    stalls_forgiven: int = 0  # stalls forgiven since ``first_forgiven`` (see ``pull_failed``)
    first_forgiven: float = float("-inf")


class PeerBook:
    """Per-author and global quotas, bans, a staleness window and dedup; counters by outcome."""

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
        stall_grace: int = 2,
        max_batches_per_epoch: int | None = None,
        max_bytes_per_epoch: int | None = None,
        max_payload_bytes_per_peer_epoch: int | None = None,
        newcomer_share: float = 0.5,
        max_peers: int = 4096,
    ) -> None:
        if read_epochs < 1 or max_batches_per_peer_epoch < 1 or max_bytes_per_peer_epoch < 1:
            raise ValueError("read_epochs and quotas must be >= 1")
        self.max_batches = max_batches_per_peer_epoch
        self.max_bytes = max_bytes_per_peer_epoch
        self.max_payload = max_payload_bytes_per_peer_epoch or 4 * max_bytes_per_peer_epoch
        self.max_global_batches = max_batches_per_epoch or 64 * max_batches_per_peer_epoch
        self.max_global_bytes = max_bytes_per_epoch or 8 * max_bytes_per_peer_epoch
        self.newcomer_share = newcomer_share
        self.read_epochs = read_epochs
        self.ban_seconds = ban_seconds
        self.ban_backoff = ban_backoff
        self.max_ban_seconds = max_ban_seconds
        self.max_pull_attempts = max_pull_attempts
        self.stall_grace = stall_grace
        self.stalls_forgiven = 0
        self.max_peers = max_peers
        self.accepted = 0
        self.accepted_bytes = 0
        self.rejected: Counter[str] = Counter()
        self.offences: Counter[str] = Counter()
        self._known: dict[str, int] = {}  # batch id -> epoch, for every accepted batch
        self._in_flight: dict[str, tuple[str, bool]] = {}  # batch id -> (author pulled from, newcomer)
        self._attempts: dict[tuple[str, str], tuple[int, int]] = {}  # (author, id) -> (failures, epoch)
        self._quotas: dict[tuple[str, int], _Quota] = {}
        self._epoch_totals: dict[tuple[int, bool], _Quota] = {}  # (epoch, newcomer) -> all authors
        self._peers: dict[str, _Peer] = {}
        self._stats: dict[str, _PeerStats] = {}
        self._libp2p_owner: dict[str, str] = {}  # libp2p id -> author, from manifests' addresses
        self._now = 0.0  # the latest ``now`` a caller passed: when a peer was last seen

    # -- screening, before a pull ------------------------------------------------------------------

    def is_known(self, batch_id: str) -> bool:
        """True for a batch already accepted: any manifest naming it is skipped silently."""
        return batch_id in self._known

    def in_flight(self, batch_id: str) -> bool:
        """True while some manifest naming ``batch_id`` is being pulled (ask again next poll)."""
        return batch_id in self._in_flight

    def is_banned(self, author: str, now: float) -> bool:
        peer = self._peers.get(author)
        return peer is not None and peer.banned_until > now

    def is_established(self, author: str) -> bool:
        """True for an author with an accepted batch still remembered."""
        peer = self._peers.get(author)
        return peer is not None and peer.accepted > 0

    def ban_remaining(self, author: str, now: float) -> float:
        peer = self._peers.get(author)
        return 0.0 if peer is None else max(0.0, peer.banned_until - now)

    def screen(
        self, author: str, batch_id: str, epoch: int, byte_size: int, current_epoch: int, now: float
    ) -> str | None:
        """Decide whether to pull a batch: None (go: in flight, quotas reserved) or the counted reason."""
        self._seen(author, epoch)
        stats = self._stat(author, now, published=True)
        reason = self._screen_reason(author, epoch, byte_size, current_epoch, now)
        if reason is not None:
            self.rejected[reason] += 1
            stats.rejected[reason] += 1
            return reason
        newcomer = not self.is_established(author)
        self._in_flight[batch_id] = (author, newcomer)
        for quota in self._quotas_of(author, epoch, newcomer):
            quota.batches += 1
            quota.nbytes += byte_size
        return None

    def refuse(self, author: str, epoch: int, reason: str, *, offence: bool, now: float) -> str:
        """Reject an announced batch without pulling it (e.g. announced larger than allowed)."""
        self._seen(author, epoch)
        self.rejected[reason] += 1
        self._stat(author, now, published=True).rejected[reason] += 1
        if offence:
            self.punish(author, now, reason)
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
        newcomer = not self.is_established(author)
        share = self.newcomer_share if newcomer else 1.0
        total = self._epoch_total(epoch)
        group = self._epoch_totals.get((epoch, newcomer), _Quota())
        if (
            total.batches + 1 > self.max_global_batches
            or total.nbytes + byte_size > self.max_global_bytes
            or group.batches + 1 > share * self.max_global_batches
            or group.nbytes + byte_size > share * self.max_global_bytes
        ):
            return RejectReason.QUOTA_GLOBAL
        return None

    def charge_payload(self, author: str, epoch: int, payload_bytes: int) -> str | None:
        """Reserve the expanded size of a pulled batch against its author's quota, before decoding it.

        Returns None, or the reason (not counted: the caller rejects the batch with it).
        """
        quota = self._quotas.setdefault((author, epoch), _Quota())
        if quota.payload + payload_bytes > self.max_payload:
            return RejectReason.QUOTA_PAYLOAD
        quota.payload += payload_bytes
        return None

    # -- outcomes, after a pull ---------------------------------------------------------------------

    def received(self, author: str, nbytes: int, now: float) -> None:
        """``nbytes`` of a batch of ``author`` were pulled (whatever the checks then say of them)."""
        self._stat(author, now).bytes_in += nbytes

    def accept(self, author: str, batch_id: str, epoch: int, nbytes: int, *, groups: int = 0) -> None:
        """A pulled batch (of ``groups`` rollout groups) passed every check: its id is known from now on."""
        self._in_flight.pop(batch_id, None)
        self._attempts.pop((author, batch_id), None)
        self._known[batch_id] = epoch
        self._seen(author, epoch).accepted += 1
        self.accepted += 1
        self.accepted_bytes += nbytes
        stats = self._stat(author)
        stats.batches_accepted += 1
        stats.groups_accepted += groups

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
        """A pulled batch failed a check: count it, give back its quota, ban the author if ``offence``.

        The id does not become known: a genuine batch of that id announced by its real author is still
        pulled.
        """
        self._attempts.pop((author, batch_id), None)
        self._release(batch_id, author, epoch, byte_size)
        self.rejected[reason] += 1
        self._stat(author, now).rejected[reason] += 1
        if offence:
            self.punish(author, now, reason)

    def pull_failed(
        self, author: str, batch_id: str, epoch: int, byte_size: int, *, stalled: bool, now: float
    ) -> bool:
        """A pull did not complete. Returns True if the batch may be pulled again.

        A stalled pull (the author's address accepted the stream, then did not deliver in time) is an
        offence, except that an established author (one with an accepted batch) is forgiven
        ``stall_grace`` stalls per ``max_ban_seconds``: an honest peer on an overloaded machine can miss
        ``pull_timeout`` once, and banning it would cut the swarm off from its batches. A forgiven stall
        counts as a failed attempt. Newcomers get no grace, so identities made to stall cost a ban each.
        An unreachable author is retried until ``max_pull_attempts`` failures, then rejected as
        unreachable, an offence too, except that the same grace forgives it to an established author (a
        machine so loaded that its pulls time out, a link that drops for a while: ``scripts/lab/wan_swarm.py``
        saw both). Either way the quota is given back.
        """
        self._release(batch_id, author, epoch, byte_size)
        if stalled and not self._forgive_stall(author, now):
            self._attempts.pop((author, batch_id), None)
            self.rejected[RejectReason.STALLED] += 1
            self._stat(author, now).rejected[RejectReason.STALLED] += 1
            self.punish(author, now, RejectReason.STALLED)
            return False
        failures = self._attempts.get((author, batch_id), (0, epoch))[0] + 1
        if failures >= self.max_pull_attempts:
            self._attempts.pop((author, batch_id), None)
            self.rejected[RejectReason.UNREACHABLE] += 1
            self._stat(author, now).rejected[RejectReason.UNREACHABLE] += 1
            if not self._forgive_stall(author, now):
                self.punish(author, now, RejectReason.UNREACHABLE)
            return False
        self._attempts[(author, batch_id)] = (failures, epoch)
        return True

    def _forgive_stall(self, author: str, now: float) -> bool:
        """Whether a stall of ``author`` is within its grace (and if so, use up one stall of it)."""
        peer = self._peers.get(author)
        if peer is None or peer.accepted <= 0 or self.stall_grace <= 0:
            return False
        if peer.first_forgiven + self.max_ban_seconds < now:
            peer.stalls_forgiven, peer.first_forgiven = 0, now
        if peer.stalls_forgiven >= self.stall_grace:
            return False
        peer.stalls_forgiven += 1
        self.stalls_forgiven += 1
        return True

    def penalize(self, author: str, reason: str, now: float) -> float:
        """An offence found after the batch was accepted (e.g. its rollouts failed the node's checks)."""
        self.rejected[reason] += 1
        self._stat(author, now).rejected[reason] += 1
        return self.punish(author, now, reason)

    def punish(self, author: str, now: float, reason: str = "offence") -> float:
        """Ban ``author``: ``ban_seconds * ban_backoff ** (offences - 1)``, capped. Returns the length.

        Strikes are forgotten after ``max_ban_seconds`` without a new offence.
        """
        peer = self._peers.get(author) or self._add_peer(author, -1)
        if peer.last_offence + self.max_ban_seconds < now:
            peer.strikes = 0
        peer.strikes += 1
        peer.last_offence = now
        length = self._ban_length(peer.strikes)
        peer.banned_until = max(peer.banned_until, now + length)
        self.offences[reason] += 1
        return length

    def note_addresses(self, author: str, libp2p_ids: list[str], now: float) -> None:
        """The libp2p ids an author announced in its manifest: what it pulls from us is counted as its."""
        stats = self._stat(author, now, published=True)
        for lid in libp2p_ids:
            if lid in stats.libp2p_ids or len(stats.libp2p_ids) >= _MAX_IDS_PER_PEER:
                continue
            self._libp2p_owner[lid] = author
            stats.libp2p_ids.add(lid)
            orphan = self._stats.pop(lid, None)  # bytes it pulled before we knew whose they were
            if orphan is not None and lid != author:
                stats.bytes_out += orphan.bytes_out

    def served(self, libp2p_id: str, nbytes: int, now: float) -> None:
        """We served ``nbytes`` of batch data to the peer ``libp2p_id``."""
        owner = self._libp2p_owner.get(libp2p_id)
        stats = self._stat(owner if owner is not None else libp2p_id, now)
        if owner is None:
            stats.libp2p_ids.add(libp2p_id)
        stats.bytes_out += nbytes

    def count(self, reason: str, n: int = 1) -> None:
        """Count a rejection decided elsewhere (a DHT record validator, a full inbox)."""
        self.rejected[reason] += n

    def _stat(self, key: str, now: float | None = None, *, published: bool = False) -> _PeerStats:
        """The counters of ``key``, created (evicting the least recently seen beyond the cap) and touched."""
        if now is not None:
            self._now = max(self._now, now)
        stats = self._stats.get(key)
        if stats is None:
            if len(self._stats) >= MAX_TRACKED_PEERS:
                self._forget_stats(min(self._stats, key=lambda k: self._stats[k].last_seen))
            stats = self._stats[key] = _PeerStats(last_seen=self._now)
        if now is not None:
            stats.last_seen = max(stats.last_seen, now)
        stats.published = stats.published or published
        return stats

    def _forget_stats(self, key: str) -> None:
        stats = self._stats.pop(key)
        for lid in stats.libp2p_ids:
            if self._libp2p_owner.get(lid) == key:
                del self._libp2p_owner[lid]

    def _ban_length(self, strikes: int) -> float:
        return float(min(self.max_ban_seconds, self.ban_seconds * self.ban_backoff ** (strikes - 1)))

    def _release(self, batch_id: str, author: str, epoch: int, byte_size: int) -> None:
        _, newcomer = self._in_flight.pop(batch_id, (author, not self.is_established(author)))
        for quota in self._quotas_of(author, epoch, newcomer):
            quota.batches = max(0, quota.batches - 1)
            quota.nbytes = max(0, quota.nbytes - byte_size)

    def _quotas_of(self, author: str, epoch: int, newcomer: bool) -> list[_Quota]:
        return [
            self._quotas.setdefault((author, epoch), _Quota()),
            self._epoch_totals.setdefault((epoch, newcomer), _Quota()),
        ]

    def _epoch_total(self, epoch: int) -> _Quota:
        parts = [self._epoch_totals.get((epoch, flag), _Quota()) for flag in (False, True)]
        return _Quota(sum(p.batches for p in parts), sum(p.nbytes for p in parts))

    def _seen(self, author: str, epoch: int) -> _Peer:
        peer = self._peers.get(author)
        if peer is None:
            return self._add_peer(author, epoch)
        peer.last_epoch = max(peer.last_epoch, epoch)
        return peer

    def _add_peer(self, author: str, epoch: int) -> _Peer:
        if len(self._peers) >= self.max_peers:
            self._evict()
        peer = self._peers[author] = _Peer(last_epoch=epoch)
        return peer

    def _evict(self) -> None:
        """Forget a quarter of the authors: first those without strikes or accepted batches, oldest first.

        Only a flood of fresh identities gets here; forgetting one of them forgets its ban too, which
        costs nothing an attacker with free identities did not have already.
        """
        order = sorted(self._peers, key=lambda a: (self._peers[a].strikes > 0, self._peers[a].accepted > 0,
                                                   self._peers[a].last_epoch))
        for author in order[: max(1, len(order) // 4)]:
            del self._peers[author]

    # -- housekeeping ---------------------------------------------------------------------------------

    def prune(self, current_epoch: int, now: float) -> None:
        """Forget batch ids, quotas and attempts of epochs outside the window, and quiet authors.

        An author is forgotten once it was last seen outside the window and has no ban and no strike
        left to remember; every structure here is then bounded by what the window's quotas let in.
        """
        oldest = current_epoch - self.read_epochs  # kept one extra epoch so late polls stay deduped
        self._known = {b: e for b, e in self._known.items() if e >= oldest}
        self._quotas = {k: q for k, q in self._quotas.items() if k[1] >= oldest}
        self._epoch_totals = {k: q for k, q in self._epoch_totals.items() if k[0] >= oldest}
        self._attempts = {k: v for k, v in self._attempts.items() if v[1] >= oldest}
        self._peers = {
            a: p
            for a, p in self._peers.items()
            if p.last_epoch >= oldest or p.banned_until > now or p.last_offence + self.max_ban_seconds >= now
        }
        idle = [k for k, st in self._stats.items() if st.last_seen < now - PEER_FORGET_SECONDS and not self.is_banned(k, now)]
        for key in idle:
            self._forget_stats(key)

    def authors_seen(self) -> int:
        """Authors remembered now (seen in the window, banned, or with strikes)."""
        return len(self._peers)

    def banned(self, now: float) -> list[str]:
        return sorted(a for a, p in self._peers.items() if p.banned_until > now)

    def peer_table(self, now: float) -> list[PeerRow]:
        """Every tracked peer's counters, most recently seen first."""
        rows = []
        for key, st in self._stats.items():
            peer = self._peers.get(key)
            until = peer.banned_until if peer is not None and peer.banned_until > now else None
            rows.append(PeerRow(
                peer_id=key,
                published=st.published,
                batches_accepted=st.batches_accepted,
                groups_accepted=st.groups_accepted,
                rejected=dict(st.rejected),
                bytes_in=st.bytes_in,
                bytes_out=st.bytes_out,
                last_seen=st.last_seen,
                banned_until=until,
                libp2p_ids=tuple(sorted(st.libp2p_ids)),
            ))
        rows.sort(key=lambda r: r.last_seen, reverse=True)
        return rows
