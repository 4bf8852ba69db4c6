"""Plain LoRA by projection family: the projections of a decoder layer that read the same input (q, k and v
of its attention; gate and up of its MLP; o and down alone) computed together, in three matrix products a
family instead of three a projection.

A peft LoRA layer runs its frozen linear, its A, its B, a scale, an add and two casts, each an operation of
its own, in the forward pass and again in the backward; smollm2's 30 layers have 210 of them. Here a
family's frozen weights sit in one ``[sum d_out, d_in]`` tensor (the projections' own weights become row
blocks of it: no memory is added), its adapters' A matrices in one ``[sum r, d_in]`` block and their B
matrices in one block-diagonal ``[sum d_out, sum r]`` block, and a custom autograd function computes
``x W^T + s (x A^T) B^T`` with one product each. Its backward computes the input's gradient and writes the
adapters' gradients straight into one flat gradient buffer, so every adapter parameter of the model is a
view of one flat tensor and its gradient a view of another: the optimizer steps two tensors, not 420, and
the gradient norm is one reduction.

What stays as it was: the peft modules and their parameters (names, shapes, values; a checkpoint, the
merged generation copy and an export see the same tensors), and the arithmetic: the same products in the
same dtypes as peft (adapters in float32 over a bfloat16 base: the input cast up, the sum cast back), up
to float rounding. ``node.fused.decoder`` runs the decoder with these families.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn


@dataclass
class Member:
    """One projection of a family: its columns of the family's output and, with an adapter, its rank rows."""

    module: nn.Module
    base: nn.Linear
    out: tuple[int, int]
    rank: tuple[int, int] | None = None  # rows of the family's A (columns of its B); None: no adapter


@dataclass
class Family:
    """Projections that read the same input. Tensors set by ``LoraLayout``: ``weight_t`` ``[d_in, d_out]``,
    ``a`` ``[R, d_in]`` and ``b`` ``[d_out, R]`` views of the flat parameter and their gradients ``grad_a``,
    ``grad_b`` views of the flat gradient (``R = 0``: no adapter in the family)."""

    members: list[Member]
    d_in: int
    d_out: int
    rank: int
    scaling: float
    weight: Tensor = field(default_factory=lambda: torch.empty(0))
    weight_t: Tensor = field(default_factory=lambda: torch.empty(0))
    bias: Tensor | None = None
    a: Tensor | None = None
    b: Tensor | None = None
    a_t: Tensor | None = None
    b_t: Tensor | None = None
    grad_a: Tensor | None = None
    grad_b: Tensor | None = None

    def forward(self, x2: Tensor) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """``x2`` ``[N, d_in]`` through every member: ``[N, d_out]``, and what the backward needs (the
        adapters' input and their low-rank activations ``u``; None without adapters)."""
        out = torch.mm(x2, self.weight_t) if self.bias is None else torch.addmm(self.bias, x2, self.weight_t)
        if self.a_t is None or self.b_t is None:
            return out, None, None
        xa = x2 if x2.dtype == self.a_t.dtype else x2.to(self.a_t.dtype)
        u = torch.mm(xa, self.a_t)
        if out.dtype == u.dtype:
            return torch.addmm(out, u, self.b_t, alpha=self.scaling), xa, u
        # peft: the base output cast up to the adapters' dtype, the sum cast back
        return torch.addmm(out.to(u.dtype), u, self.b_t, alpha=self.scaling).to(x2.dtype), xa, u

    def backward(self, g: Tensor, xa: Tensor | None, u: Tensor | None, want_x: bool) -> Tensor | None:
        """The gradient ``[N, d_out]`` of the output back: the adapters' gradients added to ``grad_a`` and
        ``grad_b`` (the B blocks off the diagonal too: masked once a step), the input's returned."""
        gx = torch.mm(g, self.weight) if want_x else None
        if u is None or xa is None or self.a is None or self.b is None or self.grad_a is None or self.grad_b is None:
            return gx
        ga = g if g.dtype == u.dtype else g.to(u.dtype)
        self.grad_b.addmm_(ga.t(), u, alpha=self.scaling)
        gu = torch.addmm(u, ga, self.b, beta=0, alpha=self.scaling)
        self.grad_a.addmm_(gu.t(), xa)
        if gx is None:
            return None
        return torch.addmm(gx, gu, self.a) if gx.dtype == gu.dtype else gx + torch.mm(gu, self.a).to(gx.dtype)


def _lora_parts(module: Any) -> tuple[nn.Linear, Tensor, Tensor, float] | None:
    """A plain peft LoRA linear layer's (base layer, A, B, scaling); None for a plain ``nn.Linear``. Raises
    ``ValueError`` for what a family cannot compute (dropout, DoRA, several adapters, merged weights)."""
    if isinstance(module, nn.Linear):
        return None
    lora_a = getattr(module, "lora_A", None)
    if lora_a is None or not hasattr(module, "get_base_layer"):
        raise ValueError(f"{type(module).__name__} is neither a linear layer nor a peft LoRA layer")
    active = list(module.active_adapters)
    if len(active) != 1 or set(lora_a.keys()) != set(active):
        raise ValueError(f"LoRA layer with adapters {sorted(lora_a.keys())} (active {active}): one expected")
    name = active[0]
    if getattr(module, "merged", False) or module.use_dora.get(name, False) or module.lora_variant.get(name):
        raise ValueError("merged, DoRA or variant LoRA layers are not fused")
    if not isinstance(module.lora_dropout[name], nn.Identity):
        raise ValueError("LoRA dropout is not fused")
    base = module.get_base_layer()
    a, b = module.lora_A[name], module.lora_B[name]
    if not isinstance(base, nn.Linear) or a.bias is not None or b.bias is not None:
        raise ValueError("LoRA over a layer other than nn.Linear, or with a LoRA bias, is not fused")
    return base, a.weight, b.weight, float(module.scaling[name])


