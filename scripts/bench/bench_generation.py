"""Generation throughput of the node's backends against transformers ``generate``, in one run, with ratios.

Usage: python scripts/bench/bench_generation.py [--models tiny,small,small-long,qwen0.5b,smollm2] [--threads 2]
                                          [--dtype float32] [--device cpu] [--reps 2] [--scale 1.0]
                                          [--no-vllm] [--vllm-modes merge,lora] [--compile]
       python scripts/bench/bench_generation.py --train-steps 20 --models qwen0.5b --device cuda --dtype bfloat16
       python scripts/bench/bench_generation.py --models smollm2 --count-ops

Models: ``tiny`` (the embedded tiny-base), ``small`` (``small-base`` when this checkout has it, else a
random-init Llama of its shape: hidden 512, 8 layers, head dim 64, vocabulary 8,192, about 25 M
parameters), ``small-long`` (small-base's shape and tokenizer with random weights, which seldom sample EOS:
its completions run to the token limit, where the trained small-base answers in about 4 tokens) and
``qwen0.5b`` (a random-init Qwen2 with Qwen2.5-0.5B's shape, built from a config here: no download) and
``smollm2`` (the pretrained smollm2-135m, fetched once: 64 sequences, 8 samples of 8 reasoning-gym
``basic_arithmetic`` prompts formatted through its chat template, as the node trains it). Every model gets
the node's policy: a LoRA of rank 8 on all projections (no trained norms, so both vLLM sync modes apply).
Under each table: the process's resident memory after each contender and its peak (vLLM runs in the same
process: its engine holds a second copy of the weights and its KV cache).

Contenders, on the same prompts (one "step" = sequences x new tokens; tokens counted up to EOS):

- ``generate/naive``: transformers ``generate`` one prompt at a time (on a subset of the prompts);
- ``generate/batched``: ``generate`` on the whole batch (left-padded), sampling at temperature 1;
- ``node-hf``: the node's own loop (``HFBackend``) as the node runs it, from merged weights
  (``generation.hf.weights=merged``; its sync after each step is the merged copy's refresh), which also
  returns the behaviour log-probs of its samples;
- ``node-hf-adapter``: the same loop on the adapter as trained (``generation.hf.weights=adapter``);
- ``node-hf-graphs`` (on CUDA): the merged loop with its decode step in a CUDA graph
  (``generation.hf.cuda_graphs=true``);
- ``vllm``: the in-process vLLM engine, merged weights pushed after each step (``sync=merge``);
- ``vllm-lora``: the same engine with the adapter hot-swapped as a LoRARequest (``sync=lora``);
- ``vllm-compiled`` (with ``--compile``): the ``vllm`` contender with the engine's compilation on
  (``generation.vllm.enforce_eager=false``: torch.compile, which needs a C++ compiler on CPU, and CUDA
  graphs on a GPU), at the price of a longer engine start.

Below each table, a torch.mm reference: the tokens/s of ``torch.mm`` alone on the base model's linear
layers (the same shapes, random weights) for a step's rows, which bounds the HF contenders (they compute
with these kernels), and the share of it each contender reached (vLLM's CPU kernels can pass it).

For the vLLM contenders the table also gives the policy-sync time a step (the adapters are moved first,
as an optimizer step would), tokens/s a step with the sync included, and the mean |engine - trainer|
log-prob of the sampled tokens. Times are the best of ``--reps`` runs after a warm-up. Contenders are
timed interleaved so that a loaded machine's drift hits them alike: the three HF contenders take turns
within each rep, and each vLLM step is followed by the node's HF loop on the same prompts, whose rate in
those reps is what the vLLM rows' ``x node-hf`` ratio (sync included) divides by.

``generate/naive`` runs at most 64 new tokens a prompt, on fewer prompts at larger scales (its rate is a
sequence's, whatever their number): at ``--scale 8`` it was 8 prompts x 512 tokens one token at a time,
which alone outlasted a 90 s limit on a GPU. ``--sequences`` and ``--tokens`` set a step's shape directly
(the smollm2 silo's: ``--sequences 64 --tokens 48``).

``--count-ops`` instead prints the profiler events a decode position costs (``generation_ops.py``): the
node's HF backend as the node configures it (the model's silo config's adapter), and the adapter as
trained beside it; bfloat16 unless ``--dtype`` says otherwise.

``--train-steps N`` instead trains N steps of the node loop's trainer on the first model (random
advantages on its own samples, since a random-init model earns no reward), generation with vLLM,
and prints tokens/s, step time, peak accelerator memory and the engine/trainer gap (scripts/gpu_check.sh).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from node.api.metrics import peak_rss_mb  # noqa: E402
from node.generation.base import SamplingSettings  # noqa: E402
from node.generation.hf import HFBackend  # noqa: E402
from node.generation.sampling import Completions  # noqa: E402
from node.policy.logprobs import left_pad, sequence_logprobs
from node.policy.model import Policy  # noqa: E402
from scripts.lib.generation.workload import (
    NODE_CONFIGS,
    engine_config,
    load_model,
    step_prompts,
    sync_device,
    workload,
)

NAIVE_PROMPTS = 8  # naive per-prompt generate is timed on this many prompts (its rate does not depend on it)
NAIVE_TOKENS = 64  # and at most this many new tokens a prompt


@dataclass
class Row:
    name: str
    tokens: int
    seconds: float
    sync_seconds: float = 0.0
    gap: float | None = None
    paired_hf: float | None = None  # node-hf tokens/s measured in the same reps (vLLM rows)
    notes: list[str] = field(default_factory=list)
    rss_mb: float = field(default_factory=lambda: rss_mb())  # the process's resident memory when the row was made

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / max(self.seconds, 1e-9)

    @property
    def step_tokens_per_s(self) -> float:
        return self.tokens / max(self.seconds + self.sync_seconds, 1e-9)


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def count_tokens(rows: torch.Tensor, eos: int) -> int:
    """Generated tokens up to and including the first EOS of each row ``[B, T]``."""
    is_eos = rows == eos
    first = torch.where(is_eos.any(-1), is_eos.float().argmax(-1) + 1, torch.full_like(rows[:, 0], rows.shape[1]))
    return int(first.sum())


def time_best(fn: Any, reps: int) -> tuple[float, Any]:
    best, out = float("inf"), None
    for _ in range(reps):
        sync_device()
        t0 = time.perf_counter()
        out = fn()
        sync_device()
        best = min(best, time.perf_counter() - t0)
    return best, out


def hf_generate(policy: Policy, prompts: list[list[int]], tokens: int) -> torch.Tensor:
    tok = policy.tokenizer
    ids, mask = left_pad(prompts, tok.pad_token_id)
    with torch.inference_mode():
        out = policy.model.generate(input_ids=ids.to(policy.device), attention_mask=mask.to(policy.device),  # type: ignore[operator]
                                    max_new_tokens=tokens, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                    pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    return torch.as_tensor(out[:, ids.shape[1] :].cpu())


def gap_of(policy: Policy, prompts: list[list[int]], out: Completions) -> float:
    p_ids, p_mask = left_pad(prompts, policy.tokenizer.pad_token_id)
    dev = policy.device
    with torch.no_grad():
        lps = torch.cat([
            sequence_logprobs(policy.model, p_ids[i : i + 64].to(dev), p_mask[i : i + 64].to(dev),
                              out.completion_ids[i : i + 64].to(dev), out.completion_mask[i : i + 64].to(dev)).cpu()
            for i in range(0, len(prompts), 64)
        ])
    m = out.completion_mask
    return float((lps[m].float() - out.behavior_logprobs[m]).abs().mean())


def move_adapters(policy: Policy, seed: int) -> None:
    """What an optimizer step does to the policy, as far as the engines are concerned."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in policy.model.parameters():
            if p.requires_grad:
                p.add_((torch.randn(p.shape, generator=gen) * 1e-3).to(p.device, p.dtype))


