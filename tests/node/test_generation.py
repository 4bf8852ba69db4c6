"""Generation: left padding, KV cache, behaviour log-probs and the EOS mask, on a random tiny Llama."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from node.generation.sampling import generate, sample_rows, top_p_filter
from node.policy.logprobs import (
    LOGIT_BYTES,
    left_pad,
    logit_micro_batches,
    right_pad,
    sequence_logprobs,
    shared_prompt_logprobs,
)
from node.sources.embedded.tiny import build_char_tokenizer


@pytest.fixture(scope="module")
def model_and_tokenizer():
    torch.manual_seed(0)
    tok = build_char_tokenizer()
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                      tie_word_embeddings=True, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    model = LlamaForCausalLM(cfg).eval()
    return model, tok


def _prompts(tok):
    texts = ["07+35=", "1+2=", "99*99=", "5="]
    return [[tok.bos_token_id, *tok(t, add_special_tokens=False)["input_ids"]] for t in texts]


def test_padding_helpers():
    ids, mask = left_pad([[1, 2], [3]], pad_id=0)
    assert ids.tolist() == [[1, 2], [0, 3]] and mask.tolist() == [[1, 1], [0, 1]]
    vals, m = right_pad([[1.5], [2.0, 3.0]], 0.0, torch.float32)
    assert vals.tolist() == [[1.5, 0.0], [2.0, 3.0]] and m.tolist() == [[True, False], [True, True]]


def test_top_p_filter_keeps_smallest_nucleus():
    # probs 0.5, 0.3, 0.2: top_p=0.6 keeps the first two (0.5 < 0.6, 0.5+0.3 >= 0.6), drops the third.
    logits = torch.log(torch.tensor([[0.2, 0.5, 0.3]]))
    out = top_p_filter(logits, 0.6)
    assert torch.isinf(out[0, 0]) and torch.isfinite(out[0, 1]) and torch.isfinite(out[0, 2])
    assert torch.equal(top_p_filter(logits, 1.0), logits)


def test_sample_rows_draws_each_token_at_its_probability_and_never_one_of_probability_zero():
    probs = torch.tensor([[0.5, 0.3, 0.2, 0.0, 0.0],
                          [0.0, 0.0, 0.0, 0.0, 1.0],
                          [0.0, 0.25, 0.25, 0.25, 0.25],
                          [0.1, 0.0, 0.0, 0.9, 0.0]])
    draws = 40_000
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros_like(probs)
    for _ in range(draws // 1000):
        tok = sample_rows(probs.repeat_interleave(1000, 0), gen).view(4, 1000)
        counts += torch.nn.functional.one_hot(tok, 5).sum(1)
    assert (counts[probs == 0] == 0).all()
    # each frequency within 5 standard deviations (at most 0.0125) of its probability
    assert ((counts / draws - probs).abs() < 5 * math.sqrt(0.25 / draws)).all(), counts / draws
    again = sample_rows(probs, torch.Generator().manual_seed(7))
    assert torch.equal(again, sample_rows(probs, torch.Generator().manual_seed(7)))


def test_sample_rows_on_a_large_vocabulary_with_a_tiny_tail():
    # Qwen2.5's vocabulary size; the last token filtered out (as top-p does) is never drawn.
    logits = torch.full((64, 151_936), -30.0)
    logits[:, 5] = 0.0
    logits[:, 151_935] = float("-inf")  # filtered out, as top-p does
    tok = sample_rows(torch.softmax(logits, -1), torch.Generator().manual_seed(0))
    assert (tok < 151_935).all() and (tok == 5).sum() >= 60


def test_greedy_batched_with_left_padding_equals_one_by_one(model_and_tokenizer):
    model, tok = model_and_tokenizer
    prompts = _prompts(tok)
    batched = generate(model, tok, prompts, max_new_tokens=6, greedy=True)
    for i, p in enumerate(prompts):
        alone = generate(model, tok, [p], max_new_tokens=6, greedy=True)
        assert batched.row(i)[0] == alone.row(0)[0]
        assert batched.row(i)[1] == pytest.approx(alone.row(0)[1], abs=1e-4)


def test_behaviour_logprobs_match_a_full_forward(model_and_tokenizer):
    model, tok = model_and_tokenizer
    prompts = _prompts(tok)
    gen = torch.Generator().manual_seed(1)
    out = generate(model, tok, prompts, max_new_tokens=6, temperature=1.0, generator=gen)
    p_ids, p_mask = left_pad(prompts, tok.pad_token_id)
    with torch.no_grad():
        lps = sequence_logprobs(model, p_ids, p_mask, out.completion_ids, out.completion_mask)
    m = out.completion_mask
    assert torch.allclose(lps[m], out.behavior_logprobs[m], atol=1e-4)
    assert (out.behavior_logprobs[m] <= 0).all()


def test_temperature_and_top_p_logprobs_are_of_the_sampled_distribution(model_and_tokenizer):
    model, tok = model_and_tokenizer
    prompts = _prompts(tok)[:1]
    gen = torch.Generator().manual_seed(2)
    out = generate(model, tok, prompts, max_new_tokens=1, temperature=0.7, top_p=0.9, generator=gen)
    with torch.no_grad():
        logits = model(torch.tensor(prompts)).logits[0, -1] / 0.7
    expected = torch.log_softmax(top_p_filter(logits[None], 0.9), -1)[0, out.completion_ids[0, 0]]
    assert out.behavior_logprobs[0, 0].item() == pytest.approx(expected.item(), abs=1e-5)
    assert math.isfinite(expected.item())


def test_mask_ends_at_first_eos(model_and_tokenizer):
    model, tok = model_and_tokenizer
    # Make EOS overwhelmingly likely after the first generated token: bias the output layer.
    biased = LlamaForCausalLM(model.config).eval()
    biased.load_state_dict(model.state_dict())
    with torch.no_grad():
        biased.lm_head.weight.zero_()
        biased.model.embed_tokens.weight.zero_()  # tied: every logit equals the same value ...
    # ... so sampling is uniform; force EOS by greedy argmax over equal logits -> id 0 (pad). Use a hook instead.
    eos = tok.eos_token_id

    def force_eos(_module, _inp, output):
        output.logits[..., :] = -1e4
        output.logits[..., eos] = 0.0
        return output

    handle = model.register_forward_hook(force_eos)
    try:
        out = generate(model, tok, _prompts(tok), max_new_tokens=5, greedy=True)
    finally:
        handle.remove()
    assert out.completion_ids[:, 0].tolist() == [eos] * 4
    assert out.completion_mask.sum(-1).tolist() == [1, 1, 1, 1]
    assert out.finish_reasons == ["eos"] * 4


def _eos_from_position(model, eos: int, position: int, batch_sizes: list[int]):
    """A hook that makes EOS certain for rows whose last position is at least ``position`` (prompts of
    different lengths then end at different steps) and records each forward's batch size."""

    def hook(_module, _args, kwargs, output):
        batch_sizes.append(int(kwargs["input_ids"].shape[0]))
        done = kwargs["position_ids"][:, -1] >= position
        output.logits[done, -1, :] = -1e4
        output.logits[done, -1, eos] = 0.0
        return output

    return model.register_forward_hook(hook, with_kwargs=True)


