"""A node's Ed25519 identity: key file handling, signing, verification and the derived peer id."""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import tempfile
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from protocol.errors import IdentityError

__all__ = [
    "PUBLIC_KEY_BYTES",
    "SIGNATURE_BYTES",
    "Identity",
    "peer_id_from_public_key",
    "verify_signature",
]

PUBLIC_KEY_BYTES = 32
SIGNATURE_BYTES = 64
_PEER_ID_DOMAIN = b"swarm-node/peer-id/v1\x00"
_PEER_ID_HEX_CHARS = 32  # 128 bits of SHA-256


def peer_id_from_public_key(public_key: bytes) -> str:
    """The peer id of a raw 32-byte Ed25519 public key: 32 hex chars of a domain-separated SHA-256."""
    if not isinstance(public_key, bytes) or len(public_key) != PUBLIC_KEY_BYTES:
        raise IdentityError(f"a public key is {PUBLIC_KEY_BYTES} raw bytes, got {public_key!r:.80}")
    return hashlib.sha256(_PEER_ID_DOMAIN + public_key).hexdigest()[:_PEER_ID_HEX_CHARS]


def verify_signature(public_key: bytes, data: bytes, signature: bytes) -> bool:
    """True iff ``signature`` is a valid Ed25519 signature of ``data`` by ``public_key``; never raises."""
    if len(public_key) != PUBLIC_KEY_BYTES or len(signature) != SIGNATURE_BYTES:
        return False
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, data)
    except (InvalidSignature, ValueError):
        return False
    return True


class Identity:
    """An Ed25519 key pair. The private key never leaves this object except through ``save``."""

    __slots__ = ("_private_key", "peer_id", "public_key")

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        self._private_key = private_key
        self.public_key: bytes = private_key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        self.peer_id: str = peer_id_from_public_key(self.public_key)

    def __repr__(self) -> str:
        return f"Identity(peer_id={self.peer_id!r})"

    @classmethod
    def generate(cls) -> Identity:
        """A fresh random identity (not saved)."""
        return cls(Ed25519PrivateKey.generate())

    def sign(self, data: bytes) -> bytes:
        """The 64-byte Ed25519 signature of ``data`` (deterministic: same key and data, same bytes)."""
        return self._private_key.sign(data)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the private key as unencrypted PKCS#8 PEM, mode 0600, atomically (temp file + rename).

        Creates missing parent directories. An existing file at ``path`` is replaced.
        """
        target = Path(path)
        pem = self._private_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            # mkstemp creates the file with mode 0600 before any byte is written.
            fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        except OSError as exc:
            raise IdentityError(f"cannot write key file {target}: {exc}") from exc
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(pem)
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(tmp_name, 0o600)
            os.replace(tmp_name, target)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp_name)
            raise IdentityError(f"cannot write key file {target}: {exc}") from exc

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Identity:
        """Read a key written by ``save``.

        Raises ``IdentityError`` if the file is missing, readable or writable by group or others
        (fix: ``chmod 600 PATH``), or not an unencrypted Ed25519 private key in PEM.
        """
        source = Path(path)
        try:
            with open(source, "rb") as handle:
                mode = os.fstat(handle.fileno()).st_mode
                _check_private_mode(source, mode)
                pem = handle.read(64 * 1024)
        except FileNotFoundError as exc:
            raise IdentityError(
                f"no key file at {source}; create one with `swarm-node keygen --out {source}`"
            ) from exc
        except OSError as exc:
            raise IdentityError(f"cannot read key file {source}: {exc}") from exc
        try:
            key = serialization.load_pem_private_key(pem, password=None)
        except (ValueError, TypeError) as exc:
            raise IdentityError(
                f"key file {source} is corrupt or not an unencrypted PEM private key ({exc}); "
                f"restore it from a backup, or move it away and run `swarm-node keygen --out {source}`"
            ) from exc
        if not isinstance(key, Ed25519PrivateKey):
            raise IdentityError(
                f"key file {source} holds a {type(key).__name__}, not an Ed25519 key; "
                f"move it away and run `swarm-node keygen --out {source}`"
            )
        return cls(key)

    @classmethod
    def load_or_create(cls, path: str | os.PathLike[str]) -> Identity:
        """Load the key at ``path``, or generate and save a new one there if no file exists."""
        if os.path.lexists(path):
            return cls.load(path)
        identity = cls.generate()
        identity.save(path)
        return identity


def _check_private_mode(path: Path, mode: int) -> None:
    if os.name != "posix":
        return
    if not stat.S_ISREG(mode):
        raise IdentityError(f"key file {path} is not a regular file")
    loose = stat.S_IMODE(mode) & 0o077
    if loose:
        raise IdentityError(
            f"key file {path} has mode {stat.S_IMODE(mode):04o}: group or others can access it; "
            f"run `chmod 600 {path}`"
        )