def bench_hf(policy: Policy, prompts: list[list[int]], tokens: int, reps: int,
             scale: float = 1.0) -> tuple[list[Row], HFBackend]:
    """The transformers contenders and the node's loop (merged weights, and the adapter as trained),
    interleaved: every rep moves the adapters (as an optimizer step would), syncs the node's backend and
    runs each contender once, back to back, so a change in the machine's load hits all of them alike.
    Best of ``reps``; the merged loop's sync is the median refresh."""
    eos = policy.tokenizer.eos_token_id
    settings = SamplingSettings(max_new_tokens=tokens)
    gen = torch.Generator(device=policy.device).manual_seed(0)
    naive = prompts[: max(1, int(NAIVE_PROMPTS / max(scale, 1.0)))]
    naive_tokens = min(tokens, NAIVE_TOKENS)
    backend = HFBackend(policy, batch_size=len(prompts))
    adapter = HFBackend(policy, batch_size=len(prompts), weights="adapter")
    hf_generate(policy, naive[:2], 2)  # warm-up
    for b in (backend, adapter):
        b.generate(naive[:2], SamplingSettings(max_new_tokens=2), gen)
    contenders = {"naive": lambda: [hf_generate(policy, [p], naive_tokens) for p in naive],
                  "batched": lambda: hf_generate(policy, prompts, tokens),
                  "node": lambda: backend.generate(prompts, settings, gen),
                  "adapter": lambda: adapter.generate(prompts, settings, gen)}
    if policy.device.type == "cuda":  # the merged loop with its decode step in a CUDA graph
        graphs = HFBackend(policy, batch_size=len(prompts), cuda_graphs=True)
        contenders["graphs"] = lambda: graphs.generate(prompts, settings, gen)
    best = dict.fromkeys(contenders, float("inf"))
    outs: dict[str, Any] = {}
    syncs: list[float] = []
    for rep in range(reps):
        move_adapters(policy, seed=1000 + rep)
        syncs.append(time_best(backend.sync, 1)[0])
        for name, fn in contenders.items():
            seconds, outs[name] = time_best(fn, 1)
            best[name] = min(best[name], seconds)
    node_out, adapter_out = outs["node"], outs["adapter"]
    sync = statistics.median(syncs) if backend.weights == "merged" else 0.0
    return [Row("generate/naive", sum(count_tokens(o, eos) for o in outs["naive"]), best["naive"]),
            Row("generate/batched", count_tokens(outs["batched"], eos), best["batched"]),
            Row("node-hf", int(node_out.completion_mask.sum()), best["node"], sync_seconds=sync,
                gap=gap_of(policy, prompts, node_out), notes=[f"weights {backend.weights}"]),
            Row("node-hf-adapter", int(adapter_out.completion_mask.sum()), best["adapter"],
                gap=gap_of(policy, prompts, adapter_out)),
            *([Row("node-hf-graphs", int(outs["graphs"].completion_mask.sum()), best["graphs"], sync_seconds=sync,
                   gap=gap_of(policy, prompts, outs["graphs"]))] if "graphs" in outs else [])], backend


