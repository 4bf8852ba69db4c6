"""Which peer groups a ``Node`` trains on: the pool of received groups, the node's own signal and success
rates by dataset over a window (for dataset preferences and ``sapo.peer_filter``), and the count of
groups trained on per peer."""

from __future__ import annotations

import torch

from node.run.state import NodeState
from node.train.groups import TrainGroup, assign_advantages
from node.train.sampler import CandidateGroup, mix, peer_slots, preference_weights
from swarm.peer_book import MAX_TRACKED_PEERS

_MAX_POOL_PER_J = 64  # peer groups held for selection, per external group trained on a step


class PeerGroupsMixin(NodeState):
    """Selecting a step's external groups, and the own-group statistics that steer it."""

    def _count_trained(self, external: list[TrainGroup]) -> None:
        """Peer groups trained on, per peer (the status API's peers list), for as many peers as ingestion
        tracks."""
        for grp in external:
            self._trained_by_peer[grp.peer_id] = self._trained_by_peer.pop(grp.peer_id, 0) + 1
        while len(self._trained_by_peer) > MAX_TRACKED_PEERS:
            self._trained_by_peer.popitem(last=False)

    def _record_signal(self, local: list[TrainGroup], with_signal: list[TrainGroup]) -> None:
        """Remember, by dataset, how many of this step's own groups were generated, how many carried signal
        and the sum of their mean rewards."""
        counts: dict[str, list[float]] = {}
        kept = {id(grp) for grp in with_signal}
        for grp in local:
            entry = counts.setdefault(grp.dataset, [0, 0, 0.0])
            drawn = grp.all_rewards or grp.rewards
            entry[0] += 1
            entry[1] += int(id(grp) in kept)
            entry[2] += sum(drawn) / max(len(drawn), 1)
        self._signal_history.append(counts)

    def _window_rates(self, column: int) -> dict[str, float]:
        """Per dataset, column ``column`` of the window's own-group counts over the groups generated (entries
        of checkpoints written before a column existed are left out of its rate)."""
        totals: dict[str, list[float]] = {}
        for counts in self._signal_history:
            for dataset, entry in counts.items():
                if len(entry) > column:
                    total = totals.setdefault(dataset, [0, 0.0])
                    total[0] += entry[0]
                    total[1] += entry[column]
        return {d: value / n for d, (n, value) in totals.items() if n > 0}

    def signal_rates(self) -> dict[str, float]:
        """The fraction of the node's own groups of each dataset that carried signal, over the window."""
        return self._window_rates(1)

    def success_rates(self) -> dict[str, float]:
        """The node's own mean reward on each dataset, over the window."""
        return self._window_rates(2)

    def _dataset_weights(self, datasets: list[str]) -> dict[str, float] | None:
        sapo, tasks = self.cfg.sapo, self.cfg.tasks
        mixture = dict(zip(tasks.datasets, tasks.weights or [1.0] * len(tasks.datasets)))
        return preference_weights(datasets, sapo.dataset_preference, mixture=mixture,
                                  signal_rates=self.signal_rates(), floor=sapo.preference_floor,
                                  success_rates=self.success_rates(), band=(sapo.band_low, sapo.band_high))

    def _plan(self, generated: int, own_with_signal: int) -> tuple[int, int]:
        """``(own groups with signal, peer groups)`` this step may train on at most (``sapo.peer_slots``). A
        deciding node (``sapo.take_peers=decide``) that declines trains as a silo would: on every own group
        with signal, no peer's."""
        sapo = self.cfg.sapo
        if self.decider is not None and self.exchange is not None and not self.decider.decide():
            return generated, 0
        return sapo.local_groups, peer_slots(sapo.peer_slots, sapo.external_groups, generated, own_with_signal)

    def _select_external(self, epoch: int, j: int | None = None) -> list[TrainGroup]:
        """Add freshly received peer groups to the pool, drop stale ones, pick up to ``j`` (J when None; never
        waits)."""
        if self.exchange is None:
            return []
        sapo = self.cfg.sapo
        # Only what the pool can hold is ingested (none when J is 0). Advantages once, on arrival; a group
        # without signal never gains any, so it is not kept.
        capacity = _MAX_POOL_PER_J * sapo.external_groups
        room = min(self.cfg.ingest.max_groups_per_step, max(0, capacity - len(self._external_pool)))
        arrived = assign_advantages(self.exchange.receive(self.step, max_groups=room), self.cfg.train.advantage,
                                    self.cfg.train.external_shift)
        # a group of an author the screen has paused since it arrived is not trained on
        fresh = [grp for grp in self._external_pool + arrived
                 if grp.epoch >= epoch - sapo.staleness_epochs and not self.exchange.paused(grp.peer_id)]
        self._external_pool = fresh[-max(capacity, 1) :]  # newest kept
        j = sapo.external_groups if j is None else j
        if j == 0 or not self._external_pool:
            return []
        candidates = [CandidateGroup(key=grp.key, peer_id=grp.peer_id, epoch=grp.epoch,
                                     rewards=torch.tensor(grp.rewards), advantages=grp.advantages, payload=grp,
                                     dataset=grp.dataset)
                      for grp in self._external_pool if grp.advantages is not None]
        weights = self._dataset_weights([c.dataset for c in candidates])
        above = self.success_rates() if sapo.peer_filter == "above_own" else None
        _, chosen = mix([], candidates, 0, j, sapo.selection, max_per_peer=sapo.max_per_peer,
                        current_epoch=epoch, staleness_epochs=sapo.staleness_epochs, rng=self.select_rng,
                        dataset_weights=weights, above_reward=above)
        picked = {id(c.payload) for c in chosen}
        self._external_pool = [grp for grp in self._external_pool if id(grp) not in picked]  # each used once
        return [c.payload for c in chosen]

