from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import msgpack
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import (
    DEFAULT_LIMITS,
    SCHEMA_VERSION,
    BadSignatureError,
    Identity,
    IdentityError,
    Limits,
    MalformedError,
    Manifest,
    ProtocolError,
    Rollout,
    RolloutBatch,
    RolloutGroup,
    SamplingParams,
    TaskRef,
    TooLargeError,
    UnsupportedVersionError,
    batch_id,
    decode_batch,
    decode_manifest,
    encode_batch,
    encode_manifest,
    make_manifest,
    verify_signature,
)
from protocol._wire import KIND_BATCH, KIND_MANIFEST, seal
from protocol.samples import realistic_batch
from tests.protocol.strategies import batches

SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def tiny_batch(author: bytes) -> RolloutBatch:
    task = TaskRef("arith", "add", "h", 1, 2)
    rollout = Rollout(
        task=task,
        prompt="p",
        completion="c",
        completion_ids=(5,),
        tokenizer_fingerprint="tok",
        behavior_logprobs=(-0.5,),
        sampling=SamplingParams(1.0, 0.5),
        model_fingerprint="m",
        policy_step=7,
        finish_reason="eos",
        routing=(1, 258),
    )
    return RolloutBatch("s", author, ("addr",), 3, 4, 1.5, (RolloutGroup(task, (rollout,)),))


def signed_payload(identity: Identity, tree: Any, *, version: int | None = None) -> bytes:
    """Sign an arbitrary msgpack tree as a batch, the way a malicious but keyed peer could."""
    data = seal(KIND_BATCH, identity, zstandard.ZstdCompressor(level=3).compress(msgpack.packb(tree)))
    if version is not None:  # re-sign with another version in the header
        prefix = data[:4] + version.to_bytes(2, "big") + identity.public_key
        data = prefix + identity.sign(prefix + data[102:]) + data[102:]
    return data


# --- wire format, by hand ------------------------------------------------------------------------------


def test_wire_layout_by_hand(identity: Identity) -> None:
    data = encode_batch(tiny_batch(identity.public_key), identity)
    assert data[:3] == b"SWN" and data[3:4] == b"B"
    assert data[4:6] == b"\x00\x01" and SCHEMA_VERSION == 1
    assert data[6:38] == identity.public_key
    assert verify_signature(identity.public_key, data[:38] + data[102:], data[38:102])
    frame = data[102:]
    assert zstandard.get_frame_parameters(frame).content_size > 0
    tree = msgpack.unpackb(zstandard.ZstdDecompressor().decompress(frame))
    rollout = [
        "p",
        "c",
        b"\x05\x00\x00\x00",
        "tok",
        b"\x00\x00\x00\xbf",
        1.0,
        0.5,
        "m",
        7,
        "eos",
        None,
        b"\x01\x00\x02\x01",
    ]
    assert tree == ["s", ["addr"], 3, 4, 1.5, [["arith", "add", "h", 1, 2, [rollout]]]]
    assert batch_id(data) == hashlib.sha256(data).hexdigest()


def test_encoding_is_deterministic(identity: Identity) -> None:
    a = encode_batch(realistic_batch(identity.public_key, seed=3), identity)
    b = encode_batch(realistic_batch(identity.public_key, seed=3), identity)
    assert a == b and batch_id(a) == batch_id(b)
    assert batch_id(encode_batch(realistic_batch(identity.public_key, seed=4), identity)) != batch_id(a)


def test_realistic_roundtrip(identity: Identity) -> None:
    batch = realistic_batch(identity.public_key)
    data = encode_batch(batch, identity)
    decoded = decode_batch(data)
    assert decoded == batch
    assert decoded.n_rollouts == 64
    assert encode_batch(decoded, identity) == data


@SETTINGS
@given(data=st.data())
def test_batch_roundtrip(identity: Identity, data: st.DataObject) -> None:
    batch = data.draw(batches(identity.public_key))
    encoded = encode_batch(batch, identity)
    assert decode_batch(encoded) == batch
    assert decode_batch(bytearray(encoded)) == batch  # type: ignore[arg-type]  # bytes-like accepted
    assert encode_batch(decode_batch(encoded), identity) == encoded


