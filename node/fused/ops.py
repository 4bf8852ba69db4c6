"""The blocks of the fused training pass (``node.fused.decoder``) as autograd functions with their own
backward: a projection family (``Linear``), q/k/v with the rotary embedding and, where the model has them, an
RMSNorm of each head's queries and keys before it (Qwen3) (``Qkv``), gate/up with the SiLU gate (``GateUp``)
and RMSNorm (``RmsNorm``; ``rms_norm`` and ``rms_norm_grads`` its formulas, which ``Qkv`` uses too).

Autograd records a node for every operation of a block and runs, in the backward, the generic form of each
(a slice's backward allocates the whole tensor and copies the slice into it; a view's backward is another
view); written out by hand, a block's backward is the few products and element-wise operations its
formula needs. Each computes what transformers and peft compute, in the same dtypes and order of element-
wise operations, so the values agree to float rounding (``tests/node/test_fused_families.py``).

The rotary embedding: transformers computes ``x cos + rotate_half(x) sin`` with ``rotate_half(x) =
(-x2, x1)``; here ``roll(x, d/2) * sin_signed`` with ``sin_signed = (-sin1, sin2)``, the same products
exactly (a sign moves from one factor to the other), and the backward ``g cos + roll(g sin_signed, d/2)``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from node.fused.projections import Family


def signed_sin(sin: Tensor) -> Tensor:
    """``sin`` ``[..., d]`` with its first half negated: the factor ``roll(x, d/2)`` takes to make
    ``rotate_half(x) * sin``."""
    half = sin.shape[-1] // 2
    sign = torch.ones(sin.shape[-1], dtype=sin.dtype, device=sin.device)
    sign[:half] = -1
    return sin * sign


class Linear(torch.autograd.Function):
    """A family's output ``[..., d_out]`` from ``x`` ``[..., d_in]``; with ``heads``, ``x`` is attention
    output ``[n, heads, s, d]`` read as ``[n, s, heads * d]``."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, flat: Tensor, fam: Family, heads: bool) -> Tensor:
        ctx.shape, ctx.fam = x.shape, fam
        if heads:
            n, h, s, d = x.shape
            x2 = x.transpose(1, 2).reshape(n * s, h * d)
            lead: tuple[int, ...] = (n, s)
        else:
            lead, x2 = tuple(x.shape[:-1]), x.reshape(-1, fam.d_in)
        out, xa, u = fam.forward(x2)
        ctx.heads = heads
        ctx.save_for_backward(xa, u)
        return out.view(*lead, fam.d_out)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, None, None, None]:
        xa, u = ctx.saved_tensors
        gx = ctx.fam.backward(grad.reshape(-1, ctx.fam.d_out), xa, u, ctx.needs_input_grad[0])
        if gx is None:
            return None, None, None, None
        if ctx.heads:
            n, h, s, d = ctx.shape
            return gx.view(n, s, h, d).transpose(1, 2), None, None, None
        return gx.view(ctx.shape), None, None, None


