"""How a receiver's model sees a peer model's completions: the mechanism behind a weak node learning (or not)
from a strong one.

Usage: python scripts/experiments/probe_peer_text.py [--models smollm2,small-base] [--datasets spell_backward,gcd]
                                         [--tasks 8] [--samples 8] [--threads 2]

Each model (its own config: ``configs/smollm2-silo.yaml``, ``configs/small-silo.yaml``) samples ``--samples``
completions at temperature 1 for the same held-out tasks of ``--datasets`` (the settings of bench_sapo's
``models`` setting), scored by the dataset's scorer. Then every model reads every model's completions as
ingestion does: the text re-tokenized with its own tokenizer, after its own prompt for the task, and its
per-token log-probs computed (``shared_prompt_logprobs``, the trainer's pass). Printed per (reader, author):
the mean log-prob a token, the share of completions it could spell, the mean reward, and the share of
groups with signal. A receiver trains on a peer group with the peer's rewards as advantages and its own
log-probs as the anchor; text its model gives a far lower log-prob than its own samples is far from
anything it samples, and one step of a few such groups moves its sampling little.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch

from node.config import load_config  # noqa: E402
from node.generation.base import SamplingSettings  # noqa: E402
from node.generation.hf import HFBackend  # noqa: E402
from node.generation.rollouts import encode_prompt, sample_groups  # noqa: E402
from node.policy.logprobs import right_pad, shared_prompt_logprobs  # noqa: E402
from node.policy.model import build_policy  # noqa: E402
from node.tasks import build_task_source  # noqa: E402

CONFIGS = {"smollm2": "configs/smollm2-silo.yaml", "small-base": "configs/small-silo.yaml"}
DATASET_CONFIGS = "tasks.dataset_configs={spell_backward: {max_word_len: 5}, gcd: {max_value: 50}}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="smollm2,small-base", help=f"comma-separated, of {list(CONFIGS)}")
    p.add_argument("--datasets", default="spell_backward,gcd")
    p.add_argument("--tasks", type=int, default=8, help="held-out tasks a dataset")
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    root = Path(__file__).resolve().parents[2]
    print(f"probe_peer_text: load average {os.getloadavg()[0]:.1f}", flush=True)
    nodes = {}
    for name in args.models.split(","):
        if name not in CONFIGS:
            raise SystemExit(f"--models: unknown model {name!r}; choose from {list(CONFIGS)}")
        cfg = load_config(root / CONFIGS[name], [f"tasks.datasets=[{args.datasets}]", DATASET_CONFIGS,
                                                "generation.backend=hf", "model.device=cpu"])
        policy = build_policy(cfg.model, cfg.adapter, cfg.seed)
        t = cfg.tasks
        source = build_task_source(t.source, list(t.datasets), None, cfg.seed, **t.source_options(cfg.model.chat_template))
        nodes[name] = (cfg, policy, source)
    first = next(iter(nodes.values()))[2]
    refs = first.eval_refs(args.tasks * len(first.datasets))
    samples = {}
    for name, (cfg, policy, source) in nodes.items():
        started = time.perf_counter()
        tasks = [source.task(r) for r in refs]
        settings = SamplingSettings(max_new_tokens=cfg.generation.max_new_tokens, temperature=1.0)
        groups = sample_groups(HFBackend(policy, batch_size=cfg.generation.batch_size), policy, source, tasks, group_size=args.samples,
                               generator=torch.Generator().manual_seed(0), settings=settings)
        samples[name] = groups
        print(f"{name}: sampled {len(groups)} groups in {time.perf_counter() - started:.0f} s; e.g. "
              f"{groups[0].task.ref.dataset}: {groups[0].texts[0][:160]!r}", flush=True)
    print("\n| reader | author | log-prob a token | spelled | reward | groups with signal | tokens a completion |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for reader, (_, policy, source) in nodes.items():
        tok, pad = policy.tokenizer, policy.tokenizer.pad_token_id
        for author, groups in samples.items():
            total, tokens, spelled, seen, lengths = 0.0, 0, 0, 0, []
            for sg in groups:
                prompt = encode_prompt(policy, source.format_prompt(source.task(sg.task.ref), tok))
                ids = []
                for text in sg.texts:
                    seen += 1
                    enc = list(tok(text, add_special_tokens=False)["input_ids"])
                    if not enc or tok.decode(enc, skip_special_tokens=False) != text:
                        continue  # text this tokenizer cannot spell: ingestion rejects it
                    spelled += 1
                    ids.append(enc)
                if not ids:
                    continue
                comp, mask = right_pad(ids, pad, torch.long)
                with torch.no_grad():
                    lps = shared_prompt_logprobs(policy.model, [prompt] * len(ids), comp, mask, pad_id=pad)
                total += float(lps[mask.bool()].sum())
                tokens += int(mask.sum())
                lengths += [len(i) for i in ids]
            rewards = [r for sg in groups for r in sg.group.rewards]
            signal = sum(len(set(sg.group.rewards)) > 1 for sg in groups)
            print(f"| {reader} | {author} | {total / max(tokens, 1):.2f} | {spelled}/{seen} | "
                  f"{sum(rewards) / len(rewards):.3f} | {signal}/{len(groups)} | "
                  f"{sum(lengths) / max(len(lengths), 1):.1f} |", flush=True)
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
