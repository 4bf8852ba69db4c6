"""What reading a step's rows with the frozen base in one pass saves against two, or in bfloat16 against the
policy's own dtype (the screen's reads).

Usage: python scripts/bench/bench_base_reads.py [--config configs/smollm2-silo.yaml] [--repeats 8] [--threads 1]
                                                [--own-groups 2] [--own-rows 2] [--peer-groups 2] [--peer-rows 4]
                                                [--compare passes|bfloat16] [key=value ...]

A screened step has the frozen base read twice: a few of the node's own completions for the profile
(``ScreenBook.observe_own``, ``ingest.screen_profile_rows`` of them) and the peer completions the loss will push
up (``ScreenBook.read_base``). Both are ``ScreenBook.base_logprobs`` calls, each its own forward passes with the
adapters switched off. This reads the same rows both ways, alternating, on the config's model and its tasks'
real prompts (``--own-rows`` completions of each of ``--own-groups`` tasks, as the node picks its profile rows
from its groups in turn, and ``--peer-rows`` completions of each of ``--peer-groups`` other tasks), each
completion of half of ``generation.max_new_tokens`` to all of it in arbitrary tokens (a forward pass's cost does
not depend on which tokens it reads), with the prompts' shared prefix kept as the node keeps it. Printed: each repeat's seconds both ways, the medians and their ratio, and the largest
difference between the two ways' log-probs (the same reads up to float rounding).

With ``--compare bfloat16`` the two ways are both one pass: in the policy's dtype, and under bfloat16 autocast
(``ingest.screen_read_dtype=bfloat16``, each way with its own kept prefix); printed as well, the mean difference
between the two ways' log-probs of a token.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/smollm2-silo.yaml")
    p.add_argument("--repeats", type=int, default=8, help="pairs of reads timed (after one warm-up read)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--own-groups", type=int, default=2, help="own groups the profile's rows come from")
    p.add_argument("--own-rows", type=int, default=2, help="completions of each own group read for the profile")
    p.add_argument("--peer-groups", type=int, default=2, help="peer groups the step trains on")
    p.add_argument("--peer-rows", type=int, default=4, help="completions of each peer group the loss pushes up")
    p.add_argument("--compare", choices=("passes", "bfloat16"), default="passes",
                   help="two passes against one (default), or one pass in the policy's dtype against bfloat16")
    p.add_argument("overrides", nargs="*", metavar="key=value")
    args = p.parse_args()
    for name in ("repeats", "threads", "own_groups", "own_rows", "peer_groups", "peer_rows"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging

    from node.config import load_config
    from node.exchange.screening import ScreenBook
    from node.generation.rollouts import encode_prompt
    from node.run.node import Node
    from node.run.setup import screen_settings

    hf_logging.disable_progress_bar()
    with tempfile.TemporaryDirectory(prefix="bench_base_reads_") as work:
        cfg = load_config(ROOT / args.config, [f"run_dir={work}/node", *args.overrides])
        node = Node(cfg, show_progress=False)
        node.setup()
        policy, source = node.policy, node.source
        def new_book(**changed: object) -> ScreenBook:
            return ScreenBook(policy, dataclasses.replace(screen_settings(cfg.ingest), **changed),
                              temperature=cfg.generation.temperature, anchor_bytes=cfg.ingest.anchor_memory_mb * 2**20,
                              micro_batch_size=cfg.train.micro_batch_rows(policy.device.type), max_authors=8)

        # passes: the config's own reads both ways; bfloat16: the policy's dtype against bfloat16 autocast
        if args.compare == "bfloat16":
            book, other = new_book(read_dtype="model"), new_book(read_dtype="bfloat16")
        else:
            book = other = new_book()
        if not book.base_reads:
            p.error(f"{args.config}: the screen reads with the base only for a LoRA policy with "
                    "ingest.screen_reference=base or both")
        rng = random.Random(0)
        vocab, longest = len(policy.tokenizer), cfg.generation.max_new_tokens

        def rows(tasks: int, per: int) -> list[tuple[list[int], list[int]]]:
            out = []
            for ref in source.sample(tasks, rng):
                prompt = encode_prompt(policy, source.format_prompt(source.task(ref), policy.tokenizer))
                out += [(prompt, [rng.randrange(vocab) for _ in range(rng.randint(max(1, longest // 2), longest))]) for _ in range(per)]
            return out

        load = [os.getloadavg()[0]]
        warm = rows(1, 1)
        book.base_logprobs(warm)  # warm-up, and the prompts' prefix kept
        if other is not book:
            other.base_logprobs(warm)
        names = ("two passes", "one pass") if args.compare == "passes" else ("model dtype", "bfloat16")
        first, second, gaps = [], [], []
        for repeat in range(args.repeats):
            own, peer = rows(args.own_groups, args.own_rows), rows(args.peer_groups, args.peer_rows)
            start = time.perf_counter()
            if args.compare == "passes":
                a = book.base_logprobs(own) + book.base_logprobs(peer)
            else:
                a = book.base_logprobs(own + peer)
            middle = time.perf_counter()
            b = other.base_logprobs(own + peer)
            end = time.perf_counter()
            first.append(middle - start)
            second.append(end - middle)
            gaps += [0.0 if x == y else abs(x - y) for u, v in zip(a, b, strict=True) for x, y in zip(u, v, strict=True)]
            print(f"repeat {repeat}: {names[0]} {first[-1]:.3f} s, {names[1]} {second[-1]:.3f} s", flush=True)
        load.append(os.getloadavg()[0])
    print(f"rows a repeat: {args.own_groups * args.own_rows} own, {args.peer_groups * args.peer_rows} peer; "
          f"prefix kept: {book.prefix is not None and not book.prefix.off}; load {load[0]:.1f} -> {load[1]:.1f}")
    print(f"median {names[0]}: {statistics.median(first):.3f} s")
    print(f"median {names[1]}: {statistics.median(second):.3f} s")
    print(f"{names[1]} / {names[0]}: {statistics.median(second) / statistics.median(first):.3f}")
    print(f"largest log-prob difference between the two: {max(gaps):.2e}; mean {statistics.fmean(gaps):.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
