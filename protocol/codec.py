"""Canonical, signed encodings of ``RolloutBatch`` and ``Manifest``, and their checked decoders.

A batch is msgpack arrays in a fixed field order (no maps), zstd-compressed, in a signed envelope (see
``protocol._wire``); a manifest is the same without zstd. Token ids travel as little-endian uint32 bytes,
behaviour log-probs as float32, ReMix routing as uint16. Encoding is deterministic, so the same record
and key always give the same bytes, and ``batch_id`` (SHA-256 of those bytes) is a content address.

Decoders accept untrusted bytes: they return a valid record or raise a ``ProtocolError`` subclass.
Every ``Limits`` bound is checked before the data it bounds is expanded or copied into records, and
the payload must be in canonical form (re-packing it gives the same bytes).
"""

from __future__ import annotations

import hashlib
import logging
import struct
from collections.abc import Callable
from typing import Any, TypeVar

import msgpack

from protocol._wire import (
    HEADER_BYTES,
    KIND_BATCH,
    KIND_MANIFEST,
    MAGIC,
    SCHEMA_VERSION,
    compress,
    declared_content_size,
    decompress_bounded,
    open_envelope,
    seal,
)
from protocol.errors import IdentityError, MalformedError, ProtocolError, TooLargeError
from protocol.identity import Identity
from protocol.limits import DEFAULT_LIMITS, Limits
from protocol.records import Manifest, Rollout, RolloutBatch, RolloutGroup, SamplingParams
from protocol.taskref import TaskRef

__all__ = [
    "SCHEMA_VERSION",
    "batch_id",
    "batch_payload_size",
    "check_batch_limits",
    "decode_batch",
    "decode_manifest",
    "encode_batch",
    "encode_manifest",
    "group_digest",
    "make_manifest",
]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")
_BATCH_FIELDS = 6  # swarm_id, address, epoch, seq, created_at, groups
_GROUP_FIELDS = 6  # source, dataset, config_hash, seed, index, rollouts
_ROLLOUT_FIELDS = 12
_MANIFEST_FIELDS = 10


def batch_id(data: bytes) -> str:
    """Content address of a signed batch: hex SHA-256 of its bytes as encoded by ``encode_batch``."""
    return hashlib.sha256(data).hexdigest()


def batch_payload_size(data: bytes) -> int:
    """The size a signed batch's payload declares it expands to, read from headers alone.

    Lets a receiver budget memory before decoding (nothing is verified or expanded here; ``decode_batch``
    still checks everything). Raises ``MalformedError`` if ``data`` is not framed as a batch.
    """
    if len(data) < HEADER_BYTES or data[:3] != MAGIC or data[3:4] != KIND_BATCH:
        raise MalformedError("not a signed batch")
    return declared_content_size(data[HEADER_BYTES:])


def group_digest(group: RolloutGroup) -> bytes:
    """16-byte content hash of a group: its task and each rollout's text, token ids and log-probs.

    Independent of the author, the signature, fingerprints, rewards, steps and the order of the rollouts,
    so the same group re-signed under another key (or shuffled, or relabelled) hashes the same.
    """
    t = group.task
    parts = sorted(
        hashlib.blake2b(_pack([tree[1], tree[2], tree[4]]), digest_size=16).digest()
        for tree in map(_rollout_tree, group.rollouts)
    )
    head = _pack([t.source, t.dataset, t.config_hash, t.seed, t.index])
    return hashlib.blake2b(head + b"".join(parts), digest_size=16).digest()


# --- encoding ----------------------------------------------------------------------------------------


def _pack(tree: list[Any]) -> bytes:
    try:
        out: bytes = msgpack.packb(tree, use_bin_type=True, use_single_float=False)
    except (ValueError, TypeError, OverflowError) as exc:  # e.g. a lone surrogate, an int past 64 bits
        raise MalformedError(f"record cannot be encoded: {exc}") from exc
    return out


def _rollout_tree(r: Rollout) -> list[Any]:
    n = len(r.completion_ids)
    return [
        r.prompt,
        r.completion,
        struct.pack(f"<{n}I", *r.completion_ids),
        r.tokenizer_fingerprint,
        struct.pack(f"<{n}f", *r.behavior_logprobs),
        r.sampling.temperature,
        r.sampling.top_p,
        r.model_fingerprint,
        r.policy_step,
        r.finish_reason,
        r.reward,
        struct.pack(f"<{len(r.routing)}H", *r.routing),
    ]


