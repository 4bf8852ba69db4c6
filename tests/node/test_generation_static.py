"""The sampling loop over a static KV cache (``generation.hf.cuda_graphs``): on the CPU it runs eagerly and
must give what the dynamic loop gives, with left padding, EOS and the model's context; on CUDA (gpu-marked)
the decode step is captured in a CUDA graph and must give the same again."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import node.generation.sampling as generation
import node.generation.static as generation_static
from node.config import AdapterConfig, ModelConfig
from node.generation.base import SamplingSettings
from node.generation.hf import HFBackend
from node.generation.sampling import generate
from node.policy.logprobs import left_pad, sequence_logprobs
from node.policy.model import Policy, build_policy

TEXTS = ["07+35=", "1+2=", "99+9=", "5+50="]


def _policy(name: str, device: str = "cpu") -> Policy:
    policy = build_policy(ModelConfig(name_or_path=name, device=device), AdapterConfig(train_norms=True), seed=0)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in policy.model.parameters():
            if p.requires_grad:
                p.add_((torch.randn(p.shape, generator=gen) * 0.02).to(p.device))
    return policy


def _prompts(policy: Policy) -> list[list[int]]:
    tok = policy.tokenizer
    bos = [] if tok.bos_token_id is None else [tok.bos_token_id]
    return [[*bos, *tok(t, add_special_tokens=False)["input_ids"]] for t in TEXTS] * 3


@pytest.mark.parametrize("name", ["tiny-base", "small-base"])
@pytest.mark.parametrize("greedy", [True, False])
def test_the_static_cache_loop_gives_what_the_dynamic_loop_gives(monkeypatch, name, greedy):
    monkeypatch.setattr(generation, "_COMPACT_AT", -1.0)  # sampling draws alike only where no row is dropped
    policy = _policy(name)
    long = (_prompts(policy)[0] * 200)[: (policy.context_length or 64) - 6]  # ends at the model's context
    prompts = _prompts(policy) + [long]
    runs = {}
    for static in (False, True):
        runs[static] = generate(policy.model, policy.tokenizer, prompts, max_new_tokens=12, greedy=greedy,
                                generator=torch.Generator().manual_seed(4), max_len=policy.context_length,
                                cuda_graphs=static)
    dynamic, static = runs[False], runs[True]
    assert torch.equal(dynamic.completion_ids, static.completion_ids)
    assert torch.equal(dynamic.completion_mask, static.completion_mask)
    assert dynamic.finish_reasons == static.finish_reasons and "eos" in static.finish_reasons
    assert int(static.completion_mask[-1].sum()) <= 6  # never past the model's context
    torch.testing.assert_close(dynamic.behavior_logprobs, static.behavior_logprobs, atol=1e-5, rtol=0)
    p_ids, p_mask = left_pad(prompts, policy.tokenizer.pad_token_id)
    with torch.no_grad():
        lps = sequence_logprobs(policy.model, p_ids, p_mask, static.completion_ids, static.completion_mask)
    m = static.completion_mask
    assert (lps[m] - static.behavior_logprobs[m]).abs().max() < 1e-4  # the trainer's check


def test_a_kept_decoder_gives_what_a_new_one_gives_across_calls_of_other_widths(monkeypatch):
    """``generation.hf.keep_graphs``: a pooled decoder, reset between calls whose prompts differ in width and
    content, gives each call what a decoder made for it gives; calls of nearby widths share one."""
    monkeypatch.setattr(generation, "_COMPACT_AT", -1.0)
    policy = _policy("tiny-base")
    base = _prompts(policy)
    calls = [base, [p + p[1:] for p in base], [p[:-1] or p for p in base], base]  # widths w, ~2w, w-1, w
    pool = generation_static.DecoderPool()
    for k, prompts in enumerate(calls):
        kw = dict(max_new_tokens=10, greedy=k % 2 == 0, max_len=policy.context_length, cuda_graphs=True)
        fresh = generate(policy.model, policy.tokenizer, prompts, generator=torch.Generator().manual_seed(k), **kw)
        kept = generate(policy.model, policy.tokenizer, prompts, generator=torch.Generator().manual_seed(k),
                        decoders=pool, **kw)
        assert torch.equal(fresh.completion_ids, kept.completion_ids), k
        assert torch.equal(fresh.completion_mask, kept.completion_mask), k
        torch.testing.assert_close(fresh.behavior_logprobs, kept.behavior_logprobs, atol=1e-5, rtol=0)
    widths = [max(len(p) for p in c) + 10 for c in calls]
    lengths = {-(-w // generation_static.LENGTH_STEP) for w in widths}
    assert pool.created == len(lengths) and pool.reused == len(calls) - len(lengths)


def test_a_pool_keeps_a_bounded_number_of_decoders_and_refuses_a_batch_it_was_not_made_for():
    policy = _policy("tiny-base")
    pool = generation_static.DecoderPool(max_size=2)
    for width in (3, 70, 140, 3):  # three lengths (64, 128, 192) then the first again, evicted by then
        mask = torch.ones((2, width), dtype=torch.long)
        pool.decoder(policy.model, mask, 8, graphs=True)
    assert pool.created == 4 and pool.reused == 0
    kept = pool.decoder(policy.model, torch.ones((2, 3), dtype=torch.long), 8, graphs=True)
    assert pool.reused == 1 and kept.length == 64 and kept.width == 3
    with pytest.raises(ValueError, match="cannot take 3 x 3"):
        kept.reset(torch.ones((3, 3), dtype=torch.long))


def test_the_backend_asks_for_graphs_only_on_cuda():
    """Both halves of the choice, without a GPU: the backend reads the policy's device and builds nothing on
    it, so the policy here is told it is on CUDA. Graphs (and, with ``keep_graphs``, a pool of decoders) where
    it is and they are asked for; neither on the CPU, asked or not."""
    cpu = _policy("tiny-base")
    cuda = dataclasses.replace(cpu, device=torch.device("cuda"))
    chosen = {(policy.device.type, graphs, keep): (backend.cuda_graphs, backend.decoders is not None)
              for policy in (cpu, cuda) for graphs in (False, True) for keep in (False, True)
              for backend in [HFBackend(policy, batch_size=8, cuda_graphs=graphs, keep_graphs=keep)]}
    assert chosen == {("cpu", False, False): (False, False), ("cpu", False, True): (False, False),
                      ("cpu", True, False): (False, False), ("cpu", True, True): (False, False),
                      ("cuda", False, False): (False, False), ("cuda", False, True): (False, False),
                      ("cuda", True, False): (True, False), ("cuda", True, True): (True, True)}


class _HostReads(TorchDispatchMode):
    """Counts, while ``counting``, the operations by which the host reads device values: a scalar's read
    (``.item()``, ``bool()``, ``int()``), a result whose size depends on values (``nonzero``) and a copy from
    another device into CPU memory (``.cpu()``; a non-blocking copy to pinned memory, which does not wait, is
    counted too); the test counts ``.tolist()`` beside it."""

    SCALAR = {"aten.item", "aten.is_nonzero", "aten._local_scalar_dense", "aten.nonzero"}

    def __init__(self) -> None:
        super().__init__()
        self.counting = False
        self.reads: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.counting:
            name = str(func.overloadpacket)
            sources = [a for a in args if isinstance(a, torch.Tensor)]
            to_host = isinstance(out, torch.Tensor) and out.device.type == "cpu" and any(
                t.device.type != "cpu" for t in sources)
            if name in self.SCALAR or (name in ("aten._to_copy", "aten.copy_") and to_host):
                self.reads.append(name)
        return out


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_the_captured_decode_loop_reads_the_device_at_most_once_a_window(monkeypatch, device):
    """The decode loop over the static cache (``generation.hf.cuda_graphs``), sampling at temperature:
    from its first decode step to its last, the host reads device values at most once every
    ``live_check_interval`` steps (every step on the CPU, where the read costs nothing; every 8th on CUDA,
    a non-blocking copy it looks at once it has arrived), never inside a step (on CUDA the step is captured
    in a graph, and a read there would break the capture). Caught: an ``.item()``, ``int()`` or ``.tolist()``
    in the step (two reads a step on the CPU), the probe reading every step on CUDA."""
    policy = _cuda_policy() if device == "cuda" else _policy("tiny-base")
    counter = _HostReads()
    steps = []
    run, loop = generation_static.StaticDecoder.run, generation._static_loop

    def counted_run(self, key, step_fn, step):
        counter.counting = True  # from the first decode step (the prefill and the set-up before it are not)
        steps.append(step)
        return run(self, key, step_fn, step)

    def counted_loop(*args, **kwargs):
        out = loop(*args, **kwargs)
        counter.counting = False  # what generate reads once, after the loop, is not the loop's
        return out

    def counted_tolist(self):  # on the CPU it dispatches no operation
        if counter.counting:
            counter.reads.append("tolist")
        return tolist(self)

    tolist = torch.Tensor.tolist
    monkeypatch.setattr(generation_static.StaticDecoder, "run", counted_run)
    monkeypatch.setattr(generation, "_static_loop", counted_loop)
    monkeypatch.setattr(torch.Tensor, "tolist", counted_tolist)
    prompts = _prompts(policy)
    with counter:
        out = generate(policy.model, policy.tokenizer, prompts, max_new_tokens=24, temperature=0.8,
                       generator=torch.Generator(device=policy.device).manual_seed(3), device=policy.device,
                       max_len=policy.context_length, cuda_graphs=True)
    window = generation.live_check_interval(policy.device)
    assert out.completion_mask.any() and len(steps) >= 2
    assert len(counter.reads) <= -(-len(steps) // window), (len(steps), window, counter.reads)
    assert not generation_static._warned, generation_static._warned  # on CUDA: captured, not fallen back


def _cuda_policy() -> Policy:
    """small-base on CUDA (the test skipped where there is none), with no capture warning left from before."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    generation_static._warned.clear()
    return _policy("small-base", device="cuda")


