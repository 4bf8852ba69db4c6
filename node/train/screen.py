"""Peer tokens this node could not have said, kept out of its loss: the training side of the peer-text
screen (``node.exchange.plausibility`` keeps the node's own completions' figures the bounds come from).

Read from the training pass's own log-probs (detached, at the sampling temperature): no extra forward pass,
and the policy the loss is about to move is the one that judges. For the rows of peers' completions:

- a token whose log-prob is below ``token_floor`` is masked out of the loss (it stays in the context);
- a row the loss pushes up (advantage above 0; every row with ``span_all``) whose least plausible span (the
  lowest mean log-prob of ``window`` consecutive tokens; the mean of all when it is shorter) is below
  ``span_floor`` is dropped whole (every token masked). A row pushed down cannot teach the node its text;
- a dropped row takes its advantage out of its group: the group's kept rows of the other sign take it up, each
  toward 0 (``share_dropped_advantages``), so the group keeps the advantage sum its estimator gave it. The
  drops come after the advantages were set, and without this a group whose positives were dropped would train
  its negatives alone: a push away from whatever they share with the node's own answers (their format, their
  end).

- a row the loss pushes up is weighted, as a whole, by ``min(1, exp(L - floor))`` (``sequence_weights``): ``L``
  its sequence log-prob (the sum over its tokens but those of a verified answer), ``floor`` a low quantile of
  the node's own completions' on the dataset. The truncated importance weight of the whole completion against
  what the node itself says: text added to a right answer, however plausible each of its tokens, lowers ``L``
  by what each of them costs, so the row moves the node about as far as its own least likely completions do;
- a new author's rows, until it has passed its trial (``PeerScreen.trusted``), are judged as above and kept out
  of the loss: what it sends before the screen has seen enough of it teaches nothing;
- one peer group's advantages are scaled so that its positives sum to at most ``group_cap`` times its rows,
  and one author's so that its positives are at most ``author_cap`` of the step's (``cap_peer_advantages``):
  how much of a step one author can move, whatever it writes.

The log-probs the bounds read are the reference's: the training pass's own (the policy about to move), or
the frozen base's, read at ingestion (rows that carry them), so that a payload the node has been trained toward
is not judged by the model it moved; or, with ``PeerScreen.lower_of_both``, the lower of the two token by
token, so that text fails if either the node's base or the node it has become would not say it.

Shapes: ``[B, T]`` log-probs and mask, ``[B]`` peer flags. Everything stays on the device.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["PeerScreen", "cap_peer_advantages", "held_to_span", "least_plausible_spans", "positive_peer_weights",
           "screen_peer_tokens", "sequence_weights", "share_dropped_advantages"]


@dataclass(frozen=True)
class PeerScreen:
    """The bounds of one step: ``span_floor`` None while the node has too few own completions to set it,
    ``positive_floor`` None for no weight on positive peer tokens; ``span_all`` holds every peer row to the span
    bound (False, the default: only those the loss pushes up); ``share_dropped``: which of a dropped row's
    group's kept rows take its advantage up (``share_dropped_advantages``'s ``to``; None: it is lost, and the
    other rows keep theirs); ``sequence_floors``: by dataset, the sequence log-prob a positive peer row counts
    fully at (``sequence_weights``; None: off), ``sequence_fail`` the nats below it at which the row fails;
    ``group_cap``, ``author_cap``: ``cap_peer_advantages``'s (None: no cap); ``lower_of_both``: a row that carries
    the base's log-probs is read at the lower of those and the training pass's, token by token (False: the base's
    alone); ``trusted``: the authors past their trial, the only peers whose rows carry weight in the loss (the
    others' rows are judged and kept out of it; None: no trial, every peer's rows carry weight); ``settled``: the
    authors past their probation, the others' pushed-up rows weighing ``probation_weight`` in the loss (their
    verified answer's tokens spared; None: every row its full weight)."""

    token_floor: float
    window: int
    span_floor: float | None = None
    positive_floor: float | None = None
    span_all: bool = False
    share_dropped: str | None = "other_sign"
    sequence_floors: Mapping[str, float] | None = None  # by dataset; None: no sequence weight
    sequence_fail: float = 3.0
    group_cap: float | None = None
    author_cap: float | None = None
    lower_of_both: bool = False
    trusted: frozenset[str] | None = None
    settled: frozenset[str] | None = None
    probation_weight: float = 1.0