def bench_vllm(policy: Policy, folder: str, prompts: list[list[int]], tokens: int, args: argparse.Namespace,
               mode: str, hf: HFBackend, *, compiled: bool = False) -> Row:
    """One engine; every rep is one step: the policy moves, reaches the engine, the engine samples, and the
    node's HF loop samples the same prompts right after (the paired rate the ``x node-hf`` column uses)."""
    from node.generation.vllm_engine import VLLMBackend

    settings = SamplingSettings(max_new_tokens=tokens)
    gen = torch.Generator(device=policy.device).manual_seed(0)
    t0 = time.perf_counter()
    engine = VLLMBackend(policy, folder, engine_config(args, sync=mode, compiled=compiled), dtype=args.dtype,
                         max_num_seqs=len(prompts), seed=0)
    started = time.perf_counter() - t0
    try:
        engine.generate(prompts[:4], SamplingSettings(max_new_tokens=2), gen)  # warm-up
        syncs, gens, hf_rates, out = [], [], [], None
        for rep in range(max(args.reps, 2)):
            move_adapters(policy, seed=rep)
            syncs.append(engine.sync()["sync_seconds"])
            t0 = time.perf_counter()
            out = engine.generate(prompts, settings, gen)
            gens.append(time.perf_counter() - t0)
            t_hf, hf_out = time_best(lambda: hf.generate(prompts, settings, gen), 1)
            hf_rates.append(int(hf_out.completion_mask.sum()) / t_hf)
        assert out is not None
        name = "vllm-lora" if mode == "lora" else "vllm-compiled" if compiled else "vllm"
        return Row(name, int(out.completion_mask.sum()), min(gens),
                   statistics.median(syncs), gap=gap_of(policy, prompts, out), paired_hf=max(hf_rates),
                   notes=[f"start {started:.1f} s"])
    finally:
        engine.close()
        gc.collect()


