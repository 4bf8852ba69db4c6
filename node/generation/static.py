"""The sampling loop's forward passes over a static KV cache, with each whole decode step captured in a CUDA
graph on a GPU (``generation.hf.cuda_graphs``).

A small model's decode step on a GPU is launch-bound: hundreds of kernels of a few microseconds each,
dispatched one by one by the host. A CUDA graph records the step's kernels once and replays them with one
launch. That needs every tensor the step touches at a fixed address and a fixed shape: the KV cache is a
transformers ``StaticCache`` of ``prompt width + new tokens`` positions (it advances its own write position
on the device), the attention mask a 4-D boolean buffer of that width updated in place, and the batch keeps
its rows to the end (no rows dropped; finished rows draw padding, as in the dynamic loop). Every row's
prompt is computed (no group sharing): the prefill is a small part of a step's work on a GPU.

The step captured is the whole of it (``node.generation.sampling``): the draw from the last logits
(temperature, top-p and the inversion of the cumulative distribution at a uniform number drawn for the
call beforehand), the bookkeeping (tokens, log-probs and the mask written at the step's column, rows ended
at a stop id or the context) and the forward pass of the drawn tokens, every one of them reading and
writing the fixed tensors of a ``StepState`` (the step index and the prompt width on the device too). The
host replays one graph a token and reads nothing back between steps. A graph is kept per sampling setting
(greedy or not, temperature, top-p, stop ids, context).

Where capture fails (an operation that waits for the host, an unsupported kernel) the steps run eagerly on
the same static cache, with a warning once: the same numbers, without the launch saving. On the CPU the
static path runs eagerly (the tests compare it with the dynamic loop there).

A ``DecoderPool`` (``generation.hf.keep_graphs``) keeps each decoder, its cache and its captured graph for the
next generation of the same batch size: the decode step's shapes do not depend on the prompt's width, only on
the cache's length, so a cache a little longer than a call needs (rounded up to ``LENGTH_STEP`` positions)
serves every call that fits it; a call resets the cache and the mask in place and replays the graph it
captured before, instead of allocating a cache and capturing again. The graph reads the weights where they
are: the merged copy and the adapters are updated in place, never replaced.
"""

from __future__ import annotations

import logging
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, cast

import torch
from torch import nn

logger = logging.getLogger(__name__)
_warned: set[str] = set()


