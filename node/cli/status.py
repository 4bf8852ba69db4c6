"""``swarm-node status``: a one-screen summary of a running node, from its status API."""

from __future__ import annotations

import argparse
import sys

__all__ = ["cmd_status"]


def cmd_status(args: argparse.Namespace) -> int:
    from node.api.client import EXIT_UNREACHABLE, Unreachable, resolve_url, status_command

    try:
        url = resolve_url(args.url, args.run_dir)
    except Unreachable as exc:
        print(f"swarm-node status: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    code, text = status_command(url, args.token, args.timeout)
    print(text, file=sys.stdout if code != EXIT_UNREACHABLE else sys.stderr)
    return code