class Qkv(torch.autograd.Function):
    """Queries, keys and values ``[n, heads, s, d]`` (rotary applied to queries and keys) from ``x``
    ``[n, s, d_model]``; ``cos`` and ``sin_signed`` ``[n, s, 1, d]``. With ``q_norm`` and ``k_norm`` (weights
    ``[d]``), each head's queries and keys are RMS-normalised over ``d`` (epsilon ``eps``) before the rotary
    embedding, as Qwen3's attention does; the weights' gradients come back where they are trained."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, flat: Tensor, fam: Family, cos: Tensor, sin_signed: Tensor, heads: int,
                kv_heads: int, q_norm: Tensor | None = None, k_norm: Tensor | None = None,
                eps: float = 0.0) -> tuple[Tensor, Tensor, Tensor]:
        n, s = x.shape[:2]
        out, xa, u = fam.forward(x.reshape(n * s, fam.d_in))
        d = fam.d_out // (heads + 2 * kv_heads)
        qkv = out.view(n, s, heads + 2 * kv_heads, d)
        qk = qkv[:, :, : heads + kv_heads]
        normed: tuple[Tensor, ...] = ()
        if q_norm is not None and k_norm is not None:  # one weight a head: q_norm's for queries, k_norm's for keys
            weight = torch.cat([q_norm.expand(heads, d), k_norm.expand(kv_heads, d)])
            qk, xhat, rstd, cast = rms_norm(qk, weight, eps)
            normed = (weight, xhat, rstd, cast)
        qk = qk * cos + torch.roll(qk, d // 2, -1) * sin_signed
        ctx.fam, ctx.dims = fam, (n, s, heads, kv_heads, d)
        ctx.save_for_backward(xa, u, cos, sin_signed, *normed)
        return (qk[:, :, :heads].transpose(1, 2), qk[:, :, heads:].transpose(1, 2),
                qkv[:, :, heads + kv_heads :].transpose(1, 2))

    @staticmethod
    def backward(ctx: Any, gq: Tensor, gk: Tensor, gv: Tensor) -> tuple[Tensor | None, ...]:
        xa, u, cos, sin_signed, *normed = ctx.saved_tensors
        n, s, heads, kv_heads, d = ctx.dims
        gqk = torch.cat([gq.transpose(1, 2), gk.transpose(1, 2)], 2)
        gqk = gqk * cos + torch.roll(gqk * sin_signed, d // 2, -1)
        g_q_norm = g_k_norm = None
        if normed:
            want_w = ctx.needs_input_grad[7] or ctx.needs_input_grad[8]
            gqk, g_weight = rms_norm_grads(gqk, *normed, want_w=want_w)
            if g_weight is not None:
                g_q_norm = g_weight[:heads].sum(0) if ctx.needs_input_grad[7] else None
                g_k_norm = g_weight[heads:].sum(0) if ctx.needs_input_grad[8] else None
        g = torch.cat([gqk, gv.transpose(1, 2)], 2).view(n * s, ctx.fam.d_out)
        gx = ctx.fam.backward(g, xa, u, ctx.needs_input_grad[0])
        return (None if gx is None else gx.view(n, s, -1)), None, None, None, None, None, None, g_q_norm, g_k_norm, None


class GateUp(torch.autograd.Function):
    """``silu(gate) * up`` ``[..., I]`` from ``x`` ``[..., d_model]`` (the family's output is gate then up)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, flat: Tensor, fam: Family) -> Tensor:
        lead = x.shape[:-1]
        out, xa, u = fam.forward(x.reshape(-1, fam.d_in))
        width = fam.d_out // 2
        gate, up = out[:, :width], out[:, width:]
        ctx.fam, ctx.lead, ctx.gate, ctx.up = fam, lead, gate, up
        ctx.save_for_backward(xa, u)
        return (torch.nn.functional.silu(gate) * up).view(*lead, width)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, None, None]:
        xa, u = ctx.saved_tensors
        g = grad.reshape(ctx.gate.shape)
        g_gate = torch.ops.aten.silu_backward(g * ctx.up, ctx.gate)
        g_up = g * torch.nn.functional.silu(ctx.gate)
        gx = ctx.fam.backward(torch.cat([g_gate, g_up], -1), xa, u, ctx.needs_input_grad[0])
        return (None if gx is None else gx.view(*ctx.lead, ctx.fam.d_in)), None, None


def rms_norm(h: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """transformers' RMSNorm of ``h`` ``[..., D]`` over its last dimension, ``weight`` ``[..., D]`` broadcast
    against it: ``weight * (x * rsqrt(mean(x^2) + eps))``, in float32, cast back before the weight. The
    output and what ``rms_norm_grads`` needs: ``xhat`` (float32), ``rstd`` and the cast."""
    x = h if h.dtype == torch.float32 else h.float()
    rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    xhat = x * rstd
    cast = xhat if xhat.dtype == h.dtype else xhat.to(h.dtype)
    return weight * cast, xhat, rstd, cast


def rms_norm_grads(grad: Tensor, weight: Tensor, xhat: Tensor, rstd: Tensor, cast: Tensor, *,
                   want_w: bool) -> tuple[Tensor, Tensor | None]:
    """The gradients of ``rms_norm``'s input (in ``grad``'s dtype) and, where ``want_w``, of its weight
    (``weight``'s shape, summed over the leading dimensions it was broadcast along)."""
    gw = _weight_grad(grad, weight, cast) if want_w else None
    g = grad * weight
    g = g if g.dtype == torch.float32 else g.float()
    gh = (g - xhat * (g * xhat).mean(-1, keepdim=True)) * rstd
    return (gh if gh.dtype == grad.dtype else gh.to(grad.dtype)), gw


def _weight_grad(grad: Tensor, weight: Tensor, cast: Tensor) -> Tensor:
    return (grad * cast).reshape(-1, *weight.shape).sum(0)


class RmsNorm(torch.autograd.Function):
    """``rms_norm`` of ``h`` ``[..., D]`` with ``weight`` ``[D]``."""

    @staticmethod
    def forward(ctx: Any, h: Tensor, weight: Tensor, eps: float) -> Tensor:
        out, xhat, rstd, cast = rms_norm(h, weight, eps)
        ctx.save_for_backward(weight, xhat, rstd, cast)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None, None]:
        if not ctx.needs_input_grad[0]:  # the weight's alone
            weight, _, _, cast = ctx.saved_tensors
            return None, _weight_grad(grad, weight, cast), None
        gh, gw = rms_norm_grads(grad, *ctx.saved_tensors, want_w=ctx.needs_input_grad[1])
        return gh, gw, None
