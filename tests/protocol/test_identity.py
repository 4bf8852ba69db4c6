from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from protocol import Identity, IdentityError, ProtocolError, peer_id_from_public_key, verify_signature
from tests.protocol.strategies import RFC8032_PUBLIC, RFC8032_SIG_EMPTY


def test_rfc8032_vector(identity: Identity) -> None:
    assert identity.public_key == RFC8032_PUBLIC
    assert identity.sign(b"") == RFC8032_SIG_EMPTY
    assert verify_signature(RFC8032_PUBLIC, b"", RFC8032_SIG_EMPTY)


def test_verify_rejects_tampering_and_never_raises(identity: Identity, other_identity: Identity) -> None:
    sig = identity.sign(b"hello")
    assert verify_signature(identity.public_key, b"hello", sig)
    assert not verify_signature(identity.public_key, b"hellp", sig)
    assert not verify_signature(other_identity.public_key, b"hello", sig)
    assert not verify_signature(identity.public_key, b"hello", sig[:-1] + bytes([sig[-1] ^ 1]))
    assert not verify_signature(identity.public_key[:31], b"hello", sig)
    assert not verify_signature(identity.public_key, b"hello", sig + b"\x00")
    assert not verify_signature(b"\xff" * 32, b"hello", sig)  # not a curve point


def test_peer_id_is_derived_from_public_key(identity: Identity, other_identity: Identity) -> None:
    # Pinned: changing the derivation changes every node's id.
    assert identity.peer_id == "f6c195738c4bcafac90187da0fad9bf1"
    assert identity.peer_id == peer_id_from_public_key(identity.public_key)
    assert other_identity.peer_id != identity.peer_id
    assert len(Identity.generate().peer_id) == 32
    with pytest.raises(IdentityError):
        peer_id_from_public_key(b"short")


def test_save_load_roundtrip_mode_0600(tmp_path: Path) -> None:
    path = tmp_path / "keys" / "node.pem"
    ident = Identity.generate()
    ident.save(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    assert os.listdir(path.parent) == ["node.pem"]  # no temp file left behind
    loaded = Identity.load(path)
    assert loaded.public_key == ident.public_key
    assert loaded.sign(b"x") == ident.sign(b"x")
    # Saving again atomically replaces the file.
    second = Identity.generate()
    second.save(path)
    assert Identity.load(path).public_key == second.public_key
    assert os.listdir(path.parent) == ["node.pem"]


def test_load_or_create(tmp_path: Path) -> None:
    path = tmp_path / "node.pem"
    first = Identity.load_or_create(path)
    assert path.exists()
    assert Identity.load_or_create(path).public_key == first.public_key


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o602])
def test_load_rejects_loose_permissions(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "node.pem"
    Identity.generate().save(path)
    path.chmod(mode)
    with pytest.raises(IdentityError) as info:
        Identity.load(path)
    message = str(info.value)
    assert str(path) in message
    assert f"chmod 600 {path}" in message
    assert f"{mode:04o}" in message
    with pytest.raises(IdentityError):  # load_or_create does not paper over it either
        Identity.load_or_create(path)


def _write_private(path: Path, content: bytes) -> None:
    path.write_bytes(content)
    path.chmod(0o600)


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"not a key at all",
        b"-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIJ1hsZ3v/VpguoRK9JLsLMREScVpezJpGXA7rAMcrn9g\n",
        b"-----BEGIN PRIVATE KEY-----\n!!!!\n-----END PRIVATE KEY-----\n",
        os.urandom(300),
    ],
    ids=["empty", "text", "truncated", "bad-base64", "random"],
)
def test_load_rejects_corrupt_file(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "node.pem"
    _write_private(path, content)
    with pytest.raises(IdentityError) as info:
        Identity.load(path)
    assert str(path) in str(info.value)
    assert "keygen" in str(info.value)


def test_load_rejects_other_key_types(tmp_path: Path) -> None:
    path = tmp_path / "ec.pem"
    pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    _write_private(path, pem)
    with pytest.raises(IdentityError, match="not an Ed25519 key"):
        Identity.load(path)


def test_load_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.pem"
    with pytest.raises(IdentityError, match="keygen") as info:
        Identity.load(path)
    assert isinstance(info.value, ProtocolError)


def test_load_directory_is_identity_error(tmp_path: Path) -> None:
    with pytest.raises(IdentityError):
        Identity.load(tmp_path)