def make_family(modules: list[nn.Module]) -> Family:
    """The family of ``modules`` (projections of one input, in output order)."""
    members: list[Member] = []
    d_out = rank = 0
    scales = set()
    d_in = None
    for module in modules:
        parts = _lora_parts(module)
        base = module if parts is None else parts[0]
        assert isinstance(base, nn.Linear)
        if d_in is not None and base.in_features != d_in:
            raise ValueError("a family's projections must read inputs of one width")
        d_in = base.in_features
        span = (d_out, d_out + base.out_features)
        d_out = span[1]
        if parts is None:
            members.append(Member(module, base, span))
            continue
        r = parts[1].shape[0]
        members.append(Member(module, base, span, (rank, rank + r)))
        rank += r
        scales.add(parts[3])
    if len(scales) > 1:
        raise ValueError(f"a family's adapters must share one scaling, got {sorted(scales)}")
    assert d_in is not None
    return Family(members, d_in, d_out, rank, scales.pop() if scales else 0.0)


class LoraLayout:
    """Every family's frozen weight in one tensor, every adapter parameter (``params``) a view of ``flat``
    (a float parameter the optimizer steps), the families writing their gradients into ``flat.grad``;
    ``mask`` is 1 where ``flat`` holds an adapter entry and 0 in the off-diagonal blocks of the B matrices
    (kept at zero: their gradients are masked before every use). Built once, after the model is on its
    device; the parameters keep their objects, names and values."""

    def __init__(self, families: list[Family]) -> None:
        self.families = families
        lora = [f for f in families if f.rank]
        if not lora:
            raise ValueError("no LoRA layer to fuse")
        first = next(m for f in lora for m in f.members if m.rank is not None)
        a0 = _lora_parts(first.module)[1]  # type: ignore[index]
        device, dtype = a0.device, a0.dtype
        sizes = [f.rank * f.d_in + f.d_out * f.rank for f in lora]
        with torch.no_grad():
            self.flat = nn.Parameter(torch.zeros(sum(sizes), device=device, dtype=dtype))
            self.flat.grad = torch.zeros_like(self.flat)
            self.mask = torch.zeros_like(self.flat)
            self.params: list[nn.Parameter] = []
            offset = 0
            for fam in families:
                self._stack_base(fam)
                if fam.rank:
                    self._place(fam, offset)
                    offset += fam.rank * fam.d_in + fam.d_out * fam.rank

    def _stack_base(self, fam: Family) -> None:
        """The members' frozen weights (and biases) as row blocks of one tensor."""
        first = fam.members[0].base.weight
        weight = torch.empty((fam.d_out, fam.d_in), device=first.device, dtype=first.dtype)
        biases = [m.base.bias for m in fam.members]
        bias = None
        if any(b is not None for b in biases):
            bias = torch.zeros(fam.d_out, device=first.device, dtype=first.dtype)
        for m in fam.members:
            lo, hi = m.out
            weight[lo:hi].copy_(m.base.weight)
            m.base.weight.data = weight[lo:hi]
            if m.base.bias is not None and bias is not None:
                bias[lo:hi].copy_(m.base.bias)
                m.base.bias.data = bias[lo:hi]
        fam.weight, fam.weight_t, fam.bias = weight, weight.t(), bias

    def _place(self, fam: Family, offset: int) -> None:
        a_size = fam.rank * fam.d_in
        fam.a = self.flat.data[offset : offset + a_size].view(fam.rank, fam.d_in)
        fam.b = self.flat.data[offset + a_size : offset + a_size + fam.d_out * fam.rank].view(fam.d_out, fam.rank)
        grad = self.flat.grad
        assert grad is not None
        fam.grad_a = grad[offset : offset + a_size].view(fam.rank, fam.d_in)
        fam.grad_b = grad[offset + a_size : offset + a_size + fam.d_out * fam.rank].view(fam.d_out, fam.rank)
        fam.a_t, fam.b_t = fam.a.t(), fam.b.t()
        self.mask[offset : offset + a_size] = 1
        mask_b = self.mask[offset + a_size : offset + a_size + fam.d_out * fam.rank].view(fam.d_out, fam.rank)
        for m in fam.members:
            if m.rank is None:
                continue
            _, a, b, _ = _lora_parts(m.module)  # type: ignore[misc]
            (r0, r1), (o0, o1) = m.rank, m.out
            fam.a[r0:r1].copy_(a)
            fam.b[o0:o1, r0:r1].copy_(b)
            mask_b[o0:o1, r0:r1] = 1
            for param, data in ((a, fam.a[r0:r1]), (b, fam.b[o0:o1, r0:r1])):
                assert isinstance(param, nn.Parameter)
                param.data = data
                self.params.append(param)
