"""The sampling loop's forward passes over a static KV cache, with the decode step captured in a CUDA graph on
a GPU (``generation.hf.cuda_graphs``).

A small model's decode step on a GPU is launch-bound: hundreds of kernels of a few microseconds each,
dispatched one by one by the host. A CUDA graph records the step's kernels once and replays them with one
launch. That needs every tensor the step touches at a fixed address and a fixed shape: the KV cache is a
transformers ``StaticCache`` of ``prompt width + new tokens`` positions (it advances its own write position
on the device), the attention mask a 4-D boolean buffer of that width updated in place, and the batch keeps
its rows to the end (no rows dropped; finished rows draw padding, as in the dynamic loop). Every row's
prompt is computed (no group sharing): the prefill is a small part of a step's work on a GPU.

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
        self._graph: Any = None
        self._inputs: dict[str, torch.Tensor] = {}
        self._logits: torch.Tensor | None = None

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

    def step(self, tok: torch.Tensor, positions: torch.Tensor, step: int) -> torch.Tensor:
        """Decode ``tok`` ``[B]`` at ``positions`` ``[B, 1]``, the ``step``-th new token: next logits ``[B, V]``."""
        self.mask[:, 0, 0, self.width + step] = True
        if self.graphs and step > 0:  # step 0 runs eagerly: it warms up what the capture must not initialise
            try:
                return self._replay(tok, positions)
            except RuntimeError as exc:  # once a generation at most: the graph is dropped
                self._give_up(exc)
        out = self.model(input_ids=tok[:, None], attention_mask=self.mask, position_ids=positions,
                         past_key_values=self.cache, use_cache=True, logits_to_keep=1)
        return cast(torch.Tensor, out.logits[:, -1, :])

    def _replay(self, tok: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if self._graph is None:
            self._inputs = {"tok": tok[:, None].clone(), "positions": positions.clone()}
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):  # records the kernels; nothing runs (the cache does not advance)
                out = self.model(input_ids=self._inputs["tok"], attention_mask=self.mask,
                                 position_ids=self._inputs["positions"], past_key_values=self.cache, use_cache=True,
                                 logits_to_keep=1)
            self._graph, self._logits = graph, out.logits
        else:
            self._inputs["tok"].copy_(tok[:, None])
            self._inputs["positions"].copy_(positions)
        self._graph.replay()
        return cast(torch.Tensor, self._logits)[:, -1, :]

    def _give_up(self, exc: BaseException) -> None:
        self.graphs, self._graph = False, None
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
        if reason not in _warned:
            _warned.add(reason)
            logger.warning("CUDA graph capture of the decode step failed (%s): decoding eagerly", reason)


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
