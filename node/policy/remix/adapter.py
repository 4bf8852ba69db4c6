"""The ReMix adapter handle: routing state, modes, router loss and persistence (built by ``attach_remix``).

Imported through :mod:`node.policy.remix.attach`, which documents the usage.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal, cast

import torch
from torch import nn

from node.policy.families import mlp_projections
from node.policy.remix.ops import (
    LayerRouting,
    RemixError,
    RemixLinear,
    gumbel_topk,
    plackett_luce_logprob,
)

logger = logging.getLogger(__name__)

RoutingMode = Literal["deterministic", "sampled"]


@dataclass(frozen=True)
class RemixSpec:
    """The shape of a ReMix adapter; two adapters with equal specs have interchangeable saved states."""

    n: int
    k: int
    rank: int
    scale: Literal["lora", "rslora"]
    alpha: float
    omega: float
    centre: bool = False  # the router reads the pooled input less a running mean of pooled inputs


CENTRE_MOMENTUM = 0.99
"""A centred router's running mean moves ``1 - CENTRE_MOMENTUM`` of the way to each training batch's mean
(after its first batches, which it averages equally): slow against one batch, quick against a run."""


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder layers of a Llama/Qwen2-style causal LM (``model.model.layers``)."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if not isinstance(layers, nn.ModuleList) or len(layers) == 0:
        raise RemixError(
            f"{type(model).__name__} has no decoder layers at model.model.layers; ReMix supports "
            "Llama/Qwen2-style causal LMs"
        )
    return layers


class RemixAdapter:
    """Handle on the ReMix parts attached to a model: modes, routing state, losses, persistence.

    The LoRAs and routers live inside the model (``layer.mlp.<proj>`` is a :class:`RemixLinear`,
    ``layer.remix_router`` the router, ``layer.remix_counts`` the selection counts, a buffer), so
    ``model.to(device)`` moves them; this object keeps the routing of the current batch. Build it with
    :func:`attach_remix`.

    Nothing that training updates in place is created or moved inside a forward: a forward may run under
    ``torch.inference_mode`` (generation), and a tensor made there cannot be updated outside it. The counts
    are a buffer for that reason: they move with the model, where the model moves.
    """

    def __init__(self, model: nn.Module, spec: RemixSpec) -> None:
        self.model = model
        self.spec = spec
        self.projections = mlp_projections(model)  # the family's MLP projections (node.policy.families)
        self._layers = decoder_layers(model)
        self._routings = [LayerRouting() for _ in self._layers]
        self._routers: list[nn.Linear] = []
        self._linears: list[dict[str, RemixLinear]] = []
        self._mode: RoutingMode = "deterministic"
        self._m = 1
        self._generator: torch.Generator | None = None
        self._prompt_mask: torch.Tensor | None = None
        self._units: torch.Tensor | None = None
        self._hooks: list[Any] = []

    # ----- building ---------------------------------------------------------------------------------
    def _install(self) -> None:
        """Replace the MLP projections, add the routers and the pre-hooks (called once by attach)."""
        spec = self.spec
        for index, layer in enumerate(self._layers):
            routing = self._routings[index]
            mlp = layer.mlp
            wrapped: dict[str, RemixLinear] = {}
            for name in self.projections:
                base = getattr(mlp, name, None)
                if not isinstance(base, nn.Linear):
                    raise RemixError(f"layer {index}: mlp.{name} is {type(base).__name__}, not nn.Linear: ReMix "
                                     f"takes the MLP projections {list(self.projections)} of a family in "
                                     "node/policy/families.py; use adapter.kind=lora for this model")
                wrapped[name] = RemixLinear(base, spec.n, spec.rank, spec.omega, routing)
                setattr(mlp, name, wrapped[name])
            first = wrapped[self.projections[0]]  # reads the layer's input, as the router does
            weight = first.lora_A
            router = nn.Linear(first.base.in_features, spec.n, bias=False)
            router.to(device=weight.device, dtype=weight.dtype)
            nn.init.zeros_(router.weight)
            layer.remix_router = router
            # Not persistent: a checkpoint holds the trainable state; the counts are a metric since the last reset.
            layer.register_buffer("remix_counts", torch.zeros(spec.n, dtype=torch.long, device=weight.device),
                                  persistent=False)
            if spec.centre:  # saved by state_dict_for_save, as the routers are
                layer.register_buffer("remix_centre", torch.zeros(router.in_features, dtype=torch.float32,
                                                                  device=weight.device), persistent=False)
                layer.register_buffer("remix_centre_n", torch.zeros((), dtype=torch.long, device=weight.device),
                                      persistent=False)
            self._routers.append(router)
            self._linears.append(wrapped)
            self._hooks.append(layer.register_forward_pre_hook(self._make_hook(index), with_kwargs=True))

    def _make_hook(self, index: int) -> Any:
        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            hidden = args[0] if args else kwargs["hidden_states"]
            self._route(index, hidden)

        return hook

    # ----- modes and routing --------------------------------------------------------------------------
    def deterministic(self) -> RemixAdapter:
        """Top-k of the router's scores (generation, evaluation). Takes effect at the next prompt mask."""
        self._mode = "deterministic"
        self._m = 1
        self._generator = None
        return self

    def sampled(self, m: int, generator: torch.Generator | None = None) -> RemixAdapter:
        """Training: every row draws its own k-of-n routing per layer by Gumbel-top-k.

        The caller repeats its batch ``m`` times along dim 0, routing-major (``x.repeat(m, 1)``: rows
        ``j*B .. (j+1)*B-1`` are routing ``j``). ``generator`` must live on the model's device.
        """
        if m < 2:
            raise RemixError(f"sampled routing needs m >= 2 routings a sequence (RLOO), got m={m}")
        self._mode = "sampled"
        self._m = m
        self._generator = generator
        return self

    @property
    def mode(self) -> RoutingMode:
        return self._mode

    @property
    def num_layers(self) -> int:
        return len(self._layers)

    def set_prompt_mask(self, prompt_mask: torch.Tensor, units: torch.Tensor | None = None) -> None:
        """Start a new batch: ``prompt_mask`` is ``BoolTensor[R, T]``, True on prompt tokens.

        ``T`` is the length of the first forward that follows (the prompt for ``generate``; prompt plus
        completion in training). In sampled mode ``R`` must be a multiple of ``m``, and ``units``
        (``LongTensor[R]``, optional) makes rows of one unit share their draws: the rows of a group's
        prompt under one of its M routings, so that they are routed as that prompt run once
        (:func:`node.policy.remix.logprobs.routed_logprobs`) is. Forgets the routing of the previous batch.
        """
        if prompt_mask.dim() != 2:
            raise RemixError(f"prompt_mask must be [batch, tokens], got shape {tuple(prompt_mask.shape)}")
        if self._mode == "sampled" and prompt_mask.shape[0] % self._m:
            raise RemixError(f"prompt_mask has {prompt_mask.shape[0]} rows, not a multiple of m={self._m}")
        if units is not None and tuple(units.shape) != (prompt_mask.shape[0],):
            raise RemixError(f"units must be [rows] = [{prompt_mask.shape[0]}], got {tuple(units.shape)}")
        self._prompt_mask = prompt_mask.to(torch.bool)
        self._units = units
        for routing in self._routings:
            routing.clear()

    def select_rows(self, rows: torch.Tensor) -> None:
        """Row ``i`` of the batch's routing becomes the old row ``rows[i]`` in every layer: the routing follows
        the sampling loop's cache when it copies a shared prompt's rows to its group or drops finished rows."""
        for routing in self._routings:
            routing.select_rows(rows)

    def _route(self, index: int, hidden: torch.Tensor) -> None:
        """Pre-hook body: compute layer ``index``'s routing at the prefill, reuse it afterwards."""
        routing = self._routings[index]
        if routing.indices is not None:
            if routing.indices.shape[0] != hidden.shape[0]:
                raise RemixError(
                    f"batch of {hidden.shape[0]} rows after a prefill of {routing.indices.shape[0]}: "
                    "call adapter.set_prompt_mask(...) before each new batch"
                )
            return
        mask = self._prompt_mask
        if mask is None:
            raise RemixError("no prompt mask: call adapter.set_prompt_mask(prompt_mask) before the forward")
        if tuple(mask.shape) != tuple(hidden.shape[:2]):
            raise RemixError(
                f"prompt_mask has shape {tuple(mask.shape)} but the first forward sees "
                f"{tuple(hidden.shape[:2])} (rows, tokens); with num_return_sequences=G pass "
                "prompt_mask.repeat_interleave(G, 0)"
            )
        router = self._routers[index]
        with torch.no_grad():
            weights = mask.to(device=hidden.device, dtype=torch.float32).unsqueeze(-1)  # [R, T, 1]
            summed = (hidden.detach().float() * weights).sum(dim=1)
            x_pool = summed / weights.sum(dim=1).clamp(min=1.0)  # [R, D], float32
            if self.spec.centre:
                x_pool = self._centred(index, x_pool)
            x_pool = x_pool.to(router.weight.dtype)
            logits = router(x_pool)  # [R, n]
            if self._mode == "deterministic":
                indices = torch.topk(logits, self.spec.k, dim=-1).indices
            else:
                indices = gumbel_topk(logits, self.spec.k, self._generator, self._units)
        routing.set(x_pool, indices, self.spec.n)
        counts = self._counts_of(index)  # in place: allowed on a buffer made outside inference mode
        counts += torch.bincount(indices.flatten(), minlength=self.spec.n).to(counts.device)

    def _centred(self, index: int, x_pool: torch.Tensor) -> torch.Tensor:
        """``x_pool`` less layer ``index``'s running mean of pooled inputs, which a training batch (sampled
        mode) first moves towards its own mean: the text every prompt shares (a system prompt, a worked
        example) then no longer decides every prompt's routing alike (docs/results/remix-mixture.md).
        Generation and evaluation read the mean without moving it, so they route as training left it."""
        layer = self._layers[index]
        centre = cast(torch.Tensor, layer.remix_centre)
        if self._mode == "sampled":
            seen = cast(torch.Tensor, layer.remix_centre_n)
            weight = torch.clamp(1.0 / (seen.float() + 1.0), min=1.0 - CENTRE_MOMENTUM)
            centre += weight * (x_pool.mean(0) - centre)
            seen += 1
        return x_pool - centre

    def _counts_of(self, index: int) -> torch.Tensor:
        return cast(torch.Tensor, self._layers[index].remix_counts)  # the buffer _install registered

    def _routing_of(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        routing = self._routings[index]
        if routing.x_pool is None or routing.indices is None:
            raise RemixError("no routing yet: run a forward after adapter.set_prompt_mask(...)")
        return routing.x_pool, routing.indices

    # ----- what the trainer and the generator read ---------------------------------------------------------
    def last_routing(self) -> torch.Tensor:
        """``LongTensor[R, L, k]``: the LoRAs each row used in each layer (drawing order) in the last batch."""
        return torch.stack([self._routing_of(i)[1] for i in range(len(self._layers))], dim=1)

    def routing_logprob(self) -> torch.Tensor:
        """``[R]``: ordered Plackett-Luce log Q of each row's routing, summed over layers.

        Recomputed from the stored (detached) pooled inputs with the routers' current weights, so it is
        differentiable w.r.t. the router parameters only, even if the forward ran under ``no_grad``.
        """
        total: torch.Tensor | None = None
        for index, router in enumerate(self._routers):
            x_pool, indices = self._routing_of(index)
            logprob = plackett_luce_logprob(router(x_pool), indices)
            total = logprob if total is None else total + logprob
        if total is None:
            raise RemixError("the model has no decoder layers")
        return total

    def router_loss(self, per_sequence_loss: torch.Tensor, m: int) -> torch.Tensor:
        """RLOO score-function surrogate for the routers (a scalar to add to the policy loss).

        Its gradient is ``mean_b 1/(m-1) sum_j (L_jb - mean_j L_jb) grad log Q_jb``: an unbiased estimate
        of ``grad E_Q[L]``. ``per_sequence_loss`` is ``[m*B]`` routing-major (detached here); for negative
        samples pass a bounded value (the tapered TOPR term), never ``-|A| * logprob``.
        """
        if m < 2:
            raise RemixError(f"router_loss needs m >= 2 routings a sequence, got m={m}")
        if per_sequence_loss.dim() != 1 or per_sequence_loss.shape[0] % m:
            raise RemixError(
                f"per_sequence_loss must be [m*B] with m={m}, got {tuple(per_sequence_loss.shape)}"
            )
        logq = self.routing_logprob()
        if logq.shape != per_sequence_loss.shape:
            raise RemixError(
                f"per_sequence_loss has {per_sequence_loss.shape[0]} rows, routing has {logq.shape[0]}"
            )
        losses = per_sequence_loss.detach().to(logq.dtype).reshape(m, -1)  # [m, B]
        centred = losses - losses.mean(dim=0, keepdim=True)
        return (centred * logq.reshape(m, -1)).sum(dim=0).mean() / (m - 1)

    def router_loss_spread(self, per_sequence_loss: torch.Tensor, prompt_of: torch.Tensor,
                           routing_of: torch.Tensor) -> torch.Tensor:
        """The score-function surrogate when each sequence ran under one routing (``spread_units``): row i's
        baseline is the mean loss of the rows of its prompt under the other routings (independent draws, so
        the estimate stays unbiased; their completions differ, so it is noisier than ``router_loss``'s). A row
        whose prompt has no other routing in the batch adds nothing; the sum is divided by all ``B`` rows."""
        logq = self.routing_logprob()
        if logq.shape != per_sequence_loss.shape or prompt_of.shape != logq.shape or routing_of.shape != logq.shape:
            raise RemixError(f"per_sequence_loss {tuple(per_sequence_loss.shape)}, prompt_of {tuple(prompt_of.shape)} "
                             f"and routing_of {tuple(routing_of.shape)} must match the {logq.shape[0]} routed rows")
        losses = per_sequence_loss.detach().to(logq.dtype)
        prompt_of, routing_of = prompt_of.to(logq.device), routing_of.to(logq.device)
        others = (prompt_of[:, None] == prompt_of[None, :]) & (routing_of[:, None] != routing_of[None, :])
        count = others.sum(-1)
        baseline = (others.to(logq.dtype) @ losses) / count.clamp(min=1)
        centred = torch.where(count > 0, losses - baseline, torch.zeros_like(losses))
        return (centred * logq).sum() / max(1, logq.shape[0])

    def router_entropy(self) -> float:
        """Mean entropy (nats) of the routers' softmax over the rows and layers of the last batch."""
        with torch.no_grad():
            values = []
            for index, router in enumerate(self._routers):
                log_q = torch.log_softmax(router(self._routing_of(index)[0]).float(), dim=-1)
                values.append(-(log_q.exp() * log_q).sum(dim=-1).mean())
            return float(torch.stack(values).mean())

    def selection_counts(self) -> torch.Tensor:
        """``LongTensor[L, n]`` (CPU): how often each LoRA was selected since the last reset, per layer.

        Every row of every batch counts (all ``M*B`` rows in sampled mode), each adding k selections.
        """
        return torch.stack([self._counts_of(i).detach().cpu() for i in range(len(self._layers))]).clone()

    def reset_selection_counts(self) -> None:
        for index in range(len(self._layers)):
            self._counts_of(index).zero_()

    # ----- parameters and persistence -----------------------------------------------------------------------
    def trainable_parameters(self) -> dict[str, list[torch.Tensor]]:
        """``{"lora": [A, B, ...], "router": [P_0, ...]}`` for optimizer groups with their own learning rates."""
        loras: list[torch.Tensor] = [
            p for linears in self._linears for lin in linears.values() for p in (lin.lora_A, lin.lora_B)
        ]
        return {"lora": loras, "router": [router.weight for router in self._routers]}

    def _named_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        for index, linears in enumerate(self._linears):
            for name, lin in linears.items():
                yield f"layers.{index}.mlp.{name}.lora_A", lin.lora_A
                yield f"layers.{index}.mlp.{name}.lora_B", lin.lora_B
            yield f"layers.{index}.router.weight", self._routers[index].weight
            if self.spec.centre:
                yield f"layers.{index}.router.centre", cast(torch.Tensor, self._layers[index].remix_centre)
                yield f"layers.{index}.router.centre_n", cast(torch.Tensor, self._layers[index].remix_centre_n)

    def state_dict_for_save(self) -> dict[str, torch.Tensor]:
        """LoRAs and routers (a centred router's running mean too) as detached CPU-contiguous copies, names like
        ``layers.0.mlp.up_proj.lora_A``."""
        return {name: p.detach().cpu().contiguous().clone() for name, p in self._named_tensors()}

    def load_saved_state(self, state: dict[str, torch.Tensor]) -> None:
        """Load a :meth:`state_dict_for_save` result; names and shapes must match exactly."""
        params = dict(self._named_tensors())
        missing = sorted(set(params) - set(state))
        unexpected = sorted(set(state) - set(params))
        wrong = [
            f"{name}: saved {tuple(state[name].shape)}, adapter {tuple(p.shape)}"
            for name, p in params.items()
            if name in state and state[name].shape != p.shape
        ]
        if missing or unexpected or wrong:
            raise RemixError(
                "ReMix state does not match this adapter "
                f"(n={self.spec.n}, k={self.spec.k}, rank={self.spec.rank}, layers={len(self._layers)}): "
                f"missing={missing[:4]}, unexpected={unexpected[:4]}, wrong shapes={wrong[:4]}"
            )
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(state[name])
