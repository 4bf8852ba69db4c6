"""An optimizer group's parameters as views of one flat tensor, so that the optimizer, the gradient norm and
clipping each run once on it instead of once a parameter (smollm2's LoRA has 420 tensors: a step of
AdamW's for-loop form was 13,000 operations and 420 reads of the step count on the CPU).

The parameters keep their objects and names (checkpoints, the merged generation copy and exports read them
as before); each one's ``.data`` is a view of ``flat`` and its ``.grad`` a view of ``flat.grad``, kept
attached between steps. The gradient buffer is the group's (``grad``): the fused pass writes the adapters'
gradients into views of it, whatever ``flat.grad`` then holds, so every update puts it back as ``flat.grad``
and the parameters' ``.grad`` (``zero_grad``, ``masked_grad``): a ``zero_grad()`` from outside (an
optimizer's or a module's, which set ``.grad`` to None) between steps loses nothing. ``mask`` (optional) is 1 on the entries that belong to a parameter: the adapters'
block-diagonal B matrices hold zeros between their blocks, whose gradients are masked before use.

A checkpoint keeps the optimizer's state in the per-parameter form a plain optimizer writes
(``per_parameter_state``), and reads either form back (``flat_state``): runs resume across the change.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn


class FlatGroup:
    """``params`` (in the order of their optimizer group) as views of ``flat``."""

    def __init__(self, params: list[nn.Parameter], flat: nn.Parameter, mask: Tensor | None = None) -> None:
        self.params, self.flat, self.mask = params, flat, mask
        if flat.grad is None:
            flat.grad = torch.zeros_like(flat)
        self.grad: Tensor = flat.grad
        base = flat.data.storage_offset()
        self.specs = [(p.data.storage_offset() - base, tuple(p.shape), tuple(p.stride())) for p in params]
        for p in params:
            if p.data.untyped_storage().data_ptr() != flat.data.untyped_storage().data_ptr():
                raise ValueError("a parameter of a flat group is not a view of its flat tensor")
        self._grads = [self.view(self.grad, i) for i in range(len(params))]
        self.attach_grads()

    @classmethod
    def contiguous(cls, params: list[nn.Parameter]) -> FlatGroup:
        """Parameters of one dtype and device moved into a new flat tensor, one after the other."""
        first = params[0]
        with torch.no_grad():
            flat = nn.Parameter(torch.empty(sum(p.numel() for p in params), dtype=first.dtype, device=first.device))
            offset = 0
            for p in params:
                view = flat.data[offset : offset + p.numel()].view(p.shape)
                view.copy_(p.data)
                p.data = view
                offset += p.numel()
        return cls(params, flat)

    def view(self, tensor: Tensor, i: int) -> Tensor:
        """Parameter ``i``'s entries of a tensor laid out as ``flat``."""
        offset, shape, stride = self.specs[i]
        return tensor.as_strided(shape, stride, tensor.storage_offset() + offset)

    def attach_grads(self) -> None:
        """``grad`` as ``flat.grad`` and its views as the parameters' ``.grad``, wherever something replaced them."""
        if self.flat.grad is not self.grad:
            self.flat.grad = self.grad
        for p, g in zip(self.params, self._grads):
            if p.grad is not g:
                p.grad = g

    def zero_grad(self) -> None:
        self.grad.zero_()
        self.attach_grads()

    def touch(self) -> None:
        """Mark every parameter updated in place (its version counter, which an update of ``flat`` does not
        move): what reads the parameters' versions to notice an update (the merged generation copy) sees
        it, as after a per-parameter optimizer's step."""
        params = tuple(self.params)
        try:
            torch._C._autograd._unsafe_set_version_counter(params, tuple(p._version + 1 for p in params))
        except (AttributeError, TypeError, RuntimeError):  # another torch: one no-op update a parameter
            with torch.no_grad():
                for p in params:
                    p.add_(0)

    def masked_grad(self) -> Tensor:
        """``grad`` with the entries that belong to no parameter set to zero (in place), attached as ``flat.grad``
        for the optimizer."""
        self.attach_grads()
        return self.grad if self.mask is None else self.grad.mul_(self.mask)


def per_parameter_state(optimizer: torch.optim.Optimizer, groups: list[FlatGroup]) -> dict[str, Any]:
    """The state dict a per-parameter optimizer over ``groups``' parameters would write."""
    flat_sd = optimizer.state_dict()
    state: dict[int, dict[str, Any]] = {}
    param_groups = []
    index = 0
    for group_sd, flat_group in zip(flat_sd["param_groups"], groups):
        flat_state = flat_sd["state"].get(group_sd["params"][0], {})
        ids = list(range(index, index + len(flat_group.params)))
        for i, pid in enumerate(ids):
            if flat_state:
                state[pid] = {k: (flat_group.view(v, i).clone() if _is_flat(v, flat_group) else _copy(v))
                              for k, v in flat_state.items()}
        param_groups.append({**group_sd, "params": ids})
        index += len(ids)
    return {"state": state, "param_groups": param_groups}


def flat_state(state_dict: dict[str, Any], groups: list[FlatGroup]) -> dict[str, Any]:
    """``state_dict`` (per-parameter, as ``per_parameter_state`` or a plain optimizer writes it) in the
    form the optimizer over ``groups``' flat tensors loads."""
    groups_sd = state_dict["param_groups"]
    if len(groups_sd) != len(groups) or any(len(s["params"]) != len(g.params) for s, g in zip(groups_sd, groups)):
        raise ValueError("the optimizer state does not match this policy's parameter groups")
    state: dict[int, dict[str, Any]] = {}
    param_groups = []
    for g, (group_sd, flat_group) in enumerate(zip(groups_sd, groups)):
        per = [state_dict["state"].get(pid) for pid in group_sd["params"]]
        if per and all(p is not None for p in per):
            merged: dict[str, Any] = {}
            for key, value in per[0].items():
                if isinstance(value, Tensor) and value.dim() > 0:
                    full = torch.zeros_like(flat_group.flat.data, dtype=value.dtype)
                    for i, p in enumerate(per):
                        flat_group.view(full, i).copy_(p[key])
                    merged[key] = full
                else:
                    merged[key] = _copy(value)
            state[g] = merged
        param_groups.append({**group_sd, "params": [g]})
    return {"state": state, "param_groups": param_groups}


def _is_flat(value: Any, group: FlatGroup) -> bool:
    return isinstance(value, Tensor) and value.dim() > 0 and value.numel() == group.flat.numel()


def _copy(value: Any) -> Any:
    return value.clone() if isinstance(value, Tensor) else value
