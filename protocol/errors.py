"""The protocol layer's error root and its subclasses.

Anything decoded from a peer either yields a valid record or raises a ``ProtocolError`` subclass, so a
caller can reject peer input with ``except ProtocolError`` and count the subclass name as the reason.
"""

from __future__ import annotations

__all__ = [
    "BadSignatureError",
    "DescriptorError",
    "DescriptorExpiredError",
    "DescriptorSignatureError",
    "DescriptorVersionError",
    "IdentityError",
    "MalformedError",
    "ProtocolError",
    "TooLargeError",
    "UnsupportedVersionError",
]


class ProtocolError(Exception):
    """Root of every error raised by ``protocol``."""

    @property
    def reason(self) -> str:
        """A short, stable label for rejection counters (``malformed``, ``too_large``, ...)."""
        return _REASONS.get(type(self), "protocol")


class MalformedError(ProtocolError, ValueError):
    """Bytes that do not parse, or a record whose fields break an invariant.

    Also a ``ValueError``: building an invalid record locally is a plain value error.
    """


class TooLargeError(ProtocolError):
    """Input beyond a configured ``Limits`` bound; raised before the oversized data is expanded."""


class BadSignatureError(ProtocolError):
    """A signature that does not verify against the claimed author key."""


class UnsupportedVersionError(ProtocolError):
    """A schema version this build does not know; it is rejected, never guessed."""


class IdentityError(ProtocolError):
    """A key file that is missing, unreadable, corrupt or too permissive, or a mismatched key."""


class DescriptorError(ProtocolError):
    """A swarm descriptor that does not parse or does not fit its schema; the message names the field."""


class DescriptorSignatureError(DescriptorError):
    """A swarm descriptor that is unsigned, or whose signature does not match its content or owner."""


class DescriptorExpiredError(DescriptorError):
    """A swarm descriptor past its expiry."""


class DescriptorVersionError(DescriptorError):
    """A swarm descriptor of another descriptor format or wire protocol version than this node's."""


_REASONS: dict[type[ProtocolError], str] = {
    MalformedError: "malformed",
    TooLargeError: "too_large",
    BadSignatureError: "bad_signature",
    UnsupportedVersionError: "unsupported_version",
    IdentityError: "identity",
    DescriptorError: "descriptor",
    DescriptorSignatureError: "descriptor_signature",
    DescriptorExpiredError: "descriptor_expired",
    DescriptorVersionError: "descriptor_version",
}