@SETTINGS
@given(
    swarm_id=st.text(min_size=1, max_size=40),
    address=st.lists(st.text(min_size=1, max_size=80), max_size=4),
    counters=st.tuples(*[st.integers(0, 2**63 - 1)] * 5),
    created_at=st.floats(allow_nan=False, allow_infinity=False, min_value=-1e12, max_value=1e12),
    ttl=st.floats(min_value=0, max_value=1e6),
    digest=st.binary(min_size=32, max_size=32),
)
def test_manifest_roundtrip(
    identity: Identity,
    swarm_id: str,
    address: list[str],
    counters: tuple[int, ...],
    created_at: float,
    ttl: float,
    digest: bytes,
) -> None:
    epoch, seq, size, n_groups, n_rollouts = counters
    m = Manifest(
        swarm_id,
        digest.hex(),
        identity.public_key,
        tuple(address),
        epoch,
        seq,
        size,
        n_groups,
        n_rollouts,
        created_at,
        created_at + ttl,
    )
    data = encode_manifest(m, identity)
    assert len(data) <= 8192
    assert decode_manifest(data) == m
    assert encode_manifest(m, identity) == data


def test_make_manifest_points_at_batch(identity: Identity) -> None:
    batch = realistic_batch(identity.public_key)
    data = encode_batch(batch, identity)
    m = make_manifest(batch, data, expires_at=batch.created_at + 60)
    assert (m.batch_id, m.byte_size, m.n_groups, m.n_rollouts) == (batch_id(data), len(data), 8, 64)
    assert (m.epoch, m.seq, m.author, m.address) == (4242, 17, identity.public_key, batch.address)
    assert len(encode_manifest(m, identity)) < 400


# --- signatures and authorship --------------------------------------------------------------------------


def test_every_flipped_byte_is_rejected(identity: Identity) -> None:
    data = encode_batch(tiny_batch(identity.public_key), identity)
    for i in range(len(data)):
        for mask in (0x01, 0x80, 0xFF):
            bad = bytearray(data)
            bad[i] ^= mask
            with pytest.raises(ProtocolError) as info:
                decode_batch(bytes(bad))
            # Which check fires is fixed by the layout: magic/kind, version, then the signature.
            expected = MalformedError if i < 4 else UnsupportedVersionError if i < 6 else BadSignatureError
            assert type(info.value) is expected, (i, mask, info.value)


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 10), position=st.floats(0, 1, exclude_max=True), mask=st.integers(1, 255))
def test_flipped_byte_of_realistic_batch_is_rejected(seed: int, position: float, mask: int) -> None:
    ident = _realistic_signer()
    data = _realistic_encoded(seed)
    bad = bytearray(data)
    bad[int(position * len(data))] ^= mask
    with pytest.raises(ProtocolError):
        decode_batch(bytes(bad))
    assert decode_batch(data).author == ident.public_key


_SIGNER = Identity.generate()
_ENCODED: dict[int, bytes] = {}


def _realistic_signer() -> Identity:
    return _SIGNER


def _realistic_encoded(seed: int) -> bytes:
    if seed not in _ENCODED:
        _ENCODED[seed] = encode_batch(realistic_batch(_SIGNER.public_key, n_groups=2, seed=seed), _SIGNER)
    return _ENCODED[seed]


def test_swapped_author_is_rejected(identity: Identity, other_identity: Identity) -> None:
    data = encode_batch(tiny_batch(identity.public_key), identity)
    forged = data[:6] + other_identity.public_key + data[38:]
    with pytest.raises(BadSignatureError):
        decode_batch(forged)
    with pytest.raises(IdentityError):
        encode_batch(tiny_batch(identity.public_key), other_identity)


def test_manifest_and_batch_signatures_do_not_mix(identity: Identity) -> None:
    batch = tiny_batch(identity.public_key)
    data = encode_batch(batch, identity)
    mdata = encode_manifest(make_manifest(batch, data, 100.0), identity)
    with pytest.raises(MalformedError, match="kind"):
        decode_batch(mdata)
    with pytest.raises(MalformedError, match="kind"):
        decode_manifest(data[:4000])
    relabelled = mdata[:3] + b"B" + mdata[4:]
    with pytest.raises(BadSignatureError):
        decode_batch(relabelled)


def test_manifest_author_must_be_signer(identity: Identity, other_identity: Identity) -> None:
    m = make_manifest(tiny_batch(identity.public_key), b"x", 100.0)
    with pytest.raises(IdentityError):
        encode_manifest(m, other_identity)
    data = encode_manifest(m, identity)
    with pytest.raises(BadSignatureError):
        decode_manifest(data[:6] + other_identity.public_key + data[38:])


# --- versions and canonical form ----------------------------------------------------------------------


