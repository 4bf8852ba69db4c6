"""The trainer's rows, and the peer-text screen applied to a micro-batch of them (``node.train.screen`` holds the
math on tensors; this module maps rows onto it).

A row is one completion of a step: its prompt and tokens, anchors and advantage, whose it is, the tokens of its
verified answer, its group's index in the step, the screen's reference log-probs when it carries them (a peer
completion read by the frozen base at ingestion) and the sequence log-prob its group's dataset counts fully at.
``screen_rows`` gives a micro-batch's loss mask, token weights and advantages with the screen held, and the
counts the node judges authors by (one verdict a row: ``screen_totals``).
"""

from __future__ import annotations

import math

import torch

from node.train.groups import TrainGroup
from node.train.screen import (
    PeerScreen,
    cap_peer_advantages,
    held_to_span,
    positive_peer_weights,
    screen_peer_tokens,
    sequence_weights,
    share_dropped_advantages,
)

__all__ = ["COUNTS", "Row", "capped", "rows_of", "screen_rows", "screen_totals"]

# prompt, completion, anchors, advantage, own sample, author ("" for the node's own), its verified answer's tokens,
# its group's index in the step, the screen's reference log-probs (None: the training pass's), the sequence
# log-prob it counts fully at (NaN: no sequence weight)
Row = tuple[list[int], list[int], list[float], float, bool, str, tuple[int, int] | None, int, list[float] | None,
            float]

COUNTS = ("rows", "dropped", "tokens", "masked", "pushed", "weight", "judged", "failed", "sequence_failed",
          "policy_failed")
"""Per author, what ``screen_totals`` adds up: rows, rows dropped, tokens, tokens masked, tokens pushed up, the sum
of those tokens' weights, rows judged (held to the span bound: pushed up, by default), those that failed, of
those the ones whose sequence weight alone was below ``exp(-sequence_fail)`` (neither dropped nor a token
masked), and those that failed only because the policy's read is lower than the frozen base's (reference
``both``: the base's read alone passes them; 0 otherwise): which bound, and which reader, fails an author."""


def rows_of(groups: list[TrainGroup], screen: PeerScreen | None) -> list[Row]:
    """Every completion of ``groups`` that has advantages (and a token) as a row, with ``screen``'s sequence floor
    of its dataset on peer rows."""
    floors = screen.sequence_floors if screen is not None and screen.sequence_floors is not None else {}
    rows: list[Row] = []
    for index, g in enumerate(groups):
        if g.advantages is None:
            continue
        n = len(g.completions)
        refs: list[list[float] | None] = [r or None for r in g.reference_logprobs] if g.reference_logprobs else [None] * n
        floor = math.nan if g.is_local else floors.get(g.dataset, math.nan)
        for ids, lps, a, span, ref in zip(g.completions, g.anchor_logprobs, g.advantages.tolist(),
                                          g.answer_spans or [None] * n, refs):
            if ids:
                rows.append((g.prompt_ids, ids, lps, float(a), g.is_local, g.peer_id, span, index, ref, floor))
    return rows


def capped(rows: list[Row], screen: PeerScreen) -> list[Row]:
    """``rows`` with peer groups' advantages capped (``cap_peer_advantages``: per group, per author)."""
    if screen.group_cap is None and screen.author_cap is None:
        return rows
    authors = {a: i + 1 for i, a in enumerate(dict.fromkeys(r[5] for r in rows if not r[4]))}
    groups = {g: i for i, g in enumerate(dict.fromkeys(r[7] for r in rows))}
    advantages = cap_peer_advantages(torch.tensor([r[3] for r in rows]),
                                         torch.tensor([0 if r[4] else authors[r[5]] for r in rows]),
                                         torch.tensor([groups[r[7]] for r in rows]), screen.group_cap,
                                         screen.author_cap).tolist()
    return [(r[0], r[1], r[2], a, r[4], r[5], r[6], r[7], r[8], r[9]) for r, a in zip(rows, advantages)]