@pytest.mark.parametrize("greedy", [True, False])
def test_dropping_finished_rows_changes_nothing_but_the_work(model_and_tokenizer, monkeypatch, greedy):
    import node.generation.sampling as generation

    model, tok = model_and_tokenizer
    prompts = _prompts(tok)  # 7, 5, 7 and 3 tokens: forced EOS at position 9 ends them after 3, 5, 3 and 7
    outs, sizes = {}, {}
    for name, at in (("kept", -1.0), ("dropped", 1.0)):
        monkeypatch.setattr(generation, "_COMPACT_AT", at)
        sizes[name] = []
        handle = _eos_from_position(model, tok.eos_token_id, 8, sizes[name])
        try:
            gen = torch.Generator().manual_seed(3)
            outs[name] = generate(model, tok, prompts, max_new_tokens=10, greedy=greedy, generator=gen)
        finally:
            handle.remove()
    kept, dropped = outs["kept"], outs["dropped"]
    assert dropped.finish_reasons == ["eos"] * 4
    if greedy:  # the same tokens; sampling draws from a smaller batch once rows are dropped
        assert sizes["kept"] == [4] * 7 and sizes["dropped"] == [4, 4, 4, 2, 2, 1, 1]  # prefill, then a token each
        assert dropped.completion_mask.sum(-1).tolist() == [3, 5, 3, 7] == kept.completion_mask.sum(-1).tolist()
        assert torch.equal(dropped.completion_ids, kept.completion_ids)
        assert torch.allclose(dropped.behavior_logprobs, kept.behavior_logprobs, atol=1e-5)
    else:  # a sampled EOS can end a row sooner; each forward computes only the rows still going
        lengths = dropped.completion_mask.sum(-1).tolist()
        assert sizes["dropped"] == [sum(n > k for n in lengths) for k in range(max(lengths))]
        assert sizes["kept"] == [4] * max(kept.completion_mask.sum(-1).tolist())
    m = dropped.completion_mask
    assert (dropped.completion_ids[~m] == tok.pad_token_id).all() and (dropped.behavior_logprobs[~m] == 0).all()
    p_ids, p_mask = left_pad(prompts, tok.pad_token_id)
    with torch.no_grad():
        lps = sequence_logprobs(model, p_ids, p_mask, dropped.completion_ids, m)
    # The full forward does not see the hook's forced EOS at the last token, so compare what came before.
    before_eos = m & (dropped.completion_ids != tok.eos_token_id)
    assert torch.allclose(lps[before_eos], dropped.behavior_logprobs[before_eos], atol=1e-4)


