"""Does training on peers' groups pay this node? An online estimate from the node's own training signal.

The estimate (docs/algorithms.md, "Deciding whether peers pay"): on a step that trains on both its own
groups with signal and peers' groups, the trainer accumulates the gradient of each part separately,
``g_own`` and ``g_peer`` (the step's update is their weighted sum, as before). The node's own groups are
fresh on-policy samples of its own task mixture, so ``g_own`` is an unbiased estimate of the gradient of
the node's expected reward, ``grad J``; peers' samples are drawn independently of them, so
``E[g_peer . g_own] = E[g_peer] . grad J``: the first-order change of the node's own expected reward from
a step along the peers' gradient. The node keeps the cosine ``g_peer . g_own / (|g_peer| |g_own|)`` of its
last ``window`` such steps (``alignment``) and declines peers' groups once the window's mean plus one
standard error is at or below ``min_alignment``: when the evidence says the peers' gradient does not move
the node's own objective forward. One step's cosine is noisy (spread by about 0.25 between equal tiny
nodes) around a small mean (+0.03 over a 500-step run where peers' groups helped), so a rule on the mean
alone, over 16 steps, declined helpful peers on half the steps; the standard error and a window of 64
make a decline need evidence.

- The first ``warmup`` measurements are taken without deciding (peers' groups are taken), so there is an
  estimate to decide on.
- While it declines, a step every ``probe_every`` takes peers' groups anyway, so the estimate follows
  peers whose groups change (a swarm that learns, a node whose needs move).
- A step with no own group with signal, or no peer group, measures nothing (its gradient has one part).

Pure: no torch, no I/O, no config objects; the state is a small dict for the node's checkpoint.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Mapping
from typing import Any

import torch


class PeerDecider:
    """Decides, step by step, whether a node takes peers' groups, from the alignments it has observed.

    Args:
        window: how many recent alignments the estimate averages.
        warmup: measurements before the first decision (peers' groups are taken until then).
        probe_every: while declining, every ``probe_every``-th step takes peers' groups (a probe).
        min_alignment: peers are declined once the window's mean alignment plus one standard error is at or
            below this.
    """

    def __init__(self, *, window: int = 64, warmup: int = 4, probe_every: int = 8, min_alignment: float = 0.0) -> None:
        if window < 2 or warmup < 1 or probe_every < 1:
            raise ValueError(f"window ({window}) must be >= 2, warmup ({warmup}) and probe_every ({probe_every}) >= 1")
        if not -1.0 <= min_alignment < 1.0:
            raise ValueError(f"min_alignment ({min_alignment}) must be in [-1, 1)")
        self.window = window
        self.warmup = warmup
        self.probe_every = probe_every
        self.min_alignment = min_alignment
        self.alignments: deque[float] = deque(maxlen=window)
        self.measured = 0  # alignments observed in all
        self.steps_taken = 0
        self.steps_declined = 0
        self.probes = 0
        self._declined_in_a_row = 0
        self.last_reason = "warmup"

    def estimate(self) -> tuple[float | None, float | None]:
        """Mean alignment of the window and its standard error (None when there are fewer than 2)."""
        if len(self.alignments) < 2:
            return (self.alignments[0] if self.alignments else None), None
        values = list(self.alignments)
        return statistics.fmean(values), statistics.stdev(values) / math.sqrt(len(values))

    def pays(self) -> bool | None:
        """Whether the estimate says peers pay: None while warming up."""
        if self.measured < self.warmup:
            return None
        mean, se = self.estimate()
        if mean is None:
            return None
        return mean + (se or 0.0) > self.min_alignment

    def decide(self) -> bool:
        """Whether this step takes peers' groups (counts the decision; call once a step)."""
        verdict = self.pays()
        if verdict is None:
            take, self.last_reason = True, "warmup"
        elif verdict:
            take, self.last_reason = True, "pays"
        elif self._declined_in_a_row + 1 >= self.probe_every:
            take, self.last_reason = True, "probe"
            self.probes += 1
        else:
            take, self.last_reason = False, "does_not_pay"
        if take:
            self.steps_taken += 1
            self._declined_in_a_row = 0
        else:
            self.steps_declined += 1
            self._declined_in_a_row += 1
        return take

    def observe(self, alignment: float | None) -> None:
        """The alignment measured on this step (None: nothing measured)."""
        if alignment is None or not math.isfinite(alignment):
            return
        self.alignments.append(max(-1.0, min(1.0, float(alignment))))
        self.measured += 1

    def metrics(self) -> dict[str, Any]:
        """What the node reports a step: the estimate and its decisions so far."""
        mean, se = self.estimate()
        return {"peer_alignment_mean": mean, "peer_alignment_se": se, "peer_alignment_n": len(self.alignments),
                "peer_decision": self.last_reason, "peer_steps_taken": self.steps_taken,
                "peer_steps_declined": self.steps_declined, "peer_probes": self.probes}

    def state(self) -> dict[str, Any]:
        """A plain dict for the node's checkpoint."""
        return {"alignments": list(self.alignments), "measured": self.measured, "steps_taken": self.steps_taken,
                "steps_declined": self.steps_declined, "probes": self.probes,
                "declined_in_a_row": self._declined_in_a_row, "last_reason": self.last_reason}

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state` (a checkpoint's); the window keeps its newest ``window`` values."""
        self.alignments.clear()
        self.alignments.extend(float(a) for a in state.get("alignments", []))
        self.measured = int(state.get("measured", len(self.alignments)))
        self.steps_taken = int(state.get("steps_taken", 0))
        self.steps_declined = int(state.get("steps_declined", 0))
        self.probes = int(state.get("probes", 0))
        self._declined_in_a_row = int(state.get("declined_in_a_row", 0))
        self.last_reason = str(state.get("last_reason", "warmup"))


def cosine(dot: float, norm_a: float, norm_b: float) -> float | None:
    """``dot / (norm_a * norm_b)``, None when either norm is 0 (a part without gradient)."""
    if norm_a <= 0.0 or norm_b <= 0.0:
        return None
    return dot / (norm_a * norm_b)


def part_cosine(own_grads: list[torch.Tensor | None], params: list[torch.nn.Parameter]) -> float | None:
    """The cosine between the own part's gradient (``own_grads``, as it was once the own sequences were
    accumulated) and the peers' part (the parameters' gradient now, less the own part); None when either
    part has no gradient or a value that is not finite."""
    dot = own_sq = peer_sq = 0.0
    for own, param in zip(own_grads, params):
        if param.grad is None:
            continue
        total = param.grad.detach().double()
        mine = torch.zeros_like(total) if own is None else own.double()
        theirs = total - mine
        dot += float((mine * theirs).sum())
        own_sq += float((mine * mine).sum())
        peer_sq += float((theirs * theirs).sum())
    if not all(math.isfinite(v) for v in (dot, own_sq, peer_sq)):
        return None
    return cosine(dot, math.sqrt(own_sq), math.sqrt(peer_sq))
