"""libp2p key files (the ``/p2p/<id>`` of a multiaddr): created in hivemind's format, and their peer id.

A host's address is fixed by its key file and port, so a swarm's descriptor can name the host before it
first starts (``swarm-node swarm init --host-key``), and a host restarted with its key keeps its address.
Uses hivemind's own key format and peer-id derivation (the p2p daemon reads the same file); a process
that must stay free of torch calls ``swarm.hivemind_lean.load()`` before this.
"""

from __future__ import annotations

import os
from pathlib import Path

from hivemind.p2p import P2P, PeerID

from swarm.errors import SwarmError

__all__ = ["P2pKeyError", "ensure_p2p_key", "p2p_peer_id"]


class P2pKeyError(SwarmError):
    """A libp2p key file that cannot be read, written or parsed."""


def p2p_peer_id(path: str | os.PathLike[str]) -> str:
    """The base58 libp2p peer id (``12D3KooW...`` or ``Qm...``) of the key file at ``path``."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise P2pKeyError(f"cannot read the libp2p key {path} ({exc.strerror})") from None
    try:
        peer: str = PeerID.from_identity(data).to_base58()
    except Exception as exc:  # protobuf and DER parsers raise their own types
        raise P2pKeyError(f"{path} is not a libp2p key file ({type(exc).__name__})") from None
    return peer


def ensure_p2p_key(path: str | os.PathLike[str]) -> str:
    """The peer id of the key at ``path``, creating the key (mode 0400, parent folders too) if missing."""
    target = Path(path)
    if not target.exists():
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            P2P.generate_identity(str(target))
        except OSError as exc:
            raise P2pKeyError(f"cannot write the libp2p key {target} ({exc.strerror})") from None
    return p2p_peer_id(target)
