"""What the hostile-peer bounds save, measured side by side: bounded stage against the same stage unbounded.

    python scripts/bench/bench_hostile.py            # all four, about a minute on 2 idle cores
    python scripts/bench/bench_hostile.py --only cpu

* ``cpu``: ingesting an honest batch plus an attacker's batch naming 40 distinct task seeds (each a new
  10,000-problem arith table), with the default caps (2 seeds per peer and epoch, 16 groups per peer and
  step) and with the caps lifted.
* ``verifier``: reasoning-gym's propositional_logic scorer on a nested-negation answer, in process and in
  the scoring child with a 2 s limit.
* ``bombs``: four signed batches of ~4 KB that expand to 30 MiB each: decoding them (what an unbounded node
  did) against the size check that refuses them before decoding; RSS growth, in fresh processes.
* ``anchors``: our own log-probs of 8 re-tokenized 100-token completions over a 100k-entry output layer:
  peak RSS with ``ingest.anchor_memory_mb=256`` against all rows at once.

Prints one line per measurement and the ratio; run it on an idle machine (its load average is printed).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_MIB = 1024 * 1024


def _rss_mib() -> float:
    import psutil

    return psutil.Process().memory_info().rss / _MIB


def _peak_during(fn) -> tuple[float, float]:
    """``(seconds, peak RSS growth in MiB)`` of ``fn()``, RSS sampled every 5 ms."""
    stop, peak = threading.Event(), [0.0]
    base = _rss_mib()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], _rss_mib())
            time.sleep(0.005)

    thread = threading.Thread(target=sample)
    thread.start()
    started = time.perf_counter()
    try:
        fn()
    finally:
        elapsed = time.perf_counter() - started
        stop.set()
        thread.join()
    return elapsed, max(0.0, peak[0] - base)


def bench_cpu() -> None:
    from node.config import AdapterConfig, ModelConfig
    from node.exchange.ingest import IngestLimits, Ingestor
    from node.policy.model import build_policy
    from node.tasks import build_task_source
    from protocol.identity import Identity
    from protocol.records import Rollout, RolloutBatch, RolloutGroup, SamplingParams

    policy = build_policy(ModelConfig(device="cpu"), AdapterConfig(), seed=0)
    tok = policy.tokenizer

    def rollout(ref, text):
        ids = [*tok(text, add_special_tokens=False)["input_ids"], tok.eos_token_id]
        return Rollout(ref, "", text, tuple(ids), policy.tokenizer_fingerprint, (-0.5,) * len(ids),
                       SamplingParams(1.0, 1.0), "peer", 0, "eos")

    def batches(source):
        honest, mallory = Identity.generate(), Identity.generate()
        good = [RolloutGroup(r, (rollout(r, str(source.task(r).answer)), rollout(r, "000")))
                for r in (source.make_ref("add", 2 * i, seed=1) for i in range(2))]
        bad = [RolloutGroup(r, (rollout(r, "000"), rollout(r, "001")))
               for r in (source.make_ref("add", 2, seed=1000 + s) for s in range(40))]
        return [RolloutBatch("s", honest.public_key, (), 0, 0, 0.0, tuple(good)),
                RolloutBatch("s", mallory.public_key, (), 0, 1, 0.0, tuple(bad))]

    results = {}
    for name, limits in (("capped", IngestLimits()),
                         ("uncapped", IngestLimits(max_groups_per_peer=10_000, max_seeds_per_peer_epoch=10_000,
                                                   max_seconds=1e9, max_seconds_per_peer=1e9))):
        source = build_task_source("arith", ["add"], None, 0)
        ingestor = Ingestor(policy, source, temperature=1.0, max_completion_tokens=8, limits=limits)
        started = time.perf_counter()
        ingestor.ingest_batches(batches(source), max_groups=64)
        results[name] = time.perf_counter() - started
        print(f"cpu: ingest of an honest batch + 40 seeds, {name}: {results[name]:.3f} s "
              f"({source._orders.misses} tables built)")  # type: ignore[attr-defined]
    print(f"cpu: uncapped / capped = {results['uncapped'] / results['capped']:.1f}x")


def bench_verifier() -> None:
    from node.exchange.scoring import ScoringWorker, SourceSpec

    spec = SourceSpec("reasoning_gym", ("propositional_logic",), None, 0, {})
    source = spec.build()
    ref = source.sample(1, random.Random(0))[0]
    variable = source.task(ref).metadata["variables"][0]
    slow = f"<answer>{'¬' * 950}{variable}</answer>"
    started = time.perf_counter()
    source.score(source.task(ref), slow)
    in_process = time.perf_counter() - started
    worker = ScoringWorker(spec, timeout=2.0)
    try:
        worker.score([(ref, "x")])  # started and warm
        started = time.perf_counter()
        (outcome,) = worker.score([(ref, slow)])
        isolated = time.perf_counter() - started
    finally:
        worker.close()
    print(f"verifier: nested negations in process {in_process:.2f} s; in the child: {outcome.status} after "
          f"{isolated:.2f} s; ratio {in_process / isolated:.1f}x")


_BOMB_CHILD = """
import gc, json, sys, time
import psutil
from protocol.identity import Identity
from protocol.codec import batch_payload_size, decode_batch
from swarm.core import decoded_cost
from protocol.samples import expanding_batch
author = Identity.generate()
bombs = [expanding_batch(author, 30 * 2**20, seq=s) for s in range(4)]
gc.collect()
base = psutil.Process().memory_info().rss
kept = []
for data in bombs:
    if sys.argv[2] == "decode":
        kept.append(decode_batch(data))
    else:
        payload = batch_payload_size(data)
        assert payload > 4 * 2**20 and decoded_cost(payload) > 4 * 2**20  # refused before decoding
