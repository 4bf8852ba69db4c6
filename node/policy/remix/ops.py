"""The pieces of a ReMix adapter that know nothing of decoder layers: routing math and the adapted linear.

- :func:`gumbel_topk` draws an ordered k-of-n routing without replacement (Gumbel-top-k).
- :func:`plackett_luce_logprob` scores an ordered routing under the Plackett-Luce model of the router.
- :class:`RemixLinear` wraps a frozen ``nn.Linear`` with n stacked LoRAs and adds, per sequence, the
  k LoRAs its decoder layer's router selected, each with the same fixed weight ``omega``.

Shapes: ``R`` rows (sequences, or sequence x routing in training), ``T`` tokens, ``n`` LoRAs, ``k`` active.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from node.errors import NodeError

logger = logging.getLogger(__name__)


class RemixError(NodeError, ValueError):
    """A ReMix adapter is used wrongly (missing prompt mask, mismatched shapes, bad checkpoint)."""


def gumbel_topk(logits: torch.Tensor, k: int, generator: torch.Generator | None = None,
                units: torch.Tensor | None = None) -> torch.Tensor:
    """Draw k of n indices per row without replacement, in Plackett-Luce order (Gumbel-top-k).

    Args:
        logits: ``[R, n]`` unnormalised router scores.
        k: how many indices per row, ``1 <= k <= n``.
        generator: on ``logits.device``; ``None`` uses the global generator.
        units: optional ``LongTensor[R]``: rows with the same unit share one draw of noise (``U`` draws for
            units ``0 .. U-1``, consumed from ``generator`` as ``U`` rows would be), so rows with equal logits
            and equal units get the same routing.

    Returns:
        ``LongTensor[R, k]``: column ``j`` is the j-th draw, so the order is the sampling order.
    """
    if not 1 <= k <= logits.shape[-1]:
        raise RemixError(f"k={k} must be between 1 and n={logits.shape[-1]}")
    rows = logits.shape[0] if units is None else int(units.max()) + 1
    exponential = torch.empty((rows, logits.shape[-1]), device=logits.device,
                              dtype=torch.float32).exponential_(generator=generator)
    gumbel = -torch.log(exponential)  # -log(Exp(1)) is Gumbel(0, 1)
    if units is not None:
        gumbel = gumbel[units.to(gumbel.device)]
    return torch.topk(logits.detach().float() + gumbel, k, dim=-1).indices


def plackett_luce_logprob(logits: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Log-probability of an ordered routing: ``sum_j [logit_{idx_j} - logsumexp(logits not yet drawn)]``.

    Args:
        logits: ``[R, n]`` router scores (differentiable).
        idx: ``LongTensor[R, k]`` distinct indices per row, in drawing order.

    Returns:
        ``[R]`` log-probabilities, differentiable w.r.t. ``logits``.
    """
    n = logits.shape[-1]
    chosen = logits.gather(-1, idx)  # [R, k]
    one_hot = F.one_hot(idx, n).to(torch.bool)  # [R, k, n]
    # Position j excludes the indices drawn before it: an exclusive cumulative "or" over the draws.
    drawn_before = (one_hot.cumsum(dim=1) - one_hot.long()).to(torch.bool)
    remaining = logits.unsqueeze(1).masked_fill(drawn_before, float("-inf"))  # [R, k, n]
    return (chosen - torch.logsumexp(remaining, dim=-1)).sum(dim=-1)


def lora_omega(k: int, rank: int, alpha: float, scale: str) -> float:
    """The fixed weight of each active LoRA: ``(alpha / r) / k`` ("lora") or ``alpha / sqrt(r) / k`` ("rslora")."""
    if scale == "lora":
        return alpha / rank / k
    if scale == "rslora":
        return alpha / math.sqrt(rank) / k
    raise RemixError(f"scale={scale!r} is not one of 'lora', 'rslora'")


