"""Batch transfers keep a minimum pace instead of a fixed deadline (``pull_timeout``, ``pull_min_rate``).

A large batch from a peer on a slow but steady link takes longer than ``pull_timeout`` and is still
accepted, its author unpunished (the wide-area runs of ``scripts/lab/wan_swarm.py`` pull 512 KiB batches over
lossy home links for up to 10 s); a peer that trickles bytes to hold a pull slot falls behind the pace,
is cut off about ``pull_timeout`` after its stream opened, and is banned for stalling. A raw hostile peer
(``tests.swarm.attacker``) serves the bytes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace

import pytest

from protocol.codec import encode_batch
from protocol.identity import Identity
from protocol.samples import realistic_batch
from swarm.transport import SwarmTransport
from tests.swarm.attacker import Attacker, peer_id_of, wait_until
from tests.swarm.conftest import SWARM_ID, fast_settings, started_transport

SETTINGS = {"epoch_seconds": 600.0, "request_timeout": 1.5, "pull_timeout": 2.0, "pull_min_rate": 64 * 1024,
            "ban_seconds": 120.0}


@pytest.fixture
def victim() -> Iterator[SwarmTransport]:
    yield from started_transport(fast_settings(**SETTINGS))


@pytest.fixture
def attacker(victim: SwarmTransport) -> Iterator[Attacker]:
    peer = Attacker(SWARM_ID, victim.visible_multiaddrs())
    try:
        yield peer
    finally:
        peer.close()


def _stat(victim: SwarmTransport, key: str) -> int:
    value = victim.stats()[key]
    assert isinstance(value, int)
    return value


def _offences(victim: SwarmTransport) -> dict[str, int]:
    value = victim.stats()["offences"]
    assert isinstance(value, dict)
    return value


def _announce(victim: SwarmTransport, attacker: Attacker, author: Identity, n_tokens: int) -> int:
    """File one manifest of a batch of ``author`` served by ``attacker``; the batch's signed size."""
    batch = replace(realistic_batch(author.public_key, n_groups=8, n_completions=8, n_tokens=n_tokens),
                    swarm_id=SWARM_ID)
    data = encode_batch(replace(batch, address=tuple(attacker.maddrs)), author)
    record = attacker.manifest_record(author, batch, epoch=victim.current_epoch(), ttl=120.0)
    assert attacker.store_many(peer_id_of(victim), [record]) == [True]
    return len(data)


def test_a_large_batch_over_a_slow_steady_link_gets_the_time_it_needs(victim: SwarmTransport,
                                                                       attacker: Attacker) -> None:
    attacker.mode, attacker.rate = "slow", 96 * 1024  # above the 64 KiB/s minimum, below the size per pull_timeout
    started = time.monotonic()
    size = _announce(victim, attacker, Identity.generate(), n_tokens=1000)
    assert size / attacker.rate > 2 * SETTINGS["pull_timeout"]  # a fixed 2 s deadline could never pull it
    assert wait_until(lambda: _stat(victim, "batches_accepted") == 1, timeout=60), victim.stats()
    assert time.monotonic() - started > size / attacker.rate  # it really was served that slowly
    # Never taken for a stall. A pull may fail once for another reason on a loaded machine and be tried again
    # (one full-suite run at load 5.7 had one failure, then the batch was accepted): the author is unpunished.
    assert _stat(victim, "pulls_stalled") == 0 and _stat(victim, "pulls_failed") <= 1
    assert not _offences(victim) and _stat(victim, "peers_banned") == 0


def test_a_trickling_peer_is_cut_off_after_pull_timeout_and_banned(victim: SwarmTransport,
                                                                    attacker: Attacker) -> None:
    attacker.mode = "trickle"  # one byte every 0.5 s: every read makes progress, the pace is far too slow
    started = time.monotonic()
    _announce(victim, attacker, Identity.generate(), n_tokens=40)
    assert wait_until(lambda: _offences(victim).get("stalled", 0) == 1, timeout=30), victim.stats()
    # The pull and its retry over a fresh connection, each cut off about pull_timeout after it opened.
    assert time.monotonic() - started < 4 * SETTINGS["pull_timeout"] + 8
    assert _stat(victim, "stalls_retried") == 1 and _stat(victim, "pulls_stalled") == 1
    assert _stat(victim, "peers_banned") == 1 and _stat(victim, "batches_accepted") == 0