@pytest.mark.parametrize("version", [0, 2, 255, 65535])
def test_unknown_schema_version_is_rejected(identity: Identity, version: int) -> None:
    good = encode_batch(tiny_batch(identity.public_key), identity)
    tree = msgpack.unpackb(zstandard.ZstdDecompressor().decompress(good[102:]))
    assert decode_batch(signed_payload(identity, tree)) == tiny_batch(identity.public_key)
    with pytest.raises(UnsupportedVersionError, match=f"version {version}"):
        decode_batch(signed_payload(identity, tree, version=version))
    m = encode_manifest(make_manifest(tiny_batch(identity.public_key), good, 10.0), identity)
    prefix = m[:4] + version.to_bytes(2, "big") + identity.public_key
    with pytest.raises(UnsupportedVersionError):
        decode_manifest(prefix + identity.sign(prefix + m[102:]) + m[102:])


def _tiny_tree() -> list[Any]:
    rollout = ["p", "c", b"\x05\x00\x00\x00", "tok", b"\x00\x00\x00\xbf", 1.0, 0.5, "m", 7, "eos", None, b""]
    return ["s", ["addr"], 3, 4, 1.5, [["arith", "add", "h", 1, 2, [rollout]]]]


def _mutated(path: tuple[int, ...], value: Any) -> list[Any]:
    tree = _tiny_tree()
    node = tree
    for i in path[:-1]:
        node = node[i]
    node[path[-1]] = value
    return tree


@pytest.mark.parametrize(
    "tree",
    [
        _mutated((4,), 2),  # created_at as int
        _mutated((2,), True),  # epoch as bool
        _mutated((2,), -1),  # negative epoch
        _mutated((0,), b"s"),  # swarm id as bytes
        _mutated((5, 0, 5, 0, 2), b"\x05\x00\x00"),  # ids not a multiple of 4 bytes
        _mutated((5, 0, 5, 0, 4), b""),  # one id, no log-prob
        _mutated((5, 0, 5, 0, 4), b"\x00\x00\xc0\x7f"),  # NaN log-prob
        _mutated((5, 0, 5, 0, 9), "stop"),  # unknown finish reason
        _mutated((5, 0, 5, 0), ["too", "short"]),
        _mutated((5, 0, 5), []),  # empty group
        _mutated((5, 0), {"a": 1}),
        _mutated((1,), "addr"),
        _tiny_tree()[:5],
        _tiny_tree() + [1],
        [],
        None,
    ],
)
def test_signed_but_invalid_payload_is_malformed(identity: Identity, tree: Any) -> None:
    with pytest.raises(MalformedError):
        decode_batch(signed_payload(identity, tree))


@pytest.mark.parametrize("depth", [10, 2000, 100_000])
def test_deeply_nested_payload_is_malformed(identity: Identity, depth: int) -> None:
    raw = b"\x91" * depth + b"\xc0"  # [[[...[nil]...]]]
    with pytest.raises(MalformedError):
        decode_batch(seal(KIND_BATCH, identity, zstandard.ZstdCompressor().compress(raw)))
    with pytest.raises(ProtocolError):
        decode_manifest(seal(KIND_MANIFEST, identity, raw))


def test_non_canonical_payloads_are_rejected(identity: Identity) -> None:
    tree = _tiny_tree()
    assert decode_batch(signed_payload(identity, tree)).seq == 4
    single = msgpack.packb(tree, use_single_float=True)  # floats as float32
    for raw in (single, msgpack.packb(tree) + b"\xc0", b"\xdc\x00\x06" + msgpack.packb(tree)[1:]):
        data = seal(KIND_BATCH, identity, zstandard.ZstdCompressor().compress(raw))
        with pytest.raises(MalformedError):
            decode_batch(data)


def test_frame_must_be_single_with_declared_size(identity: Identity) -> None:
    raw = msgpack.packb(_tiny_tree())
    frame = zstandard.ZstdCompressor().compress(raw)
    cobj = zstandard.ZstdCompressor().compressobj()
    unsized = cobj.compress(raw) + cobj.flush()
    assert zstandard.get_frame_parameters(unsized).content_size == zstandard.CONTENTSIZE_UNKNOWN
    for payload, match in (
        (frame + b"\x00", "exactly one"),
        (frame + frame, "exactly one"),
        (frame[:-1], "zstd"),
        (unsized, "declare its content size"),
        (raw, "not a zstd frame"),
        (b"", "not a zstd frame"),
    ):
        with pytest.raises(MalformedError, match=match):
            decode_batch(seal(KIND_BATCH, identity, payload))