def screen_rows(rows: list[Row], logprobs: torch.Tensor, mask: torch.Tensor, peer: torch.Tensor,
                advantages: torch.Tensor, screen: PeerScreen, count_rows: int | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """``(loss mask, token weights or None, advantages, counts)`` of a micro-batch: ``mask`` less the peer tokens
    and rows the screen keeps out, the weights of pushed-up peer tokens (the token weight times the row's
    sequence weight), the advantages with the dropped rows' shared out among their groups' kept rows
    (``share_dropped_advantages``; ReMix's rows, one a routing, grouped by routing too), and ``[len(COUNTS), n]``
    counts of the first ``count_rows`` rows (all of them by default; ReMix repeats rows down the batch), on the
    device. The bounds read ``reference`` log-probs: a row's own where it carries them, else the training pass's. The
    rows of a peer not in ``screen.trusted`` (an author on trial) are judged and counted, and left out of the loss
    mask, the tokens pushed up and their weights; the pushed-up rows of a peer not in ``screen.settled`` (new, or
    on probation) weigh ``screen.probation_weight`` (their verified answer's tokens spared)."""
    verified = _verified_tokens(rows, mask) if any(r[6] for r in rows) else None
    both = screen.lower_of_both and any(r[8] is not None for r in rows)
    base = _reference(rows, logprobs) if both else None  # the frozen base's read alone, for the counts
    logprobs = _reference(rows, logprobs, screen.lower_of_both)
    keep, dropped = screen_peer_tokens(logprobs, mask, peer, screen, verified, advantages)
    if screen.share_dropped and screen.span_floor is not None:
        rank = {g: i for i, g in enumerate(dict.fromkeys(r[7] for r in rows))}  # labels 0.. on the host
        reps = advantages.shape[0] // len(rows)
        labels = [rank[r[7]] + k * len(rank) for k in range(reps) for r in rows]
        advantages = share_dropped_advantages(advantages, dropped, torch.tensor(labels, device=advantages.device),
                                              screen.share_dropped)
    weights = None
    if screen.positive_floor is not None:
        weights = positive_peer_weights(logprobs, mask & keep, peer, advantages, screen.positive_floor, verified)
    sequence = _sequence(rows, logprobs, mask, peer, advantages, screen, verified)
    lifted = verified if verified is not None else torch.zeros_like(mask, dtype=torch.bool)  # spared the row weights
    if sequence is not None:  # the whole row against the node's own, on top of its tokens' weights
        factor = torch.where(lifted, 1.0, sequence[:, None])
        weights = factor if weights is None else weights * factor
    held = _on_probation(rows, screen, mask, peer & (advantages > 0))
    if held is not None:  # a new author's, or one back from a pause: its pushed-up rows teach less
        factor = torch.where(held[:, None] & ~lifted, screen.probation_weight, 1.0)
        weights = factor if weights is None else weights * factor
    trial = _on_trial(rows, screen.trusted, mask)
    n = count_rows or len(rows)
    valid, peer_rows = mask[:n].bool(), peer[:n]
    pushed_up = (valid & keep[:n]) & (peer_rows & ~trial[:n] & (advantages[:n] > 0))[:, None]
    weight_sum = torch.where(pushed_up, weights[:n], 0.0).sum(-1) if weights is not None else pushed_up.sum(-1)
    judged = held_to_span(peer_rows, screen, advantages[:n])
    masked = (valid & ~keep[:n] & peer_rows[:, None]).sum(-1)
    failed, by_sequence = _verdicts(dropped, keep, mask, peer, sequence, screen)
    failed, by_sequence = failed[:n], by_sequence[:n]
    by_policy = torch.zeros_like(failed)
    if base is not None:  # failed, where the base's read alone passes the row: the policy's read failed it
        base_keep, base_dropped = screen_peer_tokens(base, mask, peer, screen, verified, advantages)
        base_sequence = _sequence(rows, base, mask, peer, advantages, screen, verified)
        by_policy = failed & ~_verdicts(base_dropped, base_keep, mask, peer, base_sequence, screen)[0][:n]
    counts = torch.stack([peer_rows.float(), dropped[:n].float(), (valid & peer_rows[:, None]).sum(-1).float(),
                          masked.float(), pushed_up.sum(-1).float(), weight_sum.float(), judged.float(),
                          (judged & failed).float(), (judged & by_sequence).float(), (judged & by_policy).float()])
    return mask & keep & ~trial[:, None], weights, advantages, counts


def _peers_outside(rows: list[Row], authors: frozenset[str], mask: torch.Tensor) -> torch.Tensor:
    """``[B]``: the rows of peers not in ``authors``, repeated down the batch as ReMix's routings repeat the rows."""
    flags = [not r[4] and r[5] not in authors for r in rows]
    return torch.tensor(flags, dtype=torch.bool).to(mask.device).repeat(mask.shape[0] // len(rows))


def _on_trial(rows: list[Row], trusted: frozenset[str] | None, mask: torch.Tensor) -> torch.Tensor:
    """``[B]``: the rows of peers not in ``trusted`` (all False when it is None)."""
    if trusted is None:  # no trial: nothing to build on the host
        return torch.zeros(mask.shape[0], dtype=torch.bool, device=mask.device)
    return _peers_outside(rows, trusted, mask)


def _on_probation(rows: list[Row], screen: PeerScreen, mask: torch.Tensor, up: torch.Tensor) -> torch.Tensor | None:
    """``[B]``: the pushed-up (``up``) rows of peers not in ``screen.settled``; None when every row carries its full
    weight."""
    if screen.settled is None or screen.probation_weight >= 1:
        return None
    return _peers_outside(rows, screen.settled, mask) & up


def _sequence(rows: list[Row], logprobs: torch.Tensor, mask: torch.Tensor, peer: torch.Tensor,
              advantages: torch.Tensor, screen: PeerScreen, verified: torch.Tensor | None) -> torch.Tensor | None:
    """``[B]``: each pushed-up peer row's sequence weight against its dataset's floor (``sequence_weights``; 1
    elsewhere), None without sequence floors."""
    if screen.sequence_floors is None:
        return None
    floors = torch.tensor([r[9] for r in rows], device=mask.device).repeat(mask.shape[0] // len(rows))
    return sequence_weights(logprobs, mask, peer & (advantages > 0), floors, verified)


def _verdicts(dropped: torch.Tensor, keep: torch.Tensor, mask: torch.Tensor, peer: torch.Tensor,
              sequence: torch.Tensor | None, screen: PeerScreen) -> tuple[torch.Tensor, torch.Tensor]:
    """``([B] failed, [B] failed by the sequence weight alone)``: one verdict a row, failed if dropped, a token of it
    masked below the floor, or its whole sequence weight under ``exp(-sequence_fail)`` (far below what the node
    itself says)."""
    failed = dropped | (mask.bool() & ~keep & peer[:, None]).any(-1)
    by_sequence = torch.zeros_like(failed)
    if sequence is not None:
        by_sequence = ~failed & (sequence < math.exp(-screen.sequence_fail))
    return failed | by_sequence, by_sequence


def screen_totals(batches: list[tuple[list[str], torch.Tensor]]) -> dict[str, list[float]]:
    """Per author, the ``COUNTS`` of a step's micro-batches (each its rows' authors and ``[len(COUNTS), n]``
    counts on the device), read from the device once; the node's own rows ("") left out."""
    totals: dict[str, list[float]] = {}
    if not batches:
        return totals
    authors = [a for batch, _ in batches for a in batch]
    with torch.profiler.record_function("host_read"):  # the step's one read of the screen's counts
        columns = torch.cat([counts for _, counts in batches], dim=1).T.tolist()
    for author, column in zip(authors, columns):
        if author:
            total = totals.setdefault(author, [0.0] * len(COUNTS))
            for i, v in enumerate(column):
                total[i] += v
    return totals


def _reference(rows: list[Row], logprobs: torch.Tensor, lower_of_both: bool = False) -> torch.Tensor:
    """The log-probs the screen reads: each row's reference log-probs where it carries them (the frozen base's,
    read at ingestion; with ``lower_of_both``, the lower of those and the training pass's, token by token), the
    training pass's (detached) elsewhere; ``logprobs``' shape (rows repeated down the batch, as ReMix's routings
    repeat them)."""
    if all(r[8] is None for r in rows):
        return logprobs
    width = logprobs.shape[1]
    values = torch.tensor([list(r[8] or [0.0] * len(r[1]))[:width] + [0.0] * (width - min(len(r[1]), width))
                           for r in rows], dtype=torch.float32)
    carried = torch.tensor([r[8] is not None for r in rows])
    reps = logprobs.shape[0] // len(rows)
    values, carried = values.to(logprobs.device).repeat(reps, 1), carried.to(logprobs.device).repeat(reps)
    own = logprobs.detach().float()
    if lower_of_both:
        values = torch.minimum(values, own)
    return torch.where(carried[:, None], values, own)


def _verified_tokens(rows: list[Row], mask: torch.Tensor) -> torch.Tensor:
    """``mask``'s shape: the tokens of each row's verified answer (rows repeated down the batch, as ReMix's
    routings repeat them)."""
    marks = torch.zeros(len(rows), mask.shape[1], dtype=torch.bool)
    for i, row in enumerate(rows):
        if row[6] is not None:
            marks[i, row[6][0] : row[6][1]] = True
    return marks.to(mask.device).repeat(mask.shape[0] // len(rows), 1)