def _batch_tree(batch: RolloutBatch) -> list[Any]:
    groups = [
        [t.source, t.dataset, t.config_hash, t.seed, t.index, [_rollout_tree(r) for r in g.rollouts]]
        for g in batch.groups
        for t in (g.task,)
    ]
    return [batch.swarm_id, list(batch.address), batch.epoch, batch.seq, batch.created_at, groups]


def encode_batch(batch: RolloutBatch, identity: Identity, limits: Limits | None = DEFAULT_LIMITS) -> bytes:
    """Canonical signed bytes of ``batch``; ``batch.author`` must be ``identity``'s public key.

    With ``limits`` (default ``DEFAULT_LIMITS``) a batch that receivers would reject raises
    ``TooLargeError`` here instead; pass ``None`` to skip that check.
    """
    if batch.author != identity.public_key:
        raise IdentityError(f"batch author is not the signing identity {identity.peer_id}")
    if limits is not None:
        check_batch_limits(batch, limits)
    raw = _pack(_batch_tree(batch))
    if limits is not None and len(raw) > limits.max_decompressed_bytes:
        raise TooLargeError(
            f"batch payload is {len(raw)} bytes, the limit is {limits.max_decompressed_bytes}"
        )
    data = seal(KIND_BATCH, identity, compress(raw))
    if limits is not None and len(data) > limits.max_compressed_bytes:
        raise TooLargeError(f"signed batch is {len(data)} bytes, the limit is {limits.max_compressed_bytes}")
    return data


def check_batch_limits(batch: RolloutBatch, limits: Limits = DEFAULT_LIMITS) -> None:
    """Raise ``TooLargeError`` if a receiver with ``limits`` would reject ``batch`` for its counts."""
    _check_count("groups per batch", len(batch.groups), limits.max_groups_per_batch)
    _check_addresses(list(batch.address), limits)
    _check_text("swarm_id", batch.swarm_id, limits.max_name_chars)
    for group in batch.groups:
        _check_count("completions per group", len(group.rollouts), limits.max_completions_per_group)
        for name in (group.task.source, group.task.dataset, group.task.config_hash):
            _check_text("task field", name, limits.max_name_chars)
        for r in group.rollouts:
            _check_text("prompt", r.prompt, limits.max_text_chars)
            _check_text("completion", r.completion, limits.max_text_chars)
            _check_count("completion tokens", len(r.completion_ids), limits.max_tokens)
            _check_count("routing entries", len(r.routing), limits.max_routing)
            _check_text("tokenizer_fingerprint", r.tokenizer_fingerprint, limits.max_name_chars)
            _check_text("model_fingerprint", r.model_fingerprint, limits.max_name_chars)


def _manifest_tree(m: Manifest) -> list[Any]:
    return [
        m.swarm_id,
        bytes.fromhex(m.batch_id),
        list(m.address),
        m.epoch,
        m.seq,
        m.byte_size,
        m.n_groups,
        m.n_rollouts,
        m.created_at,
        m.expires_at,
    ]


def encode_manifest(m: Manifest, identity: Identity, limits: Limits = DEFAULT_LIMITS) -> bytes:
    """Canonical signed bytes of ``m``; raises ``TooLargeError`` past ``limits.max_manifest_bytes``."""
    if m.author != identity.public_key:
        raise IdentityError(f"manifest author is not the signing identity {identity.peer_id}")
    data = seal(KIND_MANIFEST, identity, _pack(_manifest_tree(m)))
    if len(data) > limits.max_manifest_bytes:
        raise TooLargeError(f"manifest is {len(data)} bytes, the limit is {limits.max_manifest_bytes}")
    return data


def make_manifest(batch: RolloutBatch, data: bytes, expires_at: float) -> Manifest:
    """The manifest that points at ``data``, the signed encoding of ``batch``."""
    return Manifest(
        swarm_id=batch.swarm_id,
        batch_id=batch_id(data),
        author=batch.author,
        address=batch.address,
        epoch=batch.epoch,
        seq=batch.seq,
        byte_size=len(data),
        n_groups=len(batch.groups),
        n_rollouts=batch.n_rollouts,
        created_at=batch.created_at,
        expires_at=expires_at,
    )


# --- decoding ----------------------------------------------------------------------------------------


