"""Decoding limits: every bound a receiver enforces on peer input lives here, in one place."""

from __future__ import annotations

from dataclasses import dataclass, fields

from protocol.errors import MalformedError

__all__ = ["DEFAULT_LIMITS", "Limits"]

_KIB = 1024
_MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Limits:
    """Upper bounds checked while decoding, each before the data it bounds is allocated.

    Sizes are in bytes, text lengths in characters (code points), token counts in ids.
    """

    max_compressed_bytes: int = 4 * _MIB
    """Size of a whole signed batch as received."""
    max_decompressed_bytes: int = 32 * _MIB
    """Size of the batch's msgpack payload after zstd; a frame declaring more is never expanded."""
    max_groups_per_batch: int = 256
    max_completions_per_group: int = 64
    max_text_chars: int = 16 * _KIB
    """Length of a prompt or a completion."""
    max_tokens: int = 4096
    """Completion ids (and as many behaviour log-probs) per rollout."""
    max_manifest_bytes: int = 8 * _KIB
    """Size of a whole signed manifest."""
    max_name_chars: int = 256
    """Length of short strings: swarm id, fingerprints, task source/dataset/config hash."""
    max_addresses: int = 16
    """Transport addresses (multiaddrs) per batch or manifest."""
    max_address_chars: int = 512
    max_routing: int = 8192
    """ReMix routing entries per rollout (active LoRA indices, flattened per layer)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if type(value) is not int or value <= 0:
                raise MalformedError(f"Limits.{f.name} must be a positive int, got {value!r}")


DEFAULT_LIMITS = Limits()
"""Sane defaults: 4 MiB signed, 32 MiB expanded, 256 groups x 64 completions, 16k chars, 4096 tokens."""
