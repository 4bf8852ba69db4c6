"""What nodes say to each other, and how a receiver checks it.

Pure: the standard library plus cryptography, msgpack, zstandard and pydantic. No torch, no hivemind,
no network I/O; the only I/O is reading and writing a key file.

- ``taskref``: ``TaskRef``, the reference that regenerates exactly one task on any machine.
- ``samples``: realistic sample batches for benchmarks and tests.
- ``errors``: ``ProtocolError``, the layer's error root, and its subclasses (malformed, too large, bad
  signature, unsupported version, identity).
- ``limits``: ``Limits``, every bound a receiver enforces on peer input, and ``DEFAULT_LIMITS``.
- ``identity``: ``Identity`` (Ed25519 key pair: key file, signing, peer id), ``verify_signature``.
- ``records``: the exchanged records: ``Rollout``, ``RolloutGroup``, ``RolloutBatch``, ``Manifest``.
- ``descriptor``: ``SwarmDescriptor``, the signed ``swarm.yaml`` that says what a swarm's members share.
- ``codec``: canonical signed encoding of batches and manifests, checked decoders, ``batch_id``.
- ``_wire``: byte-level envelope (header, signature) and bounded zstd, used by ``codec``.

Decoding anything a peer sent returns a valid record or raises a ``ProtocolError`` subclass.
"""

from protocol.codec import (
    SCHEMA_VERSION,
    batch_id,
    check_batch_limits,
    decode_batch,
    decode_manifest,
    encode_batch,
    encode_manifest,
    make_manifest,
)
from protocol.errors import (
    BadSignatureError,
    IdentityError,
    MalformedError,
    ProtocolError,
    TooLargeError,
    UnsupportedVersionError,
)
from protocol.identity import Identity, peer_id_from_public_key, verify_signature
from protocol.limits import DEFAULT_LIMITS, Limits
from protocol.records import Manifest, Rollout, RolloutBatch, RolloutGroup, SamplingParams
from protocol.taskref import TaskRef

__all__ = [
    "DEFAULT_LIMITS",
    "SCHEMA_VERSION",
    "BadSignatureError",
    "Identity",
    "IdentityError",
    "Limits",
    "MalformedError",
    "Manifest",
    "ProtocolError",
    "Rollout",
    "RolloutBatch",
    "RolloutGroup",
    "SamplingParams",
    "TaskRef",
    "TooLargeError",
    "UnsupportedVersionError",
    "batch_id",
    "check_batch_limits",
    "decode_batch",
    "decode_manifest",
    "encode_batch",
    "encode_manifest",
    "make_manifest",
    "peer_id_from_public_key",
    "verify_signature",
]