@dataclass
class LayerRouting:
    """The routing of one decoder layer for the current batch, shared by its adapted linears.

    Attributes:
        x_pool: ``[R, D]`` float32, the layer input averaged over prompt tokens (detached).
        indices: ``LongTensor[R, k]`` the selected LoRAs per row, in drawing order.
        selected: ``[R, n]`` 1.0 where a LoRA is selected for the row, else 0.0 (float32).
    """

    x_pool: torch.Tensor | None = None
    indices: torch.Tensor | None = None
    selected: torch.Tensor | None = None
    _scales: dict[tuple[int, float, torch.dtype], torch.Tensor] = field(default_factory=dict)

    def set(self, x_pool: torch.Tensor, indices: torch.Tensor, n: int) -> None:
        self.x_pool = x_pool
        self.indices = indices
        self.selected = torch.zeros(indices.shape[0], n, device=indices.device).scatter_(1, indices, 1.0)
        self._scales = {}

    def clear(self) -> None:
        self.x_pool = None
        self.indices = None
        self.selected = None
        self._scales = {}

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep (or repeat) rows: row ``i`` becomes the old row ``rows[i]`` (a batch's cache rows copied or
        dropped, as the sampling loop does)."""
        if self.x_pool is None or self.indices is None or self.selected is None:
            return
        self.x_pool, self.indices, self.selected = self.x_pool[rows], self.indices[rows], self.selected[rows]
        self._scales = {}

    def rank_scale(self, rank: int, omega: float, dtype: torch.dtype) -> torch.Tensor:
        """``[R, n*rank]``: ``omega`` on the rank dimensions of each row's selected LoRAs, 0 elsewhere; made once a
        batch (and after each :meth:`select_rows`) and shared by the layer's linears and decode steps."""
        key = (rank, omega, dtype)
        scale = self._scales.get(key)
        if scale is None:
            if self.selected is None:
                raise RemixError("no routing for this batch: call adapter.set_prompt_mask(...) before the forward")
            scale = (self.selected * omega).to(dtype).repeat_interleave(rank, dim=1)
            self._scales[key] = scale
        return scale


