from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from protocol import Identity
from tests.protocol.strategies import RFC8032_SECRET


@pytest.fixture(scope="session")
def identity() -> Identity:
    """A fixed identity (the RFC 8032 test key), so encodings are reproducible across runs."""
    return Identity(Ed25519PrivateKey.from_private_bytes(RFC8032_SECRET))


@pytest.fixture(scope="session")
def other_identity() -> Identity:
    return Identity(Ed25519PrivateKey.from_private_bytes(bytes(range(32))))