def test_a_prompt_shared_by_a_group_is_computed_once(model_and_tokenizer):
    model, tok = model_and_tokenizer
    distinct = _prompts(tok)
    prompts = [distinct[i // 3] for i in range(12)]  # groups of 3 completions a prompt
    sizes: list[tuple[int, int]] = []
    handle = model.register_forward_hook(
        lambda _m, _a, kwargs, _o: sizes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    try:
        out = generate(model, tok, prompts, max_new_tokens=5, greedy=True)
        gen = torch.Generator().manual_seed(4)
        sampled = generate(model, tok, prompts, max_new_tokens=5, generator=gen)
    finally:
        handle.remove()
    assert sizes[0] == (4, 7)  # the prefill: 4 distinct prompts of up to 7 tokens ...
    assert all(b == 12 and n == 1 for b, n in sizes[1:5])  # ... then a token for each of the 12 sequences
    for i, p in enumerate(prompts):
        alone = generate(model, tok, [p], max_new_tokens=5, greedy=True)
        assert out.row(i)[0] == alone.row(0)[0]
        assert out.row(i)[1] == pytest.approx(alone.row(0)[1], abs=1e-4)
    assert len({tuple(sampled.row(i)[0]) for i in range(3)}) > 1  # a group's members are sampled apart
    p_ids, p_mask = left_pad(prompts, tok.pad_token_id)
    with torch.no_grad():
        lps = sequence_logprobs(model, p_ids, p_mask, sampled.completion_ids, sampled.completion_mask)
    m = sampled.completion_mask
    assert torch.allclose(lps[m], sampled.behavior_logprobs[m], atol=1e-4)


def test_logit_micro_batches_keep_the_logits_within_the_budget() -> None:
    # vocab 100, 12 bytes an entry: a row of completion length L costs (L + 1) * 1200 bytes at the batch's width.
    lengths = [3, 3, 9, 1, 1, 1, 40]
    assert logit_micro_batches(lengths, 100, 4 * 4 * 1200, 8) == [range(0, 2), range(2, 3), range(3, 6), range(6, 7)]
    # rows 0-1: 2 x 4 x 1200 fits 19,200, a third at width 10 would not; row 6 alone exceeds it and goes alone
    assert logit_micro_batches(lengths, 100, 10**9, 3) == [range(0, 3), range(3, 6), range(6, 7)]  # max_rows
    assert logit_micro_batches([], 100, 10, 3) == []
    for budget in (1, 5000, 20000, 10**6):
        batches = logit_micro_batches(lengths, 100, budget, 4)
        assert [i for b in batches for i in b] == list(range(len(lengths)))
        for b in batches:
            width = max(lengths[i] for i in b) + 1
            assert len(b) == 1 or len(b) * width * 100 * LOGIT_BYTES <= budget


def test_logit_micro_batches_keep_a_groups_rows_together_where_they_fit() -> None:
    lengths = [3] * 10
    groups = [0, 0, 0, 1, 1, 1, 1, 2, 2, 2]
    # four rows a batch: the cut at row 4 would split group 1, so it moves back to row 3
    assert logit_micro_batches(lengths, 100, 10**9, 4, groups) == [range(0, 3), range(3, 7), range(7, 10)]
    assert logit_micro_batches(lengths, 100, 10**9, 4) == [range(0, 4), range(4, 8), range(8, 10)]
    # a group larger than a batch, at a batch's start, is split where the limit falls
    assert logit_micro_batches(lengths, 100, 10**9, 2, groups) == [range(0, 2), range(2, 3), range(3, 5),
                                                                    range(5, 7), range(7, 9), range(9, 10)]
    for rows in (1, 2, 3, 5, 7):
        batches = logit_micro_batches(lengths, 100, 10**9, rows, groups)
        assert [i for b in batches for i in b] == list(range(10))
        assert all(len(b) <= rows for b in batches)


def _lora_model(model):
    """A copy of ``model`` with rank-4 LoRA adapters whose B is not zero, so the adapters change its output."""
    import copy

    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(copy.deepcopy(model), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj",
                                                                                                  "down_proj"]))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1, generator=torch.Generator().manual_seed(len(name)))
    return peft_model.train()


