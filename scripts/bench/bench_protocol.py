"""Benchmark the protocol codec on one core: encode+sign and decode+verify throughput, and size vs JSON.

Usage: python scripts/bench/bench_protocol.py [--groups 8] [--completions 8] [--tokens 40] [--seconds 2]

Rollouts are shaped like real traffic: an arithmetic prompt, a ~40-token completion, uint32-range
token ids and float log-probs. Goals (issue 3): >= 2,000 rollouts/s decode+verify on one core, and
encoded bytes at most half of plain JSON of the same records.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import time
from collections.abc import Callable
from typing import Any

from protocol import (
    Identity,
    RolloutBatch,
    decode_batch,
    encode_batch,
)
from protocol.samples import realistic_batch


def to_json(batch: RolloutBatch) -> bytes:
    """Plain JSON of the same records: every field, compact separators, bytes as hex."""

    def default(obj: Any) -> Any:
        if isinstance(obj, bytes):
            return obj.hex()
        raise TypeError(type(obj).__name__)

    return json.dumps(dataclasses.asdict(batch), separators=(",", ":"), default=default).encode()


def rate(fn: Callable[[], object], seconds: float) -> float:
    """Calls per second of ``fn`` over about ``seconds`` (after one warm-up call)."""
    fn()
    calls, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        fn()
        calls += 1
    return calls / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--completions", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=40)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()

    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core
    identity = Identity.generate()
    batch = realistic_batch(identity.public_key, args.groups, args.completions, args.tokens, seed=0)
    n = batch.n_rollouts
    data = encode_batch(batch, identity)
    if decode_batch(data) != batch:
        raise SystemExit("round trip failed")
    plain = to_json(batch)

    enc = rate(lambda: encode_batch(batch, identity), args.seconds)
    dec = rate(lambda: decode_batch(data), args.seconds)

    print(f"python {platform.python_version()} on {platform.machine()}, pinned to one core")
    print(
        f"batch: {args.groups} groups x {args.completions} completions x {args.tokens} tokens = {n} rollouts"
    )
    print(f"encode+sign   : {enc:9.1f} batches/s  {enc * n:10.0f} rollouts/s")
    print(f"decode+verify : {dec:9.1f} batches/s  {dec * n:10.0f} rollouts/s   (goal >= 2000 rollouts/s)")
    print(f"encoded size  : {len(data):8d} bytes  {len(data) / n:8.1f} bytes/rollout")
    print(f"plain JSON    : {len(plain):8d} bytes  {len(plain) / n:8.1f} bytes/rollout")
    print(f"size ratio    : {len(data) / len(plain):.3f} of JSON   (goal <= 0.5)")


if __name__ == "__main__":
    main()
