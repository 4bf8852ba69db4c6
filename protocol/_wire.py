"""Byte-level framing shared by the codecs: the signed envelope and bounded zstd.

Envelope layout (all records)::

    offset  size  field
    0       3     magic b"SWN"
    3       1     kind: b"B" batch, b"M" manifest
    4       2     schema version, big-endian uint16
    6       32    author: raw Ed25519 public key
    38      64    Ed25519 signature over bytes [0, 38) followed by the payload
    102     ...   payload (batch: one zstd frame of msgpack; manifest: msgpack)

The kind and version are signed, so a manifest signature can never pass as a batch signature.
"""

from __future__ import annotations

import threading
from typing import Any

import zstandard

from protocol.errors import BadSignatureError, MalformedError, TooLargeError, UnsupportedVersionError
from protocol.identity import PUBLIC_KEY_BYTES, Identity, verify_signature

MAGIC = b"SWN"
KIND_BATCH = b"B"
KIND_MANIFEST = b"M"
SCHEMA_VERSION = 1
"""Version of the envelope and record layouts. Bump on any change; receivers reject other versions."""

_SIGNED_PREFIX = len(MAGIC) + 1 + 2 + PUBLIC_KEY_BYTES  # 38
_SIG_END = _SIGNED_PREFIX + 64  # 102
HEADER_BYTES = _SIG_END
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_ZSTD_LEVEL = 3

_local = threading.local()  # zstd contexts are not thread-safe; one pair per thread


def seal(kind: bytes, identity: Identity, payload: bytes) -> bytes:
    """Wrap ``payload`` in a signed envelope by ``identity`` (deterministic, as Ed25519 is)."""
    prefix = MAGIC + kind + SCHEMA_VERSION.to_bytes(2, "big") + identity.public_key
    return prefix + identity.sign(prefix + payload) + payload


def open_envelope(data: bytes, kind: bytes, max_bytes: int) -> tuple[bytes, bytes]:
    """Check size, magic, kind, version and signature of ``data``; return ``(author, payload)``.

    Checks run cheapest first and before anything is allocated beyond ``data`` itself.
    """
    if len(data) > max_bytes:
        raise TooLargeError(f"signed record is {len(data)} bytes, the limit is {max_bytes}")
    if len(data) < HEADER_BYTES:
        raise MalformedError(
            f"signed record is {len(data)} bytes, shorter than its {HEADER_BYTES}-byte header"
        )
    if data[:3] != MAGIC:
        raise MalformedError(f"bad magic {data[:3]!r}, expected {MAGIC!r}")
    if data[3:4] != kind:
        raise MalformedError(f"record kind {data[3:4]!r}, expected {kind!r}")
    version = int.from_bytes(data[4:6], "big")
    if version != SCHEMA_VERSION:
        raise UnsupportedVersionError(f"schema version {version}; this node reads only {SCHEMA_VERSION}")
    author = data[6:_SIGNED_PREFIX]
    payload = data[_SIG_END:]
    if not verify_signature(author, data[:_SIGNED_PREFIX] + payload, data[_SIGNED_PREFIX:_SIG_END]):
        raise BadSignatureError("signature does not verify against the author key")
    return author, payload


def compress(raw: bytes) -> bytes:
    """One zstd frame (level 3, content size recorded, no checksum or dictionary id)."""
    ctx = getattr(_local, "cctx", None)
    if ctx is None:
        ctx = _local.cctx = zstandard.ZstdCompressor(
            level=_ZSTD_LEVEL, write_content_size=True, write_checksum=False, write_dict_id=False
        )
    out: bytes = ctx.compress(raw)
    return out


def _frame_parameters(payload: bytes) -> Any:
    """The header of a zstd frame that declares its content size, else ``MalformedError``."""
    if payload[:4] != _ZSTD_MAGIC:
        raise MalformedError("payload is not a zstd frame")
    try:
        params = zstandard.get_frame_parameters(payload)
    except zstandard.ZstdError as exc:
        raise MalformedError(f"bad zstd frame header: {exc}") from exc
    if params.content_size == zstandard.CONTENTSIZE_UNKNOWN:
        raise MalformedError("zstd frame does not declare its content size")
    return params


def declared_content_size(payload: bytes) -> int:
    """The content size a zstd frame declares in its header, read without expanding anything."""
    size: int = _frame_parameters(payload).content_size
    return size


def decompress_bounded(payload: bytes, max_bytes: int) -> bytes:
    """Expand exactly one zstd frame that declares its content size, at most ``max_bytes``.

    The declared size is checked against ``max_bytes`` before anything is expanded, and libzstd stops
    at the first block that would overrun the declared size, so a zip bomb costs at most the declared
    size (itself at most ``max_bytes``). A frame
    without a declared size, a dictionary, bytes after the frame, or a second frame are rejected.
    """
    params = _frame_parameters(payload)
    size: int = params.content_size
    if size > max_bytes:
        raise TooLargeError(f"payload expands to {size} bytes, the limit is {max_bytes}")
    if params.dict_id:
        raise MalformedError("zstd frame needs a dictionary")
    dctx = getattr(_local, "dctx", None)
    if dctx is None:
        dctx = _local.dctx = zstandard.ZstdDecompressor()
    # One output chunk of exactly the declared size: a lying frame fails when its next block would
    # overrun it, so expanding never holds more than ``size`` bytes (2x transiently on success).
    stream = dctx.decompressobj(write_size=max(size, 1))
    try:
        raw: bytes = stream.decompress(payload)
    except zstandard.ZstdError as exc:
        raise MalformedError(f"corrupt zstd frame: {exc}") from exc
    if not stream.eof or stream.unused_data or len(raw) != size:
        raise MalformedError("payload must be exactly one complete zstd frame of the declared size")
    return raw
