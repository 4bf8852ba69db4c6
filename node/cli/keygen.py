"""``swarm-node keygen``: an Ed25519 identity file (mode 0600)."""

from __future__ import annotations

import argparse
from pathlib import Path

from node.errors import ConfigError

__all__ = ["cmd_keygen"]


def cmd_keygen(args: argparse.Namespace) -> int:
    from protocol.errors import IdentityError
    from protocol.identity import Identity

    out = Path(args.out)
    if out.exists() and not args.force:
        raise ConfigError(f"--out {str(out)!r} already exists; choose another path or pass --force")
    ident = Identity.generate()
    try:
        ident.save(out)
    except (OSError, IdentityError) as exc:
        cause = exc.__cause__ if isinstance(exc.__cause__, OSError) else exc
        reason = getattr(cause, "strerror", None) or type(cause).__name__
        raise ConfigError(f"--out {str(out)!r} cannot be written ({reason}); choose a writable path") from None
    print(f"wrote {out} (peer id {ident.peer_id})")
    return 0