class RemixLinear(nn.Module):
    """``y = W x + omega * sum_{i in S} B_i A_i x`` with ``S`` the k LoRAs routed to each row.

    The base linear is kept (frozen) as ``self.base``. ``lora_A`` is ``[n, r, D_in]`` (Kaiming-uniform,
    like peft), ``lora_B`` is ``[n, D_out, r]`` (zeros, so a fresh adapter leaves the model unchanged).
    Adapter parameters are float32 when the base is half precision; inputs are cast to them and the
    update is cast back to the base output's dtype.

    Two exact evaluations of the same sum, a fixed number of operations each whatever n and k (no loop
    over LoRAs), picked per call by their cost (:meth:`path_for`):

    - dense-masked: the n LoRAs as one rank-``n*r`` LoRA whose rank dimensions outside a row's k are
      multiplied by 0 (their gradients are exactly 0): two plain matmuls, the second fused with the add.
      Its LoRA FLOPs scale with n, but it reads each weight once for all rows, so it is the cheaper one
      when a row has few tokens (a decode step: one token a row).
    - gathered: per row, the k selected LoRAs gathered into one rank-``k*r`` LoRA, applied by two batched
      matmuls (the second fused with the add); the LoRA FLOPs scale with k, at the price of a copy of the
      selected weights per row, which pays once a row has several tokens (a prompt, a training row).
    """

    lora_A: nn.Parameter
    lora_B: nn.Parameter
    path: Literal["auto", "dense", "gathered"] = "auto"
    gather_cost: float = 8.0
    """The gathered path's copy of a row's k LoRAs costs about this many multiply-adds per weight copied."""

    def __init__(self, base: nn.Linear, n: int, rank: int, omega: float, routing: LayerRouting) -> None:
        super().__init__()
        self.base = base
        self.omega = omega
        self.routing = routing
        weight = base.weight
        dtype = torch.float32 if weight.dtype in (torch.float16, torch.bfloat16) else weight.dtype
        a = torch.empty(n, rank, base.in_features, device=weight.device, dtype=dtype)
        for i in range(n):  # init only: the same Kaiming-uniform rule as nn.Linear / peft per LoRA
            nn.init.kaiming_uniform_(a[i], a=math.sqrt(5))
        self.lora_A = nn.Parameter(a)
        self.lora_B = nn.Parameter(torch.zeros(n, base.out_features, rank, device=weight.device, dtype=dtype))
        self._b_flat: tuple[tuple[int, int], torch.Tensor] | None = None

    def path_for(self, tokens: int, k: int) -> str:
        """``dense`` or ``gathered`` for rows of ``tokens`` tokens with k of the n LoRAs each: gathered when the
        n - k LoRAs a dense row computes for nothing cost more than the copy of its k (``gather_cost``)."""
        if self.path != "auto":
            return self.path
        n = self.lora_A.shape[0]
        return "gathered" if tokens * (n - k) > self.gather_cost * k else "dense"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: ``[R, ..., D_in]`` -> ``[R, ..., D_out]``; row ``b`` uses ``routing.indices[b]``."""
        y: torch.Tensor = self.base(x)
        idx = self.routing.indices
        if idx is None:
            raise RemixError(
                "no routing for this batch: call adapter.set_prompt_mask(...) before the forward"
            )
        rows = x.shape[0]
        if idx.shape[0] != rows:
            raise RemixError(f"batch has {rows} rows but the routing has {idx.shape[0]}")
        flat = x.reshape(rows, -1, x.shape[-1])  # [R, T, D_in]
        dtype = self.lora_A.dtype
        fused = y.dtype == dtype  # the update is added inside the last matmul (else cast, then added)
        if flat.dtype != dtype:
            flat = flat.to(dtype)
        out = y.reshape(rows, -1, y.shape[-1]) if fused else None
        if self.path_for(flat.shape[1], idx.shape[1]) == "dense":
            update = self._dense_update(flat, out)
        else:
            update = self._gathered_update(flat, idx, out)
        if fused:
            return update.reshape(y.shape)
        return y + update.reshape(y.shape).to(y.dtype)

    def _b_all(self) -> torch.Tensor:
        """``[D_out, n*r]``: every LoRA's B side by side. Outside autograd the copy is kept until ``lora_B``
        changes (an optimizer step or a load bumps its version), so decode steps do not remake it."""
        n, d_out, rank = self.lora_B.shape
        if torch.is_grad_enabled() and self.lora_B.requires_grad:
            return self.lora_B.permute(1, 0, 2).reshape(d_out, n * rank)
        key = (self.lora_B._version, self.lora_B.data_ptr())
        if self._b_flat is None or self._b_flat[0] != key:
            self._b_flat = (key, self.lora_B.detach().permute(1, 0, 2).reshape(d_out, n * rank))
        return self._b_flat[1]

    def _dense_update(self, flat: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
        """``[R, T, D_in]`` -> ``[R, T, D_out]`` through all n LoRAs, the unselected ones masked; added to
        ``out`` (the base output) when given, else returned alone."""
        n, rank, d_in = self.lora_A.shape
        scale = self.routing.rank_scale(rank, self.omega, flat.dtype)  # [R, n*r]
        hidden = F.linear(flat, self.lora_A.reshape(n * rank, d_in)) * scale.unsqueeze(1)  # [R, T, n*r]
        b_all = self._b_all()
        if out is None:
            return F.linear(hidden, b_all)
        rows, tokens, _ = hidden.shape
        return torch.addmm(out.reshape(rows * tokens, -1), hidden.reshape(rows * tokens, -1), b_all.t())

    def _gathered_update(self, flat: torch.Tensor, idx: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
        """``[R, T, D_in]``, ``[R, k]`` -> ``[R, T, D_out]``: the k selected LoRAs as one rank-(k*r) LoRA;
        added to ``out`` when given."""
        rows, k = idx.shape
        _, rank, d_in = self.lora_A.shape
        a_sel = self.lora_A[idx].reshape(rows, k * rank, d_in)  # [R, k*r, D_in]
        b_sel = self.lora_B.transpose(1, 2)[idx].reshape(rows, k * rank, -1)  # [R, k*r, D_out]
        hidden = torch.bmm(flat, a_sel.transpose(1, 2))  # [R, T, k*r]
        if out is None:
            return torch.bmm(hidden, b_sel) * self.omega
        return torch.baddbmm(out, hidden, b_sel, alpha=self.omega)

    def extra_repr(self) -> str:
        n, rank, _ = self.lora_A.shape
        return f"n={n}, rank={rank}, omega={self.omega:.4g}"