# --- limits ---------------------------------------------------------------------------------------------


def test_default_limits() -> None:
    assert DEFAULT_LIMITS.max_compressed_bytes == 4 * 2**20
    assert DEFAULT_LIMITS.max_decompressed_bytes == 32 * 2**20
    assert (DEFAULT_LIMITS.max_groups_per_batch, DEFAULT_LIMITS.max_completions_per_group) == (256, 64)
    assert (DEFAULT_LIMITS.max_text_chars, DEFAULT_LIMITS.max_tokens) == (16384, 4096)
    assert DEFAULT_LIMITS.max_manifest_bytes == 8192
    with pytest.raises(MalformedError):
        Limits(max_tokens=0)


@pytest.mark.parametrize(
    "limit,value,match",
    [
        ("max_groups_per_batch", 7, "groups per batch"),
        ("max_completions_per_group", 7, "completions per group"),
        ("max_text_chars", 100, "completion has"),
        ("max_tokens", 39, "completion tokens"),
        ("max_name_chars", 25, "model_fingerprint"),
        ("max_addresses", 1, "addresses"),
        ("max_address_chars", 10, "address"),
        ("max_compressed_bytes", 5000, "signed record"),
        ("max_decompressed_bytes", 20000, "expands to"),
    ],
)
def test_limits_are_enforced(identity: Identity, limit: str, value: int, match: str | None) -> None:
    batch = realistic_batch(identity.public_key)  # 8 x 8 rollouts, 40 tokens, ~200-char completions
    data = encode_batch(batch, identity)
    limits = dataclasses.replace(DEFAULT_LIMITS, **{limit: value})
    if limit == "max_addresses":  # the realistic batch has one address; give it two
        batch = dataclasses.replace(batch, address=("/a", "/b"))
        data = encode_batch(batch, identity)
    with pytest.raises(TooLargeError, match=match):
        decode_batch(data, limits)
    with pytest.raises(TooLargeError):
        encode_batch(batch, identity, limits)
    assert decode_batch(data) == batch  # within the defaults


def test_msgpack_level_bounds_are_too_large(identity: Identity) -> None:
    tree = _tiny_tree()
    tree[5] = [tree[5][0]] * 300  # more groups than max_array_len allows at the msgpack level
    with pytest.raises(TooLargeError):
        decode_batch(signed_payload(identity, tree))
    tree = _tiny_tree()
    tree[5][0][5][0][0] = "x" * (4 * 16384 + 1)  # a string longer than any limit, in bytes
    with pytest.raises(TooLargeError):
        decode_batch(signed_payload(identity, tree))


def test_manifest_size_limit(identity: Identity) -> None:
    wide = dataclasses.replace(DEFAULT_LIMITS, max_addresses=100)
    address = tuple(f"/ip4/10.0.0.{i}/tcp/4000/p2p/" + "Q" * 100 for i in range(80))
    m = Manifest("s", "00" * 32, identity.public_key, address, 1, 1, 1, 1, 1, 1.0, 2.0)
    with pytest.raises(TooLargeError, match="manifest is"):
        encode_manifest(m, identity)
    big = encode_manifest(m, identity, dataclasses.replace(wide, max_manifest_bytes=20000))
    assert len(big) > 8192
    with pytest.raises(TooLargeError):
        decode_manifest(big, wide)
    assert decode_manifest(big, dataclasses.replace(wide, max_manifest_bytes=20000)) == m
    small = dataclasses.replace(m, address=address[:5])
    assert decode_manifest(encode_manifest(small, identity)) == small


@pytest.mark.parametrize("data", [b"", b"SWN", None, "SWNB", 12, b"\x00" * 200])
def test_garbage_raises_protocol_error(data: Any) -> None:
    with pytest.raises(ProtocolError):
        decode_batch(data)
    with pytest.raises(ProtocolError):
        decode_manifest(data)


def test_manifest_payload_fields(identity: Identity) -> None:
    m = make_manifest(tiny_batch(identity.public_key), b"abc", 100.0)
    data = encode_manifest(m, identity)
    digest = hashlib.sha256(b"abc").digest()
    assert msgpack.unpackb(data[102:]) == ["s", digest, ["addr"], 3, 4, 3, 1, 1, 1.5, 100.0]
    assert data[3:4] == KIND_MANIFEST
