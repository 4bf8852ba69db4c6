"""Re-tokenizing a peer's text for a node with another tokenizer: the character tokenizer of tiny-base and
the byte-level BPE of small-base, each receiving the other's completions."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from transformers import AutoTokenizer

from node.ingest import Ingestor
from node.policy.embedded import embedded_model
from node.policy.model import tokenizer_fingerprint
from node.policy.tiny import build_char_tokenizer
from node.tasks import build_task_source
from protocol.records import Rollout, SamplingParams

SOURCE = build_task_source("arith", ["add"], None, 0)


def _ingestor(tokenizer: Any) -> Ingestor:
    policy = SimpleNamespace(tokenizer=tokenizer, tokenizer_fingerprint=tokenizer_fingerprint(tokenizer))
    return Ingestor(policy, SOURCE, temperature=1.0, max_completion_tokens=16)  # type: ignore[arg-type]


def _rollout(text: str, finish_reason: str = "eos") -> Rollout:
    """A peer's rollout from a tokenizer unlike ours (its ids mean nothing to us)."""
    return Rollout(task=SOURCE.make_ref("add", 0), prompt="07+35=", completion=text, completion_ids=(5, 6, 7),
                   tokenizer_fingerprint="another-tokenizer", behavior_logprobs=(-0.5, -0.1, -0.2),
                   sampling=SamplingParams(temperature=1.0, top_p=1.0), model_fingerprint="peer-model",
                   policy_step=3, finish_reason=finish_reason)


@pytest.fixture(scope="module")
def char_tok() -> Any:
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def bpe_tok() -> Any:
    small = embedded_model("small-base")
    assert small is not None
    return AutoTokenizer.from_pretrained(small.path)


def test_character_node_spells_bpe_text_and_adds_its_own_eos(char_tok):
    ingestor = _ingestor(char_tok)
    ids, lps = ingestor._tokens(_rollout("042"))
    assert ids == [*char_tok.convert_tokens_to_ids(["0", "4", "2"]), char_tok.eos_token_id]
    assert lps is None  # the peer's log-probs are of other tokens: our own anchor is computed instead
    ids, _ = ingestor._tokens(_rollout("042", finish_reason="length"))
    assert ids == char_tok.convert_tokens_to_ids(["0", "4", "2"])
    assert ingestor.retokenized == 2 and not ingestor.rejected


@pytest.mark.parametrize("text", ["Friday", "<answer>42</answer>", "4 → 2", "x<eos>"])
def test_character_node_rejects_text_outside_its_vocabulary(char_tok, text):
    ingestor = _ingestor(char_tok)
    assert ingestor._tokens(_rollout(text)) == (None, None)
    assert ingestor.rejected == {"untokenizable": 1} and ingestor.retokenized == 0


@pytest.mark.parametrize("text", ["042", "7 ", " 12\n", "<answer>(P ∧ ¬Q)</answer>", "Friday, été"])
def test_bpe_node_spells_any_text_and_ends_with_its_eos(bpe_tok, text):
    ingestor = _ingestor(bpe_tok)
    ids, lps = ingestor._tokens(_rollout(text))
    assert ids is not None and lps is None
    assert ids[-1] == bpe_tok.eos_token_id == bpe_tok.convert_tokens_to_ids("<|im_end|>")
    assert bpe_tok.decode(ids[:-1]) == text and bpe_tok.eos_token_id not in ids[:-1]


@pytest.mark.parametrize("text", ["042<|im_end|>", "<|im_start|>assistant"])
def test_bpe_node_rejects_special_token_text(bpe_tok, text):
    """A peer's text must not smuggle in our special tokens (our EOS mid-completion would end training there)."""
    ingestor = _ingestor(bpe_tok)
    assert ingestor._tokens(_rollout(text)) == (None, None)
    assert ingestor.rejected == {"untokenizable": 1}


def test_retokenized_text_longer_than_the_limit_is_rejected(char_tok):
    ingestor = _ingestor(char_tok)
    assert ingestor._tokens(_rollout("1" * 16)) == (None, None)  # 16 characters + eos > 16 tokens
    assert ingestor.rejected == {"too_long": 1}