def matmul_reference(policy: Policy, rows: int, reps: int = 10) -> tuple[float, float]:
    """Tokens/s and GFLOP/s of ``torch.mm`` alone on the base model's linear layers (random weights of the
    same shapes, LM head included), ``rows`` sequences a decode step. The HF contenders compute with these
    kernels and do more besides (attention, norms, sampling), so they stay below it; vLLM's CPU backend runs
    its linear layers through its own prepacked oneDNN kernels, which can pass it."""
    base = policy.model.get_base_model() if hasattr(policy.model, "get_base_model") else policy.model
    shapes = [tuple(m.weight.shape) for n, m in base.named_modules()  # type: ignore[union-attr]
              if isinstance(m, torch.nn.Linear) and "lora_" not in n]
    dev, dtype = policy.device, next(base.parameters()).dtype  # type: ignore[union-attr]
    weights = [torch.randn(shape, device=dev, dtype=dtype) for shape in shapes]
    inputs = {w.shape[1]: torch.randn(rows, w.shape[1], device=dev, dtype=dtype) for w in weights}

    def step() -> None:
        for w in weights:
            torch.mm(inputs[w.shape[1]], w.t())

    step()
    seconds, _ = time_best(step, reps)
    return rows / seconds, sum(2 * rows * a * b for a, b in shapes) / seconds / 1e9


def print_table(label: str, sequences: int, tokens: int, rows: list[Row],
                reference: tuple[float, float] | None = None) -> None:
    base = next(r for r in rows if r.name == "node-hf")
    batched = next(r for r in rows if r.name == "generate/batched")
    print(f"\n== {label}: {sequences} sequences x up to {tokens} new tokens a step")
    print(f"{'contender':<18}{'tokens':>8}{'gen s':>9}{'tok/s':>10}{'sync s':>9}{'tok/s+sync':>12}"
          f"{'x node-hf':>11}{'gap':>10}")
    for r in rows:
        gap = f"{r.gap:.1e}" if r.gap is not None else "-"
        # sync: 3 significant digits, so a refresh under half a millisecond (tiny-base) does not print as 0
        print(f"{r.name:<18}{r.tokens:>8}{r.seconds:>9.2f}{r.tokens_per_s:>10.0f}{r.sync_seconds:>9.3g}"
              f"{r.step_tokens_per_s:>12.0f}{r.step_tokens_per_s / (r.paired_hf or base.step_tokens_per_s):>11.2f}"
              f"{gap:>10}"
              + (f"  ({'; '.join(r.notes)})" if r.notes else ""))
    if reference is not None:
        shares = ", ".join(f"{r.name} {r.tokens_per_s / reference[0]:.0%}" for r in rows
                           if not r.name.startswith("generate"))
        print(f"torch.mm reference (the base model's linear layers alone, {sequences} rows a step): "
              f"{reference[0]:.0f} tok/s at {reference[1]:.0f} GFLOP/s; share reached: {shares}")
    memory = ", ".join(f"{r.name} {r.rss_mb:,.0f}" for r in rows if r.rss_mb)
    print(f"resident memory after each contender (MB): {memory}; peak {peak_rss_mb():,.0f} MB")
    print(f"node-hf / generate/batched: {base.tokens_per_s / batched.tokens_per_s:.2f}x; load average "
          f"{os.getloadavg()[0]:.1f}", flush=True)


