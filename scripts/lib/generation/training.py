"""``bench_generation.py --train-steps N``: N trainer steps of the node loop on the first model, generation
with vLLM; tokens/s, step time, peak accelerator memory and the engine/trainer log-prob gap a step."""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from node.generation.base import GenerationBackend, SamplingSettings
from scripts.lib.generation.workload import engine_config, load_model, step_prompts, sync_device, workload


def run_training(args: argparse.Namespace) -> None:
    """N trainer steps of the first model with vLLM generation: tokens/s, step time, memory, gap."""
    from node.generation.vllm_engine import VLLMBackend
    from node.train.groups import TrainGroup
    from node.train.trainer import Trainer

    kind = args.models.split(",")[0]
    with tempfile.TemporaryDirectory(prefix="bench-generation-") as tmp:
        policy, folder, label, tasks = load_model(kind, Path(tmp), args.dtype, args.device)
        sequences, tokens = workload(kind, args)
        sequences = max(2, sequences)
        prompts = step_prompts(policy, sequences, tasks=tasks, kind=kind)
        group = 8 if sequences % 8 == 0 else 1
        trainer = Trainer(policy, lr=1e-5, norm_lr=1e-3, router_lr=1e-3, weight_decay=0.0, max_grad_norm=1.0,
                          loss="topr", eps_low=0.2, eps_high=0.28, length_norm=False, micro_batch_size=8,
                          temperature=1.0, gradient_checkpointing=args.gradient_checkpointing)
        engine: GenerationBackend = VLLMBackend(policy, folder, engine_config(args, compiled=args.compile),
                                                dtype=args.dtype, max_num_seqs=sequences, seed=0)
        gen = torch.Generator(device=policy.device).manual_seed(0)
        adv_gen = torch.Generator().manual_seed(1)
        settings = SamplingSettings(max_new_tokens=tokens)
        print(f"\n== training {label}: {args.train_steps} steps of {sequences} sequences x up to {tokens} tokens, "
              f"{args.dtype}, gradient checkpointing {args.gradient_checkpointing}")
        for step in range(1, args.train_steps + 1):
            t0 = time.perf_counter()
            out = engine.generate(prompts, settings, gen)
            t_gen = time.perf_counter() - t0
            groups = []
            for g0 in range(0, sequences, group):
                rows = [out.row(i) for i in range(g0, g0 + group)]
                groups.append(TrainGroup(key=str(g0), peer_id="", epoch=0, prompt_ids=prompts[g0],
                                         completions=[r[0] for r in rows], anchor_logprobs=[r[1] for r in rows],
                                         rewards=[0.0] * group,
                                         advantages=torch.randn(group, generator=adv_gen)))
            stats = trainer.step(groups)
            sync = engine.sync()["sync_seconds"]
            sync_device()
            dt = time.perf_counter() - t0
            n_tok = int(out.completion_mask.sum())
            mem = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else float("nan")
            print(f"step {step:>3}: {n_tok / t_gen:>8.0f} gen tok/s, {n_tok / dt:>8.0f} tok/s a step, "
                  f"step {dt:6.2f} s (gen {t_gen:.2f}, sync {sync:.3f}), peak mem {mem:.1f} GiB, "
                  f"gap |d| {stats.get('logprob_gap_abs', float('nan')):.2e} KL {stats.get('logprob_gap_kl', float('nan')):.1e}",
                  flush=True)
        engine.close()
