"""A stalled pull is an offence only if its peer can still be dialed afresh.

Two raw hostile peers (``tests.swarm.attacker``) each announce one batch at their own address and stall
the victim's pull. One stays up: a fresh connection to it succeeds, so the stall was aimed at the victim
and its author is banned. The other goes away while the victim waits on it (as a crashed, frozen or
partitioned peer does): it cannot be dialed again, so its author is not punished and the pull is only
counted as unreachable. A stall is tried once more over the fresh connection before it counts (the old
connection may have been dead), and a peer that has delivered before is forgiven a stall
(``stall_grace``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from protocol.identity import Identity
from swarm.transport import SwarmTransport
from tests.swarm.attacker import Attacker, _with, peer_id_of, wait_until
from tests.swarm.batches import make_batch
from tests.swarm.conftest import SWARM_ID, fast_settings, started_transport

SETTINGS = {"epoch_seconds": 600.0, "request_timeout": 1.5, "pull_timeout": 2.0, "ban_seconds": 120.0,
            "max_pull_attempts": 20}  # the peer that went away is retried, not banned as unreachable, meanwhile


@pytest.fixture
def victim() -> Iterator[SwarmTransport]:
    yield from started_transport(fast_settings(**SETTINGS))


def _int(victim: SwarmTransport, key: str) -> int:
    value = victim.stats()[key]
    assert isinstance(value, int)
    return value


def _count(victim: SwarmTransport, key: str, reason: str) -> int:
    value = victim.stats()[key]
    assert isinstance(value, dict)
    return int(value.get(reason, 0))


def test_only_a_peer_that_can_be_dialed_again_is_punished_for_a_stall(victim: SwarmTransport) -> None:
    attackers: list[Attacker] = []
    try:
        for _ in range(2):
            attacker = Attacker(SWARM_ID, victim.visible_multiaddrs())
            attacker.mode = "stall"
            attackers.append(attacker)
        present, gone = attackers
        epoch = victim.current_epoch()

        # The peer that goes away: it takes the victim's stream, then its p2pd shuts down mid-pull.
        author = Identity.generate()
        record = gone.manifest_record(author, make_batch(author), epoch=epoch)
        assert gone.store_many(peer_id_of(victim), [record]) == [True]
        assert wait_until(lambda: gone.requests >= 1, timeout=20), "the victim never asked for the batch"
        attackers.remove(gone)
        gone.close()
        assert wait_until(lambda: _int(victim, "pulls_unreachable") >= 1, timeout=20), victim.stats()
        assert _int(victim, "pulls_stalled") == 0
        assert _count(victim, "offences", "stalled") == 0 and _int(victim, "peers_banned") == 0

        # The peer that stays up and stalls: reachable afresh, so the stall is its author's offence.
        staller = Identity.generate()
        record = present.manifest_record(staller, make_batch(staller), epoch=epoch)
        assert present.store_many(peer_id_of(victim), [record]) == [True]
        assert wait_until(lambda: _int(victim, "pulls_stalled") >= 1, timeout=20), victim.stats()
        assert _count(victim, "offences", "stalled") == 1 and _int(victim, "peers_banned") == 1
        assert _int(victim, "pulls_unreachable") == 1
    finally:
        for attacker in attackers:
            attacker.close()


def test_a_stall_is_retried_afresh_and_an_established_peer_forgiven_once_then_banned() -> None:
    """A stream can die with its connection (one stuck in TCP back-off after a partition heals): a stalled
    pull is tried once more over a fresh connection, and only a stall of that one too counts. An honest
    peer on an overloaded machine can still miss ``pull_timeout`` twice: a peer with an accepted batch is
    forgiven ``stall_grace`` such stalls (here 1), its batch pulled again; the next one is an offence."""
    victim = SwarmTransport(fast_settings(**SETTINGS, stall_grace=1), Identity.generate())
    attacker: Attacker | None = None
    try:
        victim.start(wait=True)
        attacker = Attacker(SWARM_ID, victim.visible_multiaddrs())
        author = Identity.generate()
        epoch = victim.current_epoch()

        def announce(seq: int) -> None:
            batch = _with(make_batch(author, index=seq), seq=seq)
            record = attacker.manifest_record(author, batch, epoch=epoch)
            assert attacker.store_many(peer_id_of(victim), [record]) == [True]

        announce(1)
        assert wait_until(lambda: _int(victim, "batches_accepted") >= 1, timeout=20), victim.stats()
        attacker.mode = "stall_once"  # the pull stalls; its retry over a fresh connection is served
        announce(2)
        assert wait_until(lambda: _int(victim, "batches_accepted") >= 2, timeout=30), victim.stats()
        assert _int(victim, "stalls_retried") == 1 and _int(victim, "pulls_stalled") == 0
        assert _int(victim, "stalls_forgiven") == 0 and _count(victim, "offences", "stalled") == 0

        attacker.mode = "stall_twice"  # the pull and its retry stall: forgiven, and pulled again later
        announce(3)
        assert wait_until(lambda: _int(victim, "batches_accepted") >= 3, timeout=30), victim.stats()
        assert _int(victim, "pulls_stalled") == 1 and _int(victim, "stalls_forgiven") == 1
        assert _count(victim, "offences", "stalled") == 0 and _int(victim, "peers_banned") == 0

        attacker.mode = "stall"  # grace used up: the next stall (and its retry) bans
        announce(4)
        assert wait_until(lambda: _count(victim, "offences", "stalled") == 1, timeout=30), victim.stats()
        assert _int(victim, "peers_banned") == 1 and _int(victim, "stalls_forgiven") == 1
        assert _int(victim, "batches_accepted") == 3
    finally:
        if attacker is not None:
            attacker.close()
        victim.close()
