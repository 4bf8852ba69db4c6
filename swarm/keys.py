"""Where manifests live in the DHT: epochs, keys and owner-bound subkeys (pure functions).

A manifest of epoch ``e`` by author ``p`` is stored under the key ``<swarm>/rollouts/e<e>/s<shard(p)>``
and the subkey ``<p>/<seq mod SLOTS_PER_AUTHOR>``. hivemind returns everything under one key in a single
reply of at most about 4 MiB, so both factors are bounded here, the same on every node:

* each author holds at most ``SLOTS_PER_AUTHOR`` subkeys per key (a later batch reuses a slot);
* authors are spread over ``shards`` keys per epoch by a hash of their peer id (``KEY_SHARDS`` = 4 unless
  the swarm sets ``swarm.key_shards``; every member must use the swarm's value).

With manifests of at most 8 KiB, a key's reply stays under 4 MiB up to 64 authors per shard even if every
manifest were of maximal size; real manifests are about 350 bytes (a key's reply under 4 MiB up to about
1,500 authors per shard). A large swarm uses more shards, and its members read a few of them
(``shards_to_read``): what one node reads, and what the nodes holding a key serve, then stays bounded
whatever the swarm's size (``docs/scaling.md``).
"""

from __future__ import annotations

import hashlib
import math
import random

__all__ = [
    "KEY_SHARDS",
    "SLOTS_PER_AUTHOR",
    "epoch_at",
    "epochs_to_read",
    "manifest_key",
    "manifest_subkey",
    "shard_of",
    "shards_to_read",
    "split_subkey",
]

KEY_SHARDS = 4
SLOTS_PER_AUTHOR = 8


def epoch_at(dht_time: float, epoch_seconds: float) -> int:
    """``floor(dht_time / epoch_seconds)``."""
    return math.floor(dht_time / epoch_seconds)


def epochs_to_read(current: int, read_epochs: int) -> list[int]:
    """The current epoch and the ``read_epochs - 1`` before it, newest first, never negative."""
    return [e for e in range(current, current - read_epochs, -1) if e >= 0]


def shard_of(peer_id: str, shards: int = KEY_SHARDS) -> int:
    """The key shard (of ``shards``) an author's manifests go to."""
    digest = hashlib.sha256(peer_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") % shards


def shards_to_read(reader: str, epoch: int, shards: int, read_shards: int) -> list[int]:
    """The shards of ``epoch`` that node ``reader`` reads: all of them when ``read_shards`` is 0 or at
    least ``shards``, else ``read_shards`` of them drawn at random, the same ones for the whole epoch (a
    seed of reader and epoch), other ones the next epoch and at other readers."""
    if read_shards <= 0 or read_shards >= shards:
        return list(range(shards))
    return sorted(random.Random(f"{reader}/{epoch}").sample(range(shards), read_shards))


def manifest_key(swarm_id: str, epoch: int, shard: int) -> str:
    """The DHT key holding one shard of one epoch's manifests."""
    return f"{swarm_id}/rollouts/e{epoch}/s{shard}"


def manifest_subkey(peer_id: str, seq: int) -> str:
    """The owner-bound subkey of an author's manifest with sequence number ``seq``."""
    return f"{peer_id}/{seq % SLOTS_PER_AUTHOR}"


def split_subkey(subkey: str) -> tuple[str, int] | None:
    """``(peer_id, slot)`` of a well-formed subkey, else None."""
    peer_id, sep, slot = subkey.rpartition("/")
    if not sep or not peer_id or not slot.isdigit() or len(slot) > 3:
        return None
    value = int(slot)
    return (peer_id, value) if value < SLOTS_PER_AUTHOR else None