class StaticDecoder:
    """Prefill, then one decode step a token, for ``B`` rows and up to ``max_new_tokens`` positions each."""

    def __init__(self, model: nn.Module, prompt_mask: torch.Tensor, max_new_tokens: int, *, graphs: bool,
                 length: int | None = None) -> None:
        from transformers import StaticCache

        self.model = model
        batch, width = prompt_mask.shape
        length = width + max_new_tokens if length is None else length
        if length < width + max_new_tokens:
            raise ValueError(f"a static cache of {length} positions cannot hold {width} + {max_new_tokens}")
        config: Any = getattr(model, "config", None)
        self.cache = StaticCache(config=config, max_cache_len=length)
        # what the next decode step's query may attend to
        self.mask = torch.zeros((batch, 1, 1, length), dtype=torch.bool, device=prompt_mask.device)
        self.width = 0
        self.reset(prompt_mask)
        self.graphs = graphs and prompt_mask.device.type == "cuda"
        self._graphs: dict[Any, Any] = {}
        self._state: StepState | None = None

    @property
    def length(self) -> int:
        """Positions the cache holds: prompt width and new tokens at most."""
        return int(self.mask.shape[-1])

    def reset(self, prompt_mask: torch.Tensor) -> None:
        """Ready for a new generation of ``prompt_mask``'s rows (the same batch size), in place: the cache empty,
        the mask the prompt's; a captured graph stays valid (it reads these same tensors)."""
        batch, width = prompt_mask.shape
        if batch != self.mask.shape[0] or width > self.length:
            raise ValueError(f"a decoder of {self.mask.shape[0]} rows x {self.length} positions cannot take "
                             f"{batch} x {width}")
        self.cache.reset()
        self.mask.zero_()
        self.mask[:, 0, 0, :width] = prompt_mask.bool()
        self.width = width

    def prefill(self, ids: torch.Tensor, prompt_mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The last prompt position's logits ``[B, V]``. Causal over the prompt, padding masked; a padding
        query attends to itself alone (a row of nothing but masked keys would give NaN)."""
        width, length = self.width, self.mask.shape[-1]
        causal = torch.ones((width, width), dtype=torch.bool, device=ids.device).tril()
        allowed = causal[None] & prompt_mask.bool()[:, None, :]
        allowed |= torch.eye(width, dtype=torch.bool, device=ids.device)[None] & ~prompt_mask.bool()[:, :, None]
        mask = torch.zeros((ids.shape[0], 1, width, length), dtype=torch.bool, device=ids.device)
        mask[:, 0, :, :width] = allowed
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=self.cache,
                         use_cache=True, logits_to_keep=1)
        return cast(torch.Tensor, out.logits[:, -1, :])

    def state(self, logits: torch.Tensor) -> StepState:
        """The fixed tensors of a sampling run over this decoder (made once, reset by each run)."""
        if self._state is None or self._state.logits.shape != logits.shape or self._state.logits.dtype != logits.dtype:
            self._state = StepState(self.mask.shape[0], self.length, logits)
            self._graphs.clear()
        return self._state

    def forward_token(self, tok: torch.Tensor, positions: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """Decode ``tok`` ``[B]`` at ``positions`` ``[B, 1]``, its cache column ``index`` (a ``[1]`` tensor):
        the next logits ``[B, V]``."""
        self.mask.index_fill_(3, index, True)
        out = self.model(input_ids=tok[:, None], attention_mask=self.mask, position_ids=positions,
                         past_key_values=self.cache, use_cache=True, logits_to_keep=1)
        return cast(torch.Tensor, out.logits[:, -1, :])

    def run(self, key: Any, step_fn: Callable[[], None], step: int) -> None:
        """Run ``step_fn`` (one decode step over this decoder's and its state's tensors): eagerly at a run's
        first step (it warms up what a capture must not initialise) or without graphs; else from the graph
        captured for ``key`` the first time, replayed ever after."""
        if self.graphs and step > 0:
            try:
                graph = self._graphs.get(key)
                if graph is None:
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):  # records the kernels; nothing runs
                        step_fn()
                    self._graphs[key] = graph
                graph.replay()
                return
            except RuntimeError as exc:  # once a generation at most: the graphs are dropped
                self._give_up(exc)
        step_fn()

    def _give_up(self, exc: BaseException) -> None:
        self.graphs = False
        self._graphs.clear()
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
        if reason not in _warned:
            _warned.add(reason)
            logger.warning("CUDA graph capture of the decode step failed (%s): decoding eagerly", reason)


class StepState:
    """What a decode step reads and writes, at fixed addresses: the last logits ``[B, V]``, the uniform
    numbers of the run ``[L, B, 1]``, the step index and the prompt width (``[1]``, on the device), which rows
    are alive or hit a stop id, each row's next position, and the tokens, log-probs and mask written so far
    ``[B, L]`` (``L``: the decoder's length, at least the new tokens of any run it takes)."""

    def __init__(self, batch: int, length: int, logits: torch.Tensor) -> None:
        device = logits.device
        self.logits = torch.zeros_like(logits)
        self.uniforms = torch.zeros((length, batch, 1), dtype=torch.float64, device=device)
        self.step = torch.zeros(1, dtype=torch.long, device=device)
        self.width = torch.zeros(1, dtype=torch.long, device=device)
        self.alive = torch.ones(batch, dtype=torch.bool, device=device)
        self.hit = torch.zeros(batch, dtype=torch.bool, device=device)
        self.next_pos = torch.zeros((batch, 1), dtype=torch.long, device=device)
        self.ids = torch.zeros((batch, length), dtype=torch.long, device=device)
        self.lps = torch.zeros((batch, length), dtype=torch.float32, device=device)
        self.mask = torch.zeros((batch, length), dtype=torch.bool, device=device)
        self._constants: dict[Any, torch.Tensor] = {}

    def start(self, logits: torch.Tensor, prompt_mask: torch.Tensor, pad_id: int, uniforms: torch.Tensor | None) -> None:
        """Ready for a run from the prefill's ``logits``, in place."""
        self.logits.copy_(logits)
        if uniforms is not None:
            self.uniforms[: uniforms.shape[0]].copy_(uniforms)
        self.step.zero_()
        self.width.fill_(prompt_mask.shape[1])
        self.alive.fill_(True)
        self.hit.zero_()
        self.next_pos.copy_(prompt_mask.sum(-1, keepdim=True))
        self.ids.fill_(pad_id)
        self.lps.zero_()
        self.mask.zero_()

    def constant(self, name: str, value: torch.Tensor) -> torch.Tensor:
        """``value`` on the device, the same tensor for every run that asks for the same one (a graph reads it)."""
        key = (name, tuple(value.tolist()))
        if key not in self._constants:
            self._constants[key] = value.to(self.logits.device)
        return self._constants[key]


LENGTH_STEP = 64
"""A pooled cache's length is the call's prompt width plus new tokens rounded up to this: calls whose prompts
differ by a few tokens share one cache and one graph (attention over up to 63 masked positions more)."""


class DecoderPool:
    """Static decoders kept between generations, ``max_size`` at most a model (least recently used first out),
    keyed by batch size and cache length; a model's entries go with the model."""

    def __init__(self, max_size: int = 4) -> None:
        self.max_size = max_size
        self._pools: weakref.WeakKeyDictionary[nn.Module, OrderedDict[tuple[int, int], StaticDecoder]] = (
            weakref.WeakKeyDictionary())
        self.created = 0
        self.reused = 0

    def decoder(self, model: nn.Module, prompt_mask: torch.Tensor, max_new_tokens: int, *,
                graphs: bool) -> StaticDecoder:
        """A decoder ready for ``prompt_mask``'s rows: a kept one whose cache is long enough, reset, or a new one."""
        batch, width = prompt_mask.shape
        need = width + max_new_tokens
        length = -(-need // LENGTH_STEP) * LENGTH_STEP
        pool = self._pools.setdefault(model, OrderedDict())
        key = (batch, length)
        found = pool.get(key)
        if found is not None and found.mask.device == prompt_mask.device:
            pool.move_to_end(key)
            found.reset(prompt_mask)
            self.reused += 1
            return found
        made = StaticDecoder(model, prompt_mask, max_new_tokens, graphs=graphs, length=length)
        pool[key] = made
        while len(pool) > self.max_size:
            pool.popitem(last=False)
        self.created += 1
        return made

    def clear(self) -> None:
        self._pools = weakref.WeakKeyDictionary()
