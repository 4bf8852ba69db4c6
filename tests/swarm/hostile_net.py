"""The three-party network the hostile-peer tests share: a victim transport, an honest transport joined to
it, and a raw hivemind ``Attacker`` dialed to the victim, with helpers to read the victim's counters."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

from protocol.identity import Identity
from swarm.transport import SwarmTransport
from tests.swarm.attacker import Attacker, peer_id_of, wait_until
from tests.swarm.batches import make_batch
from tests.swarm.conftest import SWARM_ID, fast_settings, p2pd_pid


@dataclasses.dataclass
class HostileNet:
    victim: SwarmTransport
    honest: SwarmTransport
    attacker: Attacker

    def received_from_honest(self, text: str, timeout: float = 15.0) -> bool:
        """Publish a batch from the honest node and wait until the victim collected it."""
        self.honest.publish(make_batch(self.honest.identity, text=text))
        return self.wait_for_text(text, timeout)

    def wait_for_text(self, text: str, timeout: float = 15.0) -> bool:
        got: list[str] = []

        def poll() -> bool:
            for batch in self.victim.collect():
                assert batch.author == self.honest.identity.public_key, "a batch of the attacker got through"
                got.extend(r.completion for g in batch.groups for r in g.rollouts)
            return text in got

        return wait_until(poll, timeout)

    def rejected(self) -> dict[str, int]:
        value = self.victim.stats()["batches_rejected"]
        assert isinstance(value, dict)
        return value

    def offences(self) -> dict[str, int]:
        value = self.victim.stats()["offences"]
        assert isinstance(value, dict)
        return value

    def file(self, records: list[tuple[str, bytes, float, str]]) -> None:
        """Store manifests at the victim (valid records: every author files under its own subkey)."""
        assert self.attacker.store_many(peer_id_of(self.victim), records) == [True] * len(records)


@contextlib.contextmanager
def hostile_net(settings: dict[str, Any], *, established: bool = False) -> Iterator[HostileNet]:
    """Start the three parties (closed on exit, whatever happens); ``established``: the honest node has
    had one batch accepted, so it is an established author from then on."""
    victim = SwarmTransport(fast_settings(**settings), Identity.generate())
    honest: SwarmTransport | None = None
    attacker: Attacker | None = None
    try:
        victim.start(wait=True)
        p2pd_pid(victim)
        honest = SwarmTransport(fast_settings(initial_peers=victim.visible_multiaddrs(), **settings),
                                Identity.generate())
        honest.start(wait=True)
        p2pd_pid(honest)
        attacker = Attacker(SWARM_ID, victim.visible_multiaddrs())
        assert wait_until(lambda: victim.stats()["peers_connected"] >= 2)
        net = HostileNet(victim, honest, attacker)
        if established:
            assert net.received_from_honest("hello")
        yield net
    finally:
        for closer in (attacker, honest, victim):
            if closer is not None:
                closer.close()