@pytest.mark.gpu
def test_on_cuda_the_captured_decode_step_gives_what_the_eager_loop_gives():
    policy = _cuda_policy()
    prompts = _prompts(policy)
    settings = SamplingSettings(max_new_tokens=16, greedy=True)
    eager = HFBackend(policy, batch_size=64).generate(prompts, settings)
    graphed = HFBackend(policy, batch_size=64, cuda_graphs=True).generate(prompts, settings)
    assert not generation_static._warned, generation_static._warned  # captured, not fallen back
    assert torch.equal(eager.completion_ids, graphed.completion_ids)
    torch.testing.assert_close(eager.behavior_logprobs, graphed.behavior_logprobs, atol=1e-4, rtol=0)


@pytest.mark.gpu
def test_on_cuda_a_kept_graph_replays_for_later_calls_of_other_widths():
    """``generation.hf.keep_graphs``: the graph captured by the first call is replayed by the later ones
    (other prompts, other widths), which still give what the eager loop gives."""
    policy = _cuda_policy()
    base = _prompts(policy)
    settings = SamplingSettings(max_new_tokens=16, greedy=True)
    eager = HFBackend(policy, batch_size=64)
    kept = HFBackend(policy, batch_size=64, cuda_graphs=True, keep_graphs=True)
    for prompts in (base, [p + p[1:] for p in base], [p[:-1] for p in base]):
        want, got = eager.generate(prompts, settings), kept.generate(prompts, settings)
        assert torch.equal(want.completion_ids, got.completion_ids)
        torch.testing.assert_close(want.behavior_logprobs, got.behavior_logprobs, atol=1e-4, rtol=0)
    assert not generation_static._warned, generation_static._warned
    assert kept.decoders is not None and kept.decoders.created == 1 and kept.decoders.reused == 2