def _check_count(what: str, n: int, limit: int) -> None:
    if n > limit:
        raise TooLargeError(f"{n} {what}, the limit is {limit}")


def _check_text(what: str, value: str, limit: int) -> None:
    if len(value) > limit:
        raise TooLargeError(f"{what} has {len(value)} chars, the limit is {limit}")


def _check_addresses(address: list[Any], limits: Limits) -> None:
    _check_count("addresses", len(address), limits.max_addresses)
    for entry in address:
        if type(entry) is str:
            _check_text("address", entry, limits.max_address_chars)


def _unpack(raw: bytes, limits: Limits) -> Any:
    """msgpack-decode untrusted ``raw`` with per-object bounds; it must re-pack to the same bytes."""
    longest_text = max(limits.max_text_chars, limits.max_name_chars, limits.max_address_chars)
    try:
        tree = msgpack.unpackb(
            raw,
            raw=False,
            use_list=True,
            strict_map_key=True,
            max_str_len=4 * longest_text,  # UTF-8 bytes per char <= 4; chars are checked after
            max_bin_len=max(4 * limits.max_tokens, 2 * limits.max_routing),
            max_array_len=max(
                limits.max_groups_per_batch,
                limits.max_completions_per_group,
                limits.max_addresses,
                _ROLLOUT_FIELDS,
            ),
            max_map_len=0,  # the schema has no maps and no extension types
            max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises several unrelated types on bad input; all mean malformed
        if any(f"exceeds max_{kind}_len" in str(exc) for kind in ("str", "bin", "array")):
            raise TooLargeError(f"payload object too large: {exc}") from exc
        raise MalformedError(f"payload is not valid msgpack: {exc!r}") from exc
    try:
        canonical = msgpack.packb(tree, use_bin_type=True, use_single_float=False) == raw
    except Exception:  # cannot happen for what unpackb returns, but a check must not crash
        canonical = False
    if not canonical:
        raise MalformedError("payload is not in canonical form")
    return tree


def _array(obj: Any, n: int | None, what: str) -> list[Any]:
    if type(obj) is not list or (n is not None and len(obj) != n):
        want = "an array" if n is None else f"an array of {n}"
        got = f"an array of {len(obj)}" if type(obj) is list else type(obj).__name__
        raise MalformedError(f"{what} must be {want}, got {got}")
    return obj


def _typed(obj: Any, kind: type, what: str) -> Any:
    if type(obj) is not kind:
        raise MalformedError(f"{what} must be {kind.__name__}, got {type(obj).__name__}")
    return obj


def _packed(blob: Any, fmt: str, width: int, limit: int, what: str) -> tuple[Any, ...]:
    """Unpack little-endian fixed-width values from ``blob``; ``len(blob) // width`` values."""
    _typed(blob, bytes, what)
    n, rest = divmod(len(blob), width)
    if rest:
        raise MalformedError(f"{what} is {len(blob)} bytes, not a multiple of {width}")
    _check_count(what, n, limit)
    out: tuple[Any, ...] = struct.unpack(f"<{n}{fmt}", blob)
    return out


def _decode_rollout(tree: Any, task: TaskRef, limits: Limits) -> Rollout:
    f = _array(tree, _ROLLOUT_FIELDS, "rollout")
    prompt = _typed(f[0], str, "prompt")
    completion = _typed(f[1], str, "completion")
    _check_text("prompt", prompt, limits.max_text_chars)
    _check_text("completion", completion, limits.max_text_chars)
    reward = f[10]
    if reward is not None:
        _typed(reward, float, "reward")
    return Rollout(
        task=task,
        prompt=prompt,
        completion=completion,
        completion_ids=_packed(f[2], "I", 4, limits.max_tokens, "completion tokens"),
        tokenizer_fingerprint=_name(f[3], "tokenizer_fingerprint", limits),
        behavior_logprobs=_packed(f[4], "f", 4, limits.max_tokens, "behaviour log-probs"),
        sampling=SamplingParams(_typed(f[5], float, "temperature"), _typed(f[6], float, "top_p")),
        model_fingerprint=_name(f[7], "model_fingerprint", limits),
        policy_step=_typed(f[8], int, "policy_step"),
        finish_reason=_typed(f[9], str, "finish_reason"),
        reward=reward,
        routing=_packed(f[11], "H", 2, limits.max_routing, "routing entries"),
    )


def _name(obj: Any, what: str, limits: Limits) -> str:
    value: str = _typed(obj, str, what)
    _check_text(what, value, limits.max_name_chars)
    return value


def _decode_group(tree: Any, limits: Limits) -> RolloutGroup:
    f = _array(tree, _GROUP_FIELDS, "group")
    task = TaskRef(
        source=_name(f[0], "task source", limits),
        dataset=_name(f[1], "task dataset", limits),
        config_hash=_name(f[2], "task config_hash", limits),
        seed=_typed(f[3], int, "task seed"),
        index=_typed(f[4], int, "task index"),
    )
    rollouts = _array(f[5], None, "rollouts")
    _check_count("completions per group", len(rollouts), limits.max_completions_per_group)
    return RolloutGroup(task, tuple(_decode_rollout(r, task, limits) for r in rollouts))


def _address(obj: Any, limits: Limits) -> tuple[str, ...]:
    address = _array(obj, None, "address")
    _check_addresses(address, limits)
    return tuple(_typed(a, str, "address entry") for a in address)


def decode_batch(data: bytes, limits: Limits = DEFAULT_LIMITS) -> RolloutBatch:
    """Check and decode a signed batch from an untrusted peer.

    Returns a valid ``RolloutBatch`` whose ``author`` signed exactly ``data``, or raises a
    ``ProtocolError`` subclass (``TooLargeError``, ``MalformedError``, ``BadSignatureError``,
    ``UnsupportedVersionError``); never another exception.
    """
    data = _as_bytes(data)
    author, payload = open_envelope(data, KIND_BATCH, limits.max_compressed_bytes)
    f = _array(
        _unpack(decompress_bounded(payload, limits.max_decompressed_bytes), limits), _BATCH_FIELDS, "batch"
    )
    groups = _array(f[5], None, "groups")
    _check_count("groups per batch", len(groups), limits.max_groups_per_batch)
    return _guarded(
        lambda: RolloutBatch(
            swarm_id=_name(f[0], "swarm_id", limits),
            author=author,
            address=_address(f[1], limits),
            epoch=_typed(f[2], int, "epoch"),
            seq=_typed(f[3], int, "seq"),
            created_at=_typed(f[4], float, "created_at"),
            groups=tuple(_decode_group(g, limits) for g in groups),
        )
    )


def decode_manifest(data: bytes, limits: Limits = DEFAULT_LIMITS) -> Manifest:
    """Check and decode a signed manifest (at most ``limits.max_manifest_bytes``); its author is its signer.

    Returns a valid ``Manifest`` or raises a ``ProtocolError`` subclass, never another exception.
    """
    data = _as_bytes(data)
    author, payload = open_envelope(data, KIND_MANIFEST, limits.max_manifest_bytes)
    f = _array(_unpack(payload, limits), _MANIFEST_FIELDS, "manifest")
    digest = _typed(f[1], bytes, "batch_id")
    if len(digest) != 32:
        raise MalformedError(f"batch_id must be 32 bytes, got {len(digest)}")
    return _guarded(
        lambda: Manifest(
            swarm_id=_name(f[0], "swarm_id", limits),
            batch_id=digest.hex(),
            author=author,
            address=_address(f[2], limits),
            epoch=_typed(f[3], int, "epoch"),
            seq=_typed(f[4], int, "seq"),
            byte_size=_typed(f[5], int, "byte_size"),
            n_groups=_typed(f[6], int, "n_groups"),
            n_rollouts=_typed(f[7], int, "n_rollouts"),
            created_at=_typed(f[8], float, "created_at"),
            expires_at=_typed(f[9], float, "expires_at"),
        )
    )


def _as_bytes(data: Any) -> bytes:
    if type(data) is bytes:
        return data
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    raise MalformedError(f"expected bytes, got {type(data).__name__}")


def _guarded(build: Callable[[], _T]) -> _T:
    """Run a record builder; record invariants raise ``MalformedError``, anything else is a bug in a check.

    The final net turns such a bug into ``MalformedError`` (and logs it) so peer input never crashes a
    caller; the fuzz tests assert the net is never reached.
    """
    try:
        return build()
    except ProtocolError:
        raise
    except Exception as exc:  # defensive: keep the "only ProtocolError" contract even if a check is missing
        logger.warning("unchecked %s while decoding a record; rejected as malformed", type(exc).__name__)
        raise MalformedError(f"invalid record: {exc!r}") from exc
