"""What a ``Node`` tells the status API after each step: an immutable snapshot of the step's metrics row,
the medians of the recent steps and, in swarm mode, the exchange's counts."""

from __future__ import annotations

import statistics
from typing import Any

from node.api.board import PeerIngest, StepSnapshot, freeze_record
from node.api.metrics import read_metrics
from node.run.state import NodeState


class StatusMixin(NodeState):
    """Publishing the node's status to its ``StatusBoard``."""

    def _publish_resumed(self) -> None:
        """After a resume, the API starts from the last step already done, not from nothing."""
        rows = read_metrics(self.metrics.path) if self.step else []
        evals = [r for r in rows if isinstance(r.get("eval_accuracy"), float)]
        if evals:
            self._last_eval = (int(evals[-1]["step"]), float(evals[-1]["eval_accuracy"]))
        if rows and rows[-1].get("step") == self.step:
            self._publish_status(rows[-1])

    def _publish_status(self, row: dict[str, Any]) -> None:
        """Hand the API an immutable picture of this step (a few small copies; no tensors): the row, the
        medians of the recent steps (an evaluation is not part of a step's time) and the exchange's counts."""
        ex = self.exchange
        fields: dict[str, Any] = {}
        if isinstance(row.get("step_seconds"), float):
            self._recent.append((row["step_seconds"], float(row.get("tokens_per_s") or 0.0)))
        if self._recent:
            fields.update(recent_steps=len(self._recent),
                          step_seconds_median=statistics.median(r[0] for r in self._recent),
                          tokens_per_s_median=statistics.median(r[1] for r in self._recent))
        if ex is not None:
            ingestor = ex.ingestor
            fields.update(published_batches=ex.seq, published_groups=ex.groups_shared,
                          peer_ingest={peer: PeerIngest(groups_accepted=n, groups_rejected=dict(rejected),
                                                        groups_trained=self._trained_by_peer.get(peer, 0),
                                                        screen=ingestor.verdicts.summary(peer)
                                                        if peer in ingestor.verdicts.figures else {},
                                                        screen_paused=ingestor.paused(peer))
                                       for peer, (n, rejected) in ingestor.by_peer.items()})
        self.board.publish(StepSnapshot(step=self.step, record=freeze_record(row), last_eval=self._last_eval,
                                        **fields))
