"""Pulling: poll the manifest keys of the recent epochs (each key on its own, every entry checked again
by the validator), screen new manifests with the peer book, pull the batches from their authors (a few
at a time per author, newcomers at most ``newcomer_share`` of the slots, each pull bounded in total
time), verify them (size, hash, expanded size charged before decoding, signature, manifest match,
content not seen before) and queue them. The screening and verification steps are ``swarm.intake``'s,
shared with the in-process hub.

A stalled pull is told apart from an unreachable author: an author that takes a fresh connection and
stalls again did it on purpose and is banned; one that cannot be dialed any more is not.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from dataclasses import dataclass

from hivemind.p2p import PeerID
from hivemind.utils import get_dht_time

from protocol.errors import ProtocolError
from protocol.identity import peer_id_from_public_key
from protocol.records import Manifest
from swarm.core.base import LEN_BYTES, NETWORK_ERRORS, CoreBase, by_peer, libp2p_ids
from swarm.hivemind_compat import dht_neighbours, disconnect
from swarm.intake import (
    DEFER,
    KNOWN,
    check_bytes,
    check_decoded,
    decode_with_digests,
    decoded_cost,
    fresh_groups,
    screen,
    settle,
)
from swarm.keys import epoch_at, epochs_to_read, manifest_key, shards_to_read
from swarm.peer_book import RejectReason

logger = logging.getLogger(__name__)

_MAX_PULL_SOURCES = 4  # listed peers tried for one pull


@dataclass
class PullProgress:
    """Where a pull stands, so a time-out can tell a stalling author from an unreachable one."""

    reading_author: bool = False  # a stream to the author's address is open
    stalled: bool = False  # the author's address took a stream and did not deliver
    peer: PeerID | None = None  # the listed peer last read from
    source: str = ""  # where the bytes came from: "local" (held here), "listed" (a listed address), "neighbour"
    error: str = ""  # why the last source failed (dial, open, not_held, read, pace, bound), for the trace



class PullMixin(CoreBase):
    """The collect loop of ``SwarmCore``: poll, screen, pull, verify."""

    async def _collect_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.collect_interval)
            await self.poll_once()

    async def poll_once(self) -> None:
        """Read the recent manifest keys once and start pulls for new, admissible batches.

        Every entry read is re-validated here: hivemind validates what peers send, not what it reads
        from its own storage.
        """
        started = time.monotonic()
        current = epoch_at(get_dht_time(), self.settings.epoch_seconds)
        where = {
            manifest_key(self.settings.swarm_id, epoch, shard): (epoch, shard)
            for epoch in epochs_to_read(current, self.settings.read_epochs)
            for shard in shards_to_read(self.identity.peer_id, epoch, self.settings.key_shards,
                                        self.settings.read_shards)
        }
        found = await self._lookup(list(where))
        with self.shared.lock:
            self.shared.counters["polls"] += 1
            self.shared.counters["poll_ms"] += int(1000 * (time.monotonic() - started))
        for key, result in found.items():
            if result is None or not isinstance(result.value, dict):
                continue
            epoch, shard = where[key]
            for subkey, entry in result.value.items():
                self._consider(epoch, shard, subkey, entry.value, entry.expiration_time, current)

    def _consider(self, epoch: int, shard: int, subkey: object, value: object, expiration: float,
                  current: int) -> None:
        """Check an entry read from the DHT once, and screen (and pull) the batch it announces."""
        if not isinstance(value, bytes):
            token = (epoch, shard, repr(subkey)[:128], repr(expiration))  # counted once, not every poll
            if token not in self._bad_entries:
                self._bad_entries[token] = epoch
                self.validator.read_entry(epoch, shard, subkey, value, expiration)
            return
        if value in self._seen_manifests:
            return
        deferred = self._deferred.pop(value, None)
        manifest = deferred or self.validator.read_entry(epoch, shard, subkey, value, expiration)
        members = self.shared.members
        if members is not None and deferred is None and manifest is not None and manifest.author != self.identity.public_key:
            members.manifest_seen(manifest, time.time())
        if manifest is None or manifest.author == self.identity.public_key:
            self._seen_manifests[value] = (current, "")
        elif self._screen_and_pull(manifest, current):
            self._seen_manifests[value] = (current, manifest.batch_id)
        else:
            self._deferred[value] = manifest  # asked again at the next poll, without decoding it again

    def _screen_and_pull(self, manifest: Manifest, current: int) -> bool:
        """Screen an announced batch and start its pull; False if it must be asked about again later.

        A batch id is known only once bytes hashing to it were accepted. While another manifest naming
        the same id is being pulled, or no pull slot is free for this author, the decision waits.
        """
        author = peer_id_from_public_key(manifest.author)
        book = self.shared.peer_book
        with self.shared.lock:
            now = time.monotonic()
            if not book.is_known(manifest.batch_id) and not book.in_flight(manifest.batch_id):
                book.note_addresses(author, libp2p_ids(manifest.address), now)
            newcomer = not book.is_established(author)
            reason = screen(book, manifest, self.limits, current_epoch=current, now=now,
                            may_start=self._slot_free)
        if reason == DEFER:
            return False
        if reason is not None:
            if reason != KNOWN:
                logger.debug("skipped batch %s of %s: %s", manifest.batch_id[:12], author[:12], reason)
            return True
        self._running_pulls[author] += 1
        if newcomer:
            self._newcomer_pulls += 1
        task = asyncio.create_task(self._pull(manifest, author, newcomer))
        self._pulls.add(task)
        task.add_done_callback(self._pulls.discard)
        return True

    def _slot_free(self, author: str, newcomer: bool) -> bool:
        """Whether a pull for ``author`` may start: a bounded number per author and for newcomers."""
        total = self.settings.max_concurrent_pulls
        if sum(self._running_pulls.values()) >= total:
            return False
        if newcomer and self._newcomer_pulls >= max(1, int(total * self.settings.newcomer_share)):
            return False
        return self._running_pulls[author] < self.settings.max_pulls_per_author

    async def _pull(self, manifest: Manifest, author: str, newcomer: bool) -> None:
        try:
            await self._pull_and_verify(manifest, author)
        finally:
            self._running_pulls[author] -= 1
            if self._running_pulls[author] <= 0:
                del self._running_pulls[author]
            if newcomer:
                self._newcomer_pulls -= 1

    async def _pull_and_verify(self, manifest: Manifest, author: str) -> None:
        started = time.monotonic()
        for attempt in range(2):
            progress = PullProgress()
            data, from_author = await self._bounded_fetch(manifest, progress)
            if data is not None or not progress.stalled:
                break
            if not await self._reachable(manifest, progress.peer):
                # A fresh connection cannot even be made: a partition, a crash or a frozen process, not a
                # stall aimed at us. Banning it would keep its batches out long after the network heals.
                progress.stalled = False
                self.shared.add("pulls_unreachable")
                break
            if attempt == 0:
                # The stream may have died with its connection: after a partition heals, a TCP connection
                # opened before it can sit in retransmission back-off for seconds. So the pull is tried
                # once more over the fresh connection; a peer that stalls that one too does it on purpose.
                self.shared.add("stalls_retried")
        book = self.shared.peer_book
        if data is None:
            with self.shared.lock:
                retry = book.pull_failed(author, manifest.batch_id, manifest.epoch, manifest.byte_size,
                                         stalled=progress.stalled, now=time.monotonic())
            self.shared.add("pulls_stalled" if progress.stalled else "pulls_failed")
            self.shared.trace.event("fail", author=author[:16], id=manifest.batch_id[:16], stalled=progress.stalled,
                                    retry=retry, why=progress.error, pull_s=round(time.monotonic() - started, 4))
            logger.debug("pull of %s from %s failed (stalled: %s, retry: %s)", manifest.batch_id[:12],
                         author[:12], progress.stalled, retry)
            if retry:
                self._forget_manifest(manifest)
            return
        pulled = time.monotonic() - started
        reason, offence, groups = await self._verify(manifest, author, data, from_author)
        with self.shared.lock:
            self.shared.counters["bytes_in"] += len(data)  # pulled, whatever the checks say of it
            book.received(author, len(data), time.monotonic())
            settle(book, manifest, len(data), reason, offence=offence, now=time.monotonic(), groups=groups)
        # traced once counted: a reader that sees "acc" finds the batch in the node's counters
        self.shared.trace.event(
            "acc" if reason is None else "rej", author=author[:16], id=manifest.batch_id[:16], seq=manifest.seq,
            epoch=manifest.epoch, created=round(manifest.created_at, 4), bytes=len(data), pull_s=round(pulled, 4),
            src=progress.source, **({} if reason is None else {"reason": reason, "offence": offence}))
        if reason is not None:
            logger.debug("rejected batch %s of %s: %s", manifest.batch_id[:12], author[:12], reason)

    async def _bounded_fetch(self, manifest: Manifest, progress: PullProgress) -> tuple[bytes | None, bool]:
        """``_fetch`` within one bound on the whole pull (every source), however the peers pace their bytes:
        the time one transfer of the announced size may take (``transfer_seconds``) and ``pull_timeout``
        more for dialing the sources."""
        bound = self.transfer_seconds(min(manifest.byte_size, self.limits.max_compressed_bytes)) + self.settings.pull_timeout
        try:
            return await asyncio.wait_for(self._fetch(manifest, progress), bound)
        except asyncio.TimeoutError:
            progress.stalled = progress.stalled or progress.reading_author
            progress.error = "bound"
            return None, False

    def _forget_manifest(self, manifest: Manifest) -> None:
        """Let the next poll see this manifest again (a pull to retry)."""
        stale = [raw for raw, (_, bid) in self._seen_manifests.items() if bid == manifest.batch_id]
        for raw in stale:
            del self._seen_manifests[raw]

    async def _verify(
        self, manifest: Manifest, author: str, data: bytes, from_author: bool
    ) -> tuple[str | None, bool, int]:
        """``(None, False, groups queued)`` if ``data`` is the batch ``manifest`` announced (then it is held
        and queued), else ``(reason, whether it is an offence of the manifest's author, 0)``.

        The steps are ``swarm.intake``'s (``verify_now`` composes the same ones without an event loop);
        here decoding runs in the executor, one batch at a time.
        """
        reason, offence, payload = check_bytes(manifest, data, self.settings, self.limits, from_author=from_author)
        if reason is None:
            with self.shared.lock:
                reason = self.shared.peer_book.charge_payload(author, manifest.epoch, payload)
        if reason is not None:
            return reason, offence, 0
        loop = asyncio.get_running_loop()
        async with self._decode_slot:  # one decode at a time: bounded memory, and the GIL allows no more
            try:
                batch, digests = await loop.run_in_executor(None, decode_with_digests, data, self.limits)
            except ProtocolError as exc:
                return exc.reason, True, 0
        reason = check_decoded(manifest, batch, swarm_id=self.settings.swarm_id)
        if reason is not None:
            return reason, True, 0
        fresh, dropped = fresh_groups(batch, digests, self._digests, manifest.epoch)
        if fresh is None:
            return RejectReason.DUPLICATE_CONTENT, False, 0
        if dropped:
            self.shared.add("duplicate_groups", dropped)
        self.hold(manifest.batch_id, data)
        if self.shared.members is not None:  # a host trains on nothing: it only notes who sent what
            self.shared.members.batch_seen(manifest.batch_id, fresh, time.time())
        else:
            self.shared.push_batch(fresh, decoded_cost(payload))
        return None, False, len(fresh.groups)

    async def _fetch(self, manifest: Manifest, progress: PullProgress) -> tuple[bytes | None, bool]:
        """A batch's bytes: held here already, else pulled from the peers its signed address list names
        (the author, or the holders it handed the batch to: its delegates), else from a few DHT neighbours.

        Returns ``(data or None, whether it came from a listed address or from here)``.
        """
        local = self._local(manifest.batch_id)
        if local is not None:
            progress.source = "local"
            return local, True
        limit = min(manifest.byte_size, self.limits.max_compressed_bytes)
        listed = by_peer(manifest.address)
        for peer_id, addrs in list(listed.items())[:_MAX_PULL_SOURCES]:
            with self.shared.lock:
                gone = self.shared.book.failed_last(peer_id.to_base58())
            if gone and await self._port_closed(addrs[0]):  # a holder that went away: no p2pd failure for it
                progress.error = "dial"
                continue
            if not await self._dial(peer_id, addrs):
                progress.error = "dial"
                self._unreachable(peer_id)
                continue
            data = await self._fetch_from(peer_id, manifest.batch_id, limit, progress, author=True)
            if data is not None:
                progress.source = "listed"
                # Delivered at a listed address: if it is a DHT server too (never a member behind NAT, which
                # may answer over a connection it opened itself), one that accepts connections there.
                if peer_id.to_base58() in self._neighbours():
                    await self._confirm_met(peer_id, addrs)
                return data, True
            if progress.stalled:
                return None, False
        others = [p for p in dht_neighbours(self.dht) if p not in listed]
        for peer_id in random.sample(others, min(2, len(others))):
            data = await self._fetch_from(peer_id, manifest.batch_id, limit, progress, author=False)
            if data is not None:
                progress.source = "neighbour"
                return data, False
        return None, False

    async def _fetch_from(
        self, peer_id: PeerID, bid: str, limit: int, progress: PullProgress, *, author: bool
    ) -> bytes | None:
        timeout = self.settings.request_timeout
        started = asyncio.get_running_loop().time()
        try:
            _, reader, writer = await asyncio.wait_for(
                self.p2p.call_binary_stream_handler(peer_id, self._handler), timeout
            )
        except NETWORK_ERRORS as exc:
            logger.debug("could not open a stream to %s: %r", peer_id, exc)
            progress.error = "open"
            return None
        progress.reading_author = author
        if author:
            progress.peer = peer_id
        try:
            writer.write(bid.encode("ascii"))
            await asyncio.wait_for(writer.drain(), timeout)
            size = int.from_bytes(await asyncio.wait_for(reader.readexactly(LEN_BYTES), timeout), "big")
            if size == 0:
                progress.error = "not_held"
                return None
            size = min(size, limit + 1)  # more than announced is read just far enough to be rejected
            return await self._read_paced(reader, size, started)
        except NETWORK_ERRORS as exc:
            # The author's address took the stream and then did not deliver: a stall, whatever the cause.
            progress.stalled = progress.stalled or author
            progress.error = "pace" if "transfer below" in str(exc) else "read"
            logger.debug("pull of %s from %s failed: %r", bid[:12], peer_id, exc)
            return None
        finally:
            progress.reading_author = False
            writer.close()

    async def _reachable(self, manifest: Manifest, peer_id: PeerID | None) -> bool:
        """After a stalled pull: whether ``peer_id`` can still be reached over a fresh connection.

        The old connection is dropped and the peer dialed again at its listed addresses. A peer that
        takes a new connection and then stalled our stream did it on purpose; one that cannot be dialed
        any more is on the other side of a partition, crashed or frozen (its stall is no offence).
        """
        if peer_id is None:
            return True
        with contextlib.suppress(*NETWORK_ERRORS):
            await asyncio.wait_for(disconnect(self.p2p, peer_id), self.settings.request_timeout)
        return await self._dial(peer_id, by_peer(manifest.address).get(peer_id, []))
