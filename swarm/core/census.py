"""Census: a host's read of the epochs its poll no longer reads, to count what it missed.

A host counts the batches members announce by reading their manifests (``pull``'s poll: the last
``read_epochs`` epochs). A host that was down, killed or restarted missed the epochs in between, and what
it had counted of the epoch in progress since its last save. Those manifests are still in the DHT, on the
members that are DHT servers, until they expire (``manifest_ttl``). So whenever the host has a neighbour
again, and once an epoch after that, it reads every shard of the older epochs its member table keeps (those
since the table was made and at most ``max_manifest_ttl`` old) and notes each manifest there. Each batch is
counted once by its id, so a manifest read again changes nothing. Nothing is pulled: a batch of an epoch the
host missed counts as announced, not as verified.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time

from hivemind.utils import get_dht_time

from swarm.core.base import HEALTH_PERIOD, CoreBase
from swarm.keys import epoch_at, manifest_key

logger = logging.getLogger(__name__)


class CensusMixin(CoreBase):
    """The census loop of a host's ``SwarmCore`` (run only where ``shared.members`` is set)."""

    async def _census_loop(self) -> None:
        last, alone = -math.inf, True
        while True:
            await asyncio.sleep(HEALTH_PERIOD)
            if not self._neighbours():
                alone = True
                continue
            if alone or time.monotonic() - last >= self.settings.epoch_seconds:
                alone, last = False, time.monotonic()
                await self.census_once()

    def census_epochs(self, current: int) -> list[int]:
        """The epochs a census reads: older than the poll's, kept by the member table, since the table was made,
        and young enough for their manifests to be alive."""
        members = self.shared.members
        if members is None:
            return []
        s = self.settings
        alive = math.ceil(s.max_manifest_ttl / s.epoch_seconds) + 1
        oldest = max(current - alive, current - members.keep_epochs + 1, members.first_epoch(s.epoch_seconds), 0)
        return list(range(oldest, current - s.read_epochs + 1))

    async def census_once(self) -> int:
        """Read every shard of ``census_epochs`` once and note each manifest in the member table; how many
        batches were new to it."""
        members = self.shared.members
        current = epoch_at(get_dht_time(), self.settings.epoch_seconds)
        epochs = self.census_epochs(current)
        if members is None or not epochs:
            return 0
        where = {manifest_key(self.settings.swarm_id, epoch, shard): (epoch, shard)
                 for epoch in epochs for shard in range(self.settings.key_shards)}
        found = await self._lookup(list(where))
        new = 0
        for key, result in found.items():
            if result is None or not isinstance(result.value, dict):
                continue
            epoch, shard = where[key]
            for subkey, entry in result.value.items():
                if not isinstance(entry.value, bytes):
                    continue
                manifest = self.validator.read_entry(epoch, shard, subkey, entry.value, entry.expiration_time)
                if manifest is not None and manifest.author != self.identity.public_key:
                    new += members.manifest_seen(manifest, min(time.time(), manifest.created_at))
        self.shared.add("census_reads")
        self.shared.add("census_new", new)
        if new:
            logger.info("census of epochs %d-%d: %d batch(es) announced while this host did not read them",
                        epochs[0], epochs[-1], new)
        return new