def _grouped_rows(tok):
    """Three groups of different prompt lengths, completions from 1 to 9 tokens (one of them a lone row)."""
    prompts = _prompts(tok)
    rows = [(prompts[0], [5, 6, 7]), (prompts[0], [8]), (prompts[0], [9, 10, 11, 12, 13, 14, 15, 16, 17]),
            (prompts[1], [20, 21]), (prompts[1], [22, 23, 24, 25]), (prompts[2], [30, 31, 32])]
    c_ids, c_mask = right_pad([c for _, c in rows], tok.pad_token_id, torch.long)
    return [p for p, _ in rows], c_ids, c_mask


def _logprobs_and_grads(model, fn):
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = None
    lps, mask = fn()
    (lps * mask).sum().backward()
    return lps.detach(), [p.grad.clone() for p in params]


@pytest.mark.parametrize("distinct", [False, True])  # distinct: no two rows share a prompt (every row in full)
def test_a_shared_prompt_gives_the_full_passs_logprobs_and_gradients(model_and_tokenizer, distinct):
    model, tok = model_and_tokenizer
    lora = _lora_model(model)
    prompts, c_ids, c_mask = _grouped_rows(tok)
    if distinct:
        prompts = [[*p, *[tok.pad_token_id + 3] * i] for i, p in enumerate(prompts)]
    p_ids, p_mask = left_pad(prompts, tok.pad_token_id)
    full, full_grads = _logprobs_and_grads(lora, lambda: (sequence_logprobs(lora, p_ids, p_mask, c_ids, c_mask),
                                                          c_mask))
    shared, shared_grads = _logprobs_and_grads(lora, lambda: (shared_prompt_logprobs(
        lora, prompts, c_ids, c_mask, pad_id=tok.pad_token_id), c_mask))
    assert torch.allclose(full[c_mask], shared[c_mask], atol=1e-5)
    for a, b in zip(full_grads, shared_grads):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)
    assert any(g.abs().max() > 0 for g in shared_grads)


def test_a_shared_prompt_runs_once_for_its_group(model_and_tokenizer):
    """The model sees each of the 3 distinct prompts once (padded to the widest), then the 6 completions
    without their last token, which predicts nothing; the full pass runs 6 prompts and whole completions."""
    model, tok = model_and_tokenizer
    prompts, c_ids, c_mask = _grouped_rows(tok)
    seen: list[int] = []
    handle = model.model.embed_tokens.register_forward_hook(lambda _m, inp, _out: seen.append(int(inp[0].numel())))
    try:
        with torch.no_grad():
            shared_prompt_logprobs(model, prompts, c_ids, c_mask, pad_id=tok.pad_token_id)
    finally:
        handle.remove()
    widest_prompt = max(len(p) for p in prompts)
    assert seen == [3 * widest_prompt, 6 * (c_ids.shape[1] - 1)]