def least_plausible_spans(logprobs: Tensor, mask: Tensor, window: int) -> Tensor:
    """``[B]``: per row, the lowest mean of ``window`` consecutive log-probs inside its mask (a row's tokens are
    a prefix of it), the mean of all when the row is no longer than ``window``, 0 for an empty row."""
    valid = mask.bool()
    x = torch.where(valid, logprobs.float(), torch.zeros_like(logprobs, dtype=torch.float32))
    lengths = valid.sum(-1)
    whole = x.sum(-1) / lengths.clamp(min=1)
    width = x.shape[-1]
    if width <= window:
        return whole
    csum = F.pad(x.cumsum(-1), (1, 0))
    means = (csum[:, window:] - csum[:, :-window]) / window  # [B, T - window + 1], window starting at t
    starts = torch.arange(width - window + 1, device=x.device)
    inside = (starts[None, :] + window) <= lengths[:, None]
    lowest = torch.where(inside, means, torch.full_like(means, float("inf"))).min(-1).values
    return torch.where(lengths > window, lowest, whole)


def screen_peer_tokens(logprobs: Tensor, mask: Tensor, peer: Tensor, screen: PeerScreen,
                       verified: Tensor | None = None, advantages: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``(keep [B, T], dropped [B])``: the tokens the loss may use (own rows: all of theirs) and the peer rows
    dropped by the span bound. ``verified`` (``[B, T]``, optional): tokens of a verified answer, which the
    token floor spares (the span bound still drops their row). ``advantages`` (``[B]``): the span bound holds
    the rows above 0 when ``screen.span_all`` is off (all rows without them)."""
    valid = mask.bool()
    lp = logprobs.detach().float()
    peer_tokens = peer[:, None] & valid
    if verified is not None:
        peer_tokens = peer_tokens & ~verified
    keep = valid & ~(peer_tokens & (lp < screen.token_floor))
    dropped = torch.zeros_like(peer, dtype=torch.bool)
    if screen.span_floor is not None:
        spans = least_plausible_spans(lp, valid, screen.window)
        dropped = held_to_span(peer, screen, advantages) & valid.any(-1) & (spans < screen.span_floor)
        keep = keep & ~dropped[:, None]
    return keep, dropped


def held_to_span(peer: Tensor, screen: PeerScreen, advantages: Tensor | None = None) -> Tensor:
    """``[B]``: the peer rows the span bound holds: every one with ``screen.span_all`` (or without
    ``advantages``), else those whose advantage is above 0."""
    return peer if advantages is None or screen.span_all else peer & (advantages > 0)


def positive_peer_weights(logprobs: Tensor, mask: Tensor, peer: Tensor, advantages: Tensor,
                          positive_floor: float, verified: Tensor | None = None) -> Tensor:
    """``[B, T]`` factors on each token's surrogate: ``min(1, exp(logprob - positive_floor))`` on the tokens of
    peer rows whose advantage is above 0, 1 everywhere else (own rows, negatives, padding, and the tokens of a
    verified answer when ``verified`` marks them)."""
    lp = torch.where(mask.bool(), logprobs.detach().float(), torch.zeros_like(logprobs, dtype=torch.float32))
    weights = torch.exp((lp - positive_floor).clamp(max=0.0))
    pushed_up = (peer & (advantages > 0))[:, None] & mask.bool()
    if verified is not None:
        pushed_up = pushed_up & ~verified
    return torch.where(pushed_up, weights, torch.ones_like(weights))


def share_dropped_advantages(advantages: Tensor, dropped: Tensor, group: Tensor, to: str = "other_sign") -> Tensor:
    """``[B]``: ``advantages`` with each group's dropped rows' advantage taken up by its kept rows (``group``:
    ``[B]`` integer labels in ``[0, B)``, rows of one group in this batch), so each group's sum is what it was
    where its kept rows can hold it. No kept row changes sign (it stops at 0). A group whose rows are all
    dropped, or that has no drop, is left as it was.

    ``to="other_sign"`` (the default): a dropped positive's advantage is taken up by the kept negatives, each
    moved toward 0 in proportion to its own (a dropped negative's by the kept positives): kept rows of the
    dropped rows' sign keep theirs, so a dropped poisoned completion cannot push its kept siblings up harder.
    ``to="kept"``: shared equally among every kept row, so kept rows of the dropped rows' sign gain.

    With binary rewards and a mean baseline, ``kept`` gives exactly the group's advantages recomputed without
    its ``d`` dropped rows of ``n``, and ``other_sign`` gives them times ``(n - d) / n``: the group weighs what
    the rows it kept weigh (a leave-one-out baseline: a factor a little below each). Every positive of a group
    dropped leaves its negatives at 0."""
    adv = advantages.float()
    n = adv.shape[0]  # bins enough for any labels in [0, B): no read of the labels on the host

    def per_group(values: Tensor) -> Tensor:
        return torch.zeros(n, device=adv.device).index_add_(0, group, values)

    if to == "kept":
        lost = per_group(torch.where(dropped, adv, 0.0))
        moved = adv + (lost / per_group((~dropped).float()).clamp(min=1.0))[group]
        moved = torch.where(adv > 0, moved.clamp(min=0.0), torch.where(adv < 0, moved.clamp(max=0.0), adv))
    else:
        kept, tiny = ~dropped, torch.finfo(torch.float32).tiny
        lost_up, lost_down = per_group(torch.where(dropped, adv.clamp(min=0.0), 0.0)), \
            per_group(torch.where(dropped, adv.clamp(max=0.0), 0.0))
        held_up, held_down = per_group(torch.where(kept, adv.clamp(min=0.0), 0.0)), \
            per_group(torch.where(kept, adv.clamp(max=0.0), 0.0))
        up_scale = (1.0 - (-lost_down) / held_up.clamp(min=tiny)).clamp(min=0.0)  # a dropped negative's share
        down_scale = (1.0 - lost_up / (-held_down).clamp(min=tiny)).clamp(min=0.0)
        moved = adv * torch.where(adv > 0, up_scale[group], down_scale[group])
    return torch.where(dropped, adv, moved).to(advantages.dtype)


def sequence_weights(logprobs: Tensor, mask: Tensor, pushed_up: Tensor, floors: Tensor,
                     verified: Tensor | None = None) -> Tensor:
    """``[B]``: ``min(1, exp(L - floor))`` for the ``pushed_up`` rows (``[B]``) with a floor (``floors``, ``[B]``,
    NaN for none), 1 for the others; ``L`` a row's log-probs summed over ``mask`` less the ``verified`` tokens."""
    counted = mask.bool() if verified is None else mask.bool() & ~verified
    total = torch.where(counted, logprobs.detach().float(), torch.zeros_like(logprobs, dtype=torch.float32)).sum(-1)
    weight = torch.exp((total - floors.float()).clamp(max=0.0))
    return torch.where(pushed_up & ~torch.isnan(floors), weight, torch.ones_like(weight))


def cap_peer_advantages(advantages: Tensor, author: Tensor, group: Tensor, group_cap: float | None,
                        author_cap: float | None) -> Tensor:
    """``[B]``: ``advantages`` with peer groups scaled down, both signs alike so that a group keeps its balance (a
    group's positives scaled alone would leave its negatives to push the node away from what they share with its
    own answers); the node's own rows as they were. ``author``: ``[B]`` integer labels, 0 for the node's own rows;
    ``group``: ``[B]`` labels in ``[0, B)``.

    ``group_cap``: a peer group whose positive advantages sum to more than ``group_cap`` times its row count is
    scaled to that (with RLOO advantages of binary rewards, a group of ``n`` rows with ``k`` right sums to
    ``k (n - k) / (n - 1)`` up: at a cap of 0.25 a group of 8 with 4 right is halved, one with 1 or 7 right is
    left). ``author_cap``: then each author's groups so that its positive advantage is at most ``author_cap`` of
    the step's (everyone else's, the node's own rows included, as they are)."""
    adv = advantages.float()
    n = adv.shape[0]
    peer = author > 0
    up = adv.clamp(min=0.0) * peer
    tiny = torch.finfo(torch.float32).tiny
    scale = torch.ones_like(adv)
    if group_cap is not None:
        rows = torch.zeros(n, device=adv.device).index_add_(0, group, torch.ones_like(adv))
        mass = torch.zeros(n, device=adv.device).index_add_(0, group, up)
        scale = (group_cap * rows / mass.clamp(min=tiny)).clamp(max=1.0)[group]
    if author_cap is not None and author_cap < 1.0:
        capped = up * scale
        total = adv.clamp(min=0.0).sum() - up.sum() + capped.sum()  # the own rows' and the peers' after the group cap
        mass = torch.zeros(int(author.max()) + 1 if n else 1, device=adv.device).index_add_(0, author, capped)
        # the most an author may push up and still be ``author_cap`` of the step, everyone else's as they are
        limit = author_cap * (total - mass) / (1.0 - author_cap)
        scale = scale * (limit / mass.clamp(min=tiny)).clamp(max=1.0)[author]
    return torch.where(peer, adv * scale, adv).to(advantages.dtype)