def run_bench(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-generation-") as tmp:
        for kind in args.models.split(","):
            policy, folder, label, tasks = load_model(kind, Path(tmp), args.dtype, args.device)
            sequences, tokens = workload(kind, args)
            prompts = step_prompts(policy, sequences, tasks=tasks, kind=kind)
            rows, hf = bench_hf(policy, prompts, tokens, args.reps, args.scale)
            if not args.no_vllm:
                for mode in args.vllm_modes.split(","):
                    rows.append(bench_vllm(policy, folder, prompts, tokens, args, mode, hf))
                if args.compile:
                    rows.append(bench_vllm(policy, folder, prompts, tokens, args, "merge", hf, compiled=True))
            for r in rows:  # progress, in case a later model does not finish
                paired = f", node-hf in the same reps {r.paired_hf:.0f} tok/s" if r.paired_hf else ""
                print(f"[{label}] {r.name}: {r.tokens_per_s:.0f} tok/s, sync {r.sync_seconds:.3f} s{paired}",
                      file=sys.stderr, flush=True)
            print_table(label, sequences, tokens, rows, matmul_reference(policy, sequences))
            del policy
            gc.collect()


def run_count_ops(args: argparse.Namespace) -> None:
    """Profiler events a decode position costs, each model's HF backend configured as its silo config does."""
    from node.config import load_config
    from scripts.lib.generation.ops import count_ops

    for kind in args.models.split(","):
        cfg = load_config(NODE_CONFIGS[kind]) if kind in NODE_CONFIGS else None
        adapter = cfg.adapter if cfg is not None else None
        with tempfile.TemporaryDirectory(prefix="bench-generation-") as tmp:
            policy, _, label, tasks = load_model(kind, Path(tmp), args.dtype, args.device, adapter)
            print(f"\n== {label}: profiler events a decode position (the adapter of "
                  f"{NODE_CONFIGS.get(kind, 'the bench defaults')})")
            g = cfg.generation if cfg is not None else None
            count_ops(policy, step_prompts(policy, 8, tasks=tasks, kind=kind)[0],
                      g.hf.weights if g is not None else "merged", g.batch_size if g is not None else 256)
            del policy
            gc.collect()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny,small,small-long,qwen0.5b")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                        help="default: float32; bfloat16 with --count-ops")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply sequences and tokens of every workload")
    parser.add_argument("--sequences", type=int, default=None, help="sequences a step (instead of the workload's)")
    parser.add_argument("--tokens", type=int, default=None, help="new tokens a step (instead of the workload's)")
    parser.add_argument("--count-ops", action="store_true",
                        help="print the profiler events a decode position costs in the node's HF loop, and exit")
    parser.add_argument("--no-vllm", action="store_true")
    parser.add_argument("--vllm-modes", default="merge,lora",
                        help="the vLLM contenders' weight syncs, e.g. merge (leaves out the slower LoRA engine)")
    parser.add_argument("--train-steps", type=int, default=0)
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--kv-bytes", type=int, default=1 << 30, help="vLLM KV cache size in bytes")
    parser.add_argument("--compile", action="store_true",
                        help="also time the engine compiled (torch.compile; CUDA graphs on GPU); training: compiled")
    args = parser.parse_args()
    bad = set(args.vllm_modes.split(",")) - {"merge", "lora"}
    if bad:
        parser.error(f"--vllm-modes: unknown {sorted(bad)}; choose from merge, lora")
    args.dtype = args.dtype or ("bfloat16" if args.count_ops else "float32")
    torch.set_num_threads(args.threads)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # small-base is looked up locally only
    print(f"torch {torch.__version__}, {args.threads} threads, {args.dtype} on {args.device}; "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    if args.count_ops:
        run_count_ops(args)
    elif args.train_steps:
        from scripts.lib.generation.training import run_training

        run_training(args)
    else:
        run_bench(args)


if __name__ == "__main__":
    main()