print(json.dumps({"growth": (psutil.Process().memory_info().rss - base) / 2**20, "bytes": sum(map(len, bombs))}))
"""


def bench_bombs() -> None:
    out = {}
    for mode in ("decode", "refuse"):
        proc = subprocess.run([sys.executable, "-c", _BOMB_CHILD, str(ROOT), mode], capture_output=True, text=True,
                              check=True)
        out[mode] = json.loads(proc.stdout)
        print(f"bombs: 4 batches of {out[mode]['bytes'] // 4} bytes each, {mode}: RSS +{out[mode]['growth']:.0f} MiB")
    print(f"bombs: decoded / refused RSS growth = {out['decode']['growth'] / max(out['refuse']['growth'], 1.0):.0f}x "
          "(refused: under 1 MiB counts as 1)")


def bench_anchors() -> None:
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from node.config import AdapterConfig, ModelConfig
    from node.exchange.ingest import IngestLimits, Ingestor
    from node.policy.model import build_policy
    from node.sources.embedded.tiny import tiny_base_path
    from node.tasks import build_task_source
    from protocol.identity import Identity
    from protocol.records import Rollout, RolloutBatch, RolloutGroup, SamplingParams

    folder = Path(tempfile.mkdtemp()) / "wide"
    shutil.copytree(tiny_base_path(), folder)
    cfg = AutoConfig.from_pretrained(folder)
    cfg.vocab_size = 100_000
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
    policy = build_policy(ModelConfig(name_or_path=str(folder), device="cpu"), AdapterConfig(), seed=0)
    policy.tokenizer.model_max_length = 4096  # the embedded model's 64 is a training length, not a limit
    source = build_task_source("arith", ["add"], None, 0)
    author = Identity.generate()
    refs = [source.make_ref("add", 2 * i, seed=5) for i in range(2)]
    text = "0" * 100
    ids = tuple(policy.tokenizer(text, add_special_tokens=False)["input_ids"])
    groups = tuple(RolloutGroup(r, tuple(Rollout(r, "", text, ids, "other tokenizer", (-1.0,) * len(ids),
                                                 SamplingParams(1.0, 1.0), "peer", 0, "length")
                                         for _ in range(4))) for r in refs)
    batch = RolloutBatch("s", author.public_key, (), 0, 0, 0.0, groups)
    out = {}
    for name, anchor_bytes in (("bounded (256 MiB)", 256 * _MIB), ("all rows at once", 1 << 62)):
        ingestor = Ingestor(policy, source, temperature=1.0, max_completion_tokens=8, max_peer_tokens=200,
                            limits=IngestLimits(anchor_bytes=anchor_bytes))
        seconds, growth = _peak_during(lambda ingestor=ingestor: ingestor.ingest_batches([batch], 64))
        out[name] = growth
        print(f"anchors: 8 rows x ~110 positions x 100k vocab, {name}: {seconds:.2f} s, peak RSS +{growth:.0f} MiB")
    print(f"anchors: all at once / bounded peak = {out['all rows at once'] / max(out['bounded (256 MiB)'], 1.0):.1f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=["cpu", "verifier", "bombs", "anchors"])
    args = parser.parse_args()
    import torch

    torch.set_num_threads(2)
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}, "
          f"{os.cpu_count()} cores")
    for name, fn in (("cpu", bench_cpu), ("verifier", bench_verifier), ("bombs", bench_bombs),
                     ("anchors", bench_anchors)):
        if args.only in (None, name):
            fn()


if __name__ == "__main__":
    main()