@pytest.mark.gpu
def test_on_cuda_a_captured_sampling_step_gives_what_the_eager_loop_gives():
    """The whole decode step in one graph (the draw at temperature and top-p, the bookkeeping, the forward):
    the same tokens as the eager loop from the same uniform numbers, log-probs within float rounding, and
    every row's end found without the host reading the device between steps."""
    policy = _cuda_policy()
    prompts = _prompts(policy)
    settings = SamplingSettings(max_new_tokens=24, temperature=0.8, top_p=0.9)
    runs = {}
    for graphs in (False, True):
        backend = HFBackend(policy, batch_size=64, cuda_graphs=graphs, keep_graphs=True)
        runs[graphs] = [backend.generate(prompts, settings, torch.Generator(device=policy.device).manual_seed(s))
                        for s in (3, 4)]  # the second call replays the first call's graph
    assert not generation_static._warned, generation_static._warned
    for eager, graphed in zip(runs[False], runs[True], strict=True):
        assert torch.equal(eager.completion_ids, graphed.completion_ids)
        assert torch.equal(eager.completion_mask, graphed.completion_mask)
        assert eager.finish_reasons == graphed.finish_reasons
        torch.testing.assert_close(eager.behavior_logprobs, graphed.behavior_logprobs, atol=1e-4, rtol=0)
