"""Fuzzing the decoders: random and mutated inputs yield a valid record or a ``ProtocolError``, nothing else.

Mutating signed bytes only exercises the envelope (the signature fails first), so most cases mutate the
payload *before* signing, as a peer with its own key could, to reach the zstd, msgpack and record checks.
"""

from __future__ import annotations

import collections
import logging
import random
from collections.abc import Callable
from typing import Any

import msgpack
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import (
    Identity,
    ProtocolError,
    decode_batch,
    decode_manifest,
    encode_batch,
    encode_manifest,
    make_manifest,
)
from protocol._wire import KIND_BATCH, KIND_MANIFEST, seal
from protocol.samples import realistic_batch

SIGNER = Identity.generate()
BATCH = realistic_batch(SIGNER.public_key, n_groups=2, n_completions=3, n_tokens=12, seed=1)
SIGNED_BATCH = encode_batch(BATCH, SIGNER)
RAW_BATCH = zstandard.ZstdDecompressor().decompress(SIGNED_BATCH[102:])
SIGNED_MANIFEST = encode_manifest(make_manifest(BATCH, SIGNED_BATCH, 2e9), SIGNER)
RAW_MANIFEST = SIGNED_MANIFEST[102:]
COMPRESSOR = zstandard.ZstdCompressor(level=3)


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    """One to three random byte-level edits: flip, overwrite, insert, delete, truncate, duplicate."""
    buf = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(6)
        i = rng.randrange(len(buf) + 1)
        if op == 0 and buf:
            buf[i % len(buf)] ^= 1 << rng.randrange(8)
        elif op == 1 and buf:
            buf[i % len(buf)] = rng.randrange(256)
        elif op == 2:
            buf[i:i] = rng.randbytes(rng.randint(1, 8))
        elif op == 3:
            del buf[i : i + rng.randint(1, 16)]
        elif op == 4:
            del buf[i:]
        else:
            j = rng.randrange(len(buf) + 1)
            buf[i:i] = buf[min(i, j) : max(i, j)][:64]
    return bytes(buf)


def random_value(rng: random.Random, depth: int = 0) -> Any:
    """A random msgpack-able value of the kinds a hostile payload could hold."""
    kind = rng.randrange(10 if depth < 2 else 8)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.choice(
            [0, -1, 1, 2**31, 2**32, 2**63 - 1, -(2**63), 2**64 - 1, rng.randrange(-1000, 1000)]
        )
    if kind == 3:
        return rng.choice([0.0, -0.5, 1.5, float("nan"), float("inf"), -float("inf"), 1e308, rng.random()])
    if kind == 4:
        return rng.choice(["", "eos", "length", "x" * rng.randrange(40), "\u00e9\u4e2d"])
    if kind == 5:
        return rng.randbytes(rng.choice([0, 1, 2, 3, 4, 8, 32, 33]))
    if kind in (6, 7):
        return rng.choice([[], {}, "s"])
    if kind == 8:
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(13))]
    return {str(rng.randrange(5)): random_value(rng, depth + 1)}


def mutate_tree(tree: Any, rng: random.Random) -> Any:
    """Replace, drop or append one node somewhere in a msgpack tree of lists."""
    node = tree
    while isinstance(node, list) and node and rng.random() < 0.75:
        child = node[rng.randrange(len(node))]
        if not isinstance(child, list):
            break
        node = child
    if not isinstance(node, list) or not node:
        return random_value(rng)
    op = rng.randrange(3)
    i = rng.randrange(len(node))
    if op == 0:
        node[i] = random_value(rng)
    elif op == 1:
        del node[i]
    else:
        node.append(random_value(rng))
    return tree


def _sign_raw(kind: bytes, raw: bytes) -> bytes:
    return seal(kind, SIGNER, COMPRESSOR.compress(raw) if kind == KIND_BATCH else raw)


def _case(rng: random.Random) -> tuple[str, bytes, Callable[[bytes], Any]]:
    """One fuzz input: (mode, bytes, decoder)."""
    mode = rng.choice(
        ["random", "mutated_signed", "mutated_raw", "mutated_tree", "manifest_raw", "manifest_tree"]
    )
    if mode == "random":
        prefix = rng.choice([b"", b"SWNB\x00\x01", b"SWNM\x00\x01" + SIGNER.public_key])
        data = prefix + rng.randbytes(rng.randrange(300))
        return mode, data, rng.choice([decode_batch, decode_manifest])
    if mode == "mutated_signed":
        source = rng.choice([SIGNED_BATCH, SIGNED_MANIFEST])
        return mode, mutate_bytes(source, rng), decode_batch if source is SIGNED_BATCH else decode_manifest
    if mode == "mutated_raw":
        return mode, _sign_raw(KIND_BATCH, mutate_bytes(RAW_BATCH, rng)), decode_batch
    if mode == "manifest_raw":
        return mode, _sign_raw(KIND_MANIFEST, mutate_bytes(RAW_MANIFEST, rng)), decode_manifest
    raw = RAW_BATCH if mode == "mutated_tree" else RAW_MANIFEST
    tree = mutate_tree(msgpack.unpackb(raw), rng)
    kind = KIND_BATCH if mode == "mutated_tree" else KIND_MANIFEST
    return mode, _sign_raw(kind, msgpack.packb(tree)), decode_batch if kind == KIND_BATCH else decode_manifest


def run_fuzz(n: int, seed: int) -> collections.Counter[str]:
    """Decode ``n`` fuzz inputs; return outcome counts. Fails on any exception but a ``ProtocolError``."""
    rng = random.Random(seed)
    outcomes: collections.Counter[str] = collections.Counter()
    for _ in range(n):
        mode, data, decode = _case(rng)
        try:
            record = decode(data)
        except ProtocolError as exc:
            outcomes[type(exc).__name__] += 1
            continue
        # Whatever is accepted is canonical: re-encoding gives the very same bytes.
        if decode is decode_batch:
            assert encode_batch(record, SIGNER, limits=None) == data, mode
        else:
            assert encode_manifest(record, SIGNER) == data, mode
        outcomes["accepted"] += 1
    return outcomes


def _no_safety_net(caplog: pytest.LogCaptureFixture) -> None:
    net = [r for r in caplog.records if r.name == "protocol.codec" and r.levelno >= logging.WARNING]
    assert not net, f"a decode reached the safety net: {net[0].getMessage()}"


def test_fuzz_small(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="protocol.codec")
    outcomes = run_fuzz(3000, seed=12345)
    _no_safety_net(caplog)
    # The fuzzer reaches every layer: envelope, zstd/msgpack, record checks, and valid records.
    for name in ("MalformedError", "BadSignatureError", "UnsupportedVersionError", "accepted"):
        assert outcomes[name] > 0, outcomes
    assert sum(outcomes.values()) == 3000


@pytest.mark.slow
def test_fuzz_100k(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="protocol.codec")
    outcomes = run_fuzz(100_000, seed=2024)
    _no_safety_net(caplog)
    assert sum(outcomes.values()) == 100_000
    assert outcomes["TooLargeError"] > 0, outcomes


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=400))
def test_arbitrary_bytes(data: bytes) -> None:
    for decode in (decode_batch, decode_manifest):
        with pytest.raises(ProtocolError):
            decode(data)
        with pytest.raises(ProtocolError):
            decode(b"SWNB\x00\x01" + data)
