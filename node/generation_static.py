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
"""

from __future__ import annotations

import logging
from typing import Any, cast

import torch
from torch import nn

logger = logging.getLogger(__name__)
_warned: set[str] = set()


class StaticDecoder:
    """Prefill, then one decode step a token, for ``B`` rows and up to ``max_new_tokens`` positions each."""

    def __init__(self, model: nn.Module, prompt_mask: torch.Tensor, max_new_tokens: int, *, graphs: bool) -> None:
        from transformers import StaticCache

        self.model = model
        batch, width = prompt_mask.shape
        self.width = width
        length = width + max_new_tokens
        config: Any = getattr(model, "config", None)
        self.cache = StaticCache(config=config, max_cache_len=length)
        keys = torch.zeros((batch, 1, 1, length), dtype=torch.bool, device=prompt_mask.device)
        keys[:, 0, 0, :width] = prompt_mask.bool()
        self.mask = keys  # what the next decode step's query may attend to
        self.graphs = graphs and prompt_mask.device.type == "cuda"
        self._graph: Any = None
        self._inputs: dict[str, torch.Tensor] = {}
        self._logits: torch.Tensor | None = None

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
