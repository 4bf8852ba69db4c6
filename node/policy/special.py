"""Which tokens end a completion and which a completion never contains: what the sampling loops (the HF loop,
its static decoder, the vLLM engine) and the receivers of a node's rollouts agree on.

A completion ends at the first of the model's end-of-sequence ids: the tokenizer's ``eos_token_id`` and
every id its generation config declares (``eos_token_id`` may be a list there, e.g. an instruct model's
``<|im_end|>`` beside ``<|endoftext|>``). Every other special token (pad, bos, unk, chat markers) is
masked out of the sampled distribution, and so are ids past the tokenizer's vocabulary (a model's output
layer may be wider): a receiver with our tokenizer rejects a completion with a special token before its
end (``special_token``) or an id outside the vocabulary (``bad_token_id``, an offence that bans the
author), so an honest node must never sample one.

The mask is part of the policy (``mask_output``): the model's output layer adds ``sampling_bias`` to its
logits, so the distribution the node samples from, the one its trainer computes log-probs of and the one
its ingestion anchors peers' text with are the same (a renormalisation over the allowed tokens: the
behaviour log-probs stay the trainer's to float rounding). The vLLM engine gets the same mask as its
``logit_bias``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def stop_ids(model: Any, tokenizer: Any) -> tuple[int, ...]:
    """The ids that end a completion: the tokenizer's eos first, then those the generation config adds."""
    ids: list[int] = []
    if tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    declared = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for i in [declared] if isinstance(declared, int) else list(declared or []):
        if int(i) not in ids:
            ids.append(int(i))
    return tuple(ids)


def banned_ids(tokenizer: Any, stops: Sequence[int]) -> tuple[int, ...]:
    """Special ids a completion never contains: every special id of ``tokenizer`` but ``stops``."""
    return tuple(sorted({int(i) for i in tokenizer.all_special_ids} - set(stops)))


def sampling_bias(tokenizer: Any, stops: Sequence[int], vocab: int, device: torch.device) -> torch.Tensor:
    """``[vocab]`` float32, ``-inf`` on the banned ids and on ids past the tokenizer's vocabulary, 0 elsewhere:
    added to the logits before temperature and top-p."""
    bias = torch.zeros(vocab, dtype=torch.float32)
    banned = [i for i in banned_ids(tokenizer, stops) if i < vocab]
    if banned:
        bias[torch.tensor(banned)] = float("-inf")
    bias[min(len(tokenizer), vocab) :] = float("-inf")
    return bias.to(device)


def mask_output(model: Any, tokenizer: Any) -> None:
    """Make ``model``'s output layer add ``sampling_bias`` to its logits (a non-persistent buffer
    ``logit_bias`` on that layer, moved with the model and shared by copies of it, and a forward hook).

    A model that soft-caps its logits after the output layer (Gemma 2: ``cap * tanh(logits / cap)``) would
    turn the ``-inf`` into ``-cap`` there, and a banned token into a possible one: its hook adds the bias to
    the model's output logits instead, after the cap."""
    head = model.get_output_embeddings()
    bias = sampling_bias(tokenizer, stop_ids(model, tokenizer), int(head.weight.shape[0]), head.weight.device)
    head.register_buffer("logit_bias", bias, persistent=False)
    if getattr(getattr(model, "config", None), "final_logit_softcapping", None):
        model.register_forward_hook(_add_bias_after_cap)
    else:
        head.register_forward_hook(_add_logit_bias)


def _add_logit_bias(module: Any, _inputs: Any, out: torch.Tensor) -> torch.Tensor:
    bias: torch.Tensor = module.logit_bias
    return out + bias.to(out.dtype)


def _add_bias_after_cap(model: Any, _inputs: Any, out: Any) -> Any:
    bias: torch.Tensor = model.get_output_embeddings().logit_bias
    out.logits = out.logits + bias.to(out.logits.dtype)
    return out


def output_bias(model: Any) -> torch.Tensor | None:
    """The bias ``mask_output`` gave ``model``'s output layer, or None."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return getattr(head, "logit_bias", None)
