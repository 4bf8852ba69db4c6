"""The swarm descriptor: one signed document (``swarm.yaml``) saying what every member of a swarm shares.

A swarm's owner writes it once (``swarm-node swarm init``) and signs it with an Ed25519 key; members
start with ``swarm-node start --swarm swarm.yaml`` (a file or a URL) and take every shared setting from
it. It holds the swarm id and name, the wire protocol's schema version, the multiaddrs of its hosts,
the shared settings by config key (``settings``), the task set with its config hash (``tasks``),
recommended models per hardware class and an expiry.

The signature covers a canonical encoding of the document's meaning, not its text: a msgpack array in a
fixed field order (no maps; mappings become arrays of ``[key, value]`` pairs sorted by key; floats as
float64; the free-form ``dataset_configs`` as canonical JSON), prefixed by a domain string. So comments,
key order and layout may change without breaking it; any change of a value does. Which config keys
belong in ``settings`` is the node's business (``node.config.join``); this module only checks the shape.

Parsing accepts untrusted text (a URL's answer): bounded in size, no YAML aliases, one
``DescriptorError`` naming the field out of anything that does not fit.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from datetime import datetime, timezone
from typing import Any, Literal

import msgpack
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from protocol._wire import SCHEMA_VERSION
from protocol.errors import (
    DescriptorError,
    DescriptorExpiredError,
    DescriptorSignatureError,
    DescriptorVersionError,
)
from protocol.identity import PUBLIC_KEY_BYTES, SIGNATURE_BYTES, Identity, verify_signature

__all__ = [
    "DESCRIPTOR_FORMAT",
    "MAX_DESCRIPTOR_BYTES",
    "Scalar",
    "SwarmDescriptor",
    "TaskSet",
    "fingerprint",
    "owner_text",
    "parse_descriptor",
]

DESCRIPTOR_FORMAT = 1
"""Version of this document's layout and of its canonical encoding."""
MAX_DESCRIPTOR_BYTES = 64 * 1024
_SIGNED_DOMAIN = b"swarm-node/swarm-descriptor/v1\x00"
_OWNER_PREFIX = "ed25519:"
_MAX_HOSTS = 16
_MAX_SETTINGS = 128
_SWARM_ID = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"  # as swarm.settings checks a swarm id
_CONFIG_KEY = r"[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+"
_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"
_MAX_FLOW_COLLECTIONS = 512  # [...] and {...}: PyYAML's pure-Python parser is quadratic in their nesting
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when built: fast, and bounds nesting itself

Scalar = bool | int | float | str
"""A setting's value: what one ``key=value`` override of a node's config gives."""


def fingerprint(public_key: bytes) -> str:
    """An owner key as people compare it: ``SHA256:`` and the unpadded base64 of its SHA-256 (as ssh shows keys)."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(public_key).digest()).decode().rstrip("=")


def owner_text(public_key: bytes) -> str:
    """The ``owner`` field of a raw Ed25519 public key."""
    return _OWNER_PREFIX + base64.b64encode(public_key).decode()


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TaskSet(_Model):
    """The tasks members share: a peer's group is used only when its task reference names this source,
    one of these datasets and this config hash (which covers the dataset configs)."""

    source: str = Field(pattern=f"^{_NAME}$")
    datasets: list[str] = Field(min_length=1, max_length=256)
    dataset_configs: dict[str, dict[str, Any]] = Field(default_factory=dict)
    config_hash: str = Field(pattern=r"^[0-9a-f]{6,64}$")

    @field_validator("datasets")
    @classmethod
    def _distinct_names(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value) or not all(re.fullmatch(_NAME, d) for d in value):
            raise ValueError("must be distinct dataset names (letters, digits, '.', '_', '-')")
        return value


class SwarmDescriptor(_Model):
    """A swarm's descriptor. ``signature`` is None until ``sign``; ``verify`` checks it against ``owner``."""

    format: Literal[1] = 1
    swarm_id: str = Field(pattern=f"^{_SWARM_ID}$")
    name: str = Field(min_length=1, max_length=128, pattern=r"^[^\n\r\t]+$")
    protocol_version: int = Field(ge=1, le=65535)
    hosts: list[str] = Field(min_length=1, max_length=_MAX_HOSTS)
    """Full multiaddrs of the swarm's hosts (``/ip4/.../tcp/PORT/p2p/<id>`` or ``/dns4/...``)."""
    expires: datetime
    """When members stop accepting this document (UTC, whole seconds): the owner signs a new one before."""
    settings: dict[str, Scalar] = Field(default_factory=dict, max_length=_MAX_SETTINGS)
    """Shared settings by config key (``swarm.epoch_seconds: 60.0``)."""
    tasks: TaskSet
    recommended_models: dict[str, dict[str, Scalar]] = Field(default_factory=dict, max_length=16)
    """Per hardware class (``cpu``, ``gpu-24gb``, ...): config keys a member takes unless it sets them."""
    owner: str
    """The owner's Ed25519 public key, ``ed25519:<base64>``."""
    signature: str | None = None
    """Base64 Ed25519 signature of the canonical encoding by ``owner``."""

    @field_validator("hosts")
    @classmethod
    def _full_multiaddrs(cls, value: list[str]) -> list[str]:
        for maddr in value:
            head, sep, peer = maddr.rpartition("/p2p/")
            if not maddr.startswith("/") or not sep or not head or not peer or "/" in peer or len(maddr) > 512:
                raise ValueError(f"{maddr!r} is not a full multiaddr ending in /p2p/<peer id>")
        if len(set(value)) != len(value):
            raise ValueError("lists a host twice")
        return value

    @field_validator("expires")
    @classmethod
    def _utc_seconds(cls, value: datetime) -> datetime:
        value = value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)
        return value.replace(microsecond=0)

    @field_validator("settings")
    @classmethod
    def _config_keys(cls, value: dict[str, Scalar]) -> dict[str, Scalar]:
        for key, item in value.items():
            if not re.fullmatch(_CONFIG_KEY, key):
                raise ValueError(f"{key!r} is not a config key (section.key, e.g. swarm.epoch_seconds)")
            if isinstance(item, str) and len(item) > 256:
                raise ValueError(f"{key}: a text value is at most 256 characters")
        return value

    @field_validator("recommended_models")
    @classmethod
    def _classes(cls, value: dict[str, dict[str, Scalar]]) -> dict[str, dict[str, Scalar]]:
        for hardware, keys in value.items():
            if not re.fullmatch(r"cpu|gpu-[1-9][0-9]{0,3}gb", hardware):
                raise ValueError(f"{hardware!r} is not a hardware class (cpu, or gpu-<memory>gb such as gpu-24gb)")
            cls._config_keys(keys)
        return value

    @field_validator("owner")
    @classmethod
    def _owner_key(cls, value: str) -> str:
        _decode(value.removeprefix(_OWNER_PREFIX), PUBLIC_KEY_BYTES, "an Ed25519 public key, ed25519:<base64>",
                prefixed=value.startswith(_OWNER_PREFIX))
        return value

    @field_validator("signature")
    @classmethod
    def _signature_shape(cls, value: str | None) -> str | None:
        if value is not None:
            _decode(value, SIGNATURE_BYTES, "a base64 Ed25519 signature")
        return value

    # -- keys and signature -----------------------------------------------------------------------------

    @property
    def owner_key(self) -> bytes:
        """The owner's raw 32-byte public key."""
        return base64.b64decode(self.owner.removeprefix(_OWNER_PREFIX))

    @property
    def owner_fingerprint(self) -> str:
        return fingerprint(self.owner_key)

    def canonical_bytes(self) -> bytes:
        """What the signature covers (without the domain prefix): every field but ``signature``."""
        t = self.tasks
        tree = [
            self.format, self.swarm_id, self.name, self.protocol_version, list(self.hosts),
            int(self.expires.timestamp()), _pairs(self.settings),
            [t.source, list(t.datasets), _canonical_json(t.dataset_configs), t.config_hash],
            [[hardware, _pairs(keys)] for hardware, keys in sorted(self.recommended_models.items())],
            self.owner_key,
        ]
        packed: bytes = msgpack.packb(tree, use_bin_type=True, use_single_float=False)
        return packed

    def sign(self, owner: Identity) -> SwarmDescriptor:
        """This document owned and signed by ``owner`` (the owner field is set to its key)."""
        unsigned = self.model_copy(update={"owner": owner_text(owner.public_key), "signature": None})
        signature = owner.sign(_SIGNED_DOMAIN + unsigned.canonical_bytes())
        return unsigned.model_copy(update={"signature": base64.b64encode(signature).decode()})

    def verify(self) -> None:
        """Raise ``DescriptorSignatureError`` unless ``signature`` is the owner's signature of this content."""
        if self.signature is None:
            raise DescriptorSignatureError("signature: the descriptor is not signed; sign it with "
                                           "`swarm-node swarm sign --key OWNER.pem FILE`")
        if not verify_signature(self.owner_key, _SIGNED_DOMAIN + self.canonical_bytes(),
                                base64.b64decode(self.signature)):
            raise DescriptorSignatureError(
                "signature: does not match the content (the file was changed after it was signed, or signed "
                "by another key); get the swarm's published descriptor again")

    def check_usable(self, now: datetime, protocol_version: int = SCHEMA_VERSION) -> None:
        """Raise unless this document is current and speaks this node's wire protocol."""
        if self.protocol_version != protocol_version:
            raise DescriptorVersionError(
                f"protocol_version: the swarm speaks wire protocol {self.protocol_version}, this swarm-node "
                f"speaks {protocol_version}; install a swarm-node release of protocol {self.protocol_version}")
        if now >= self.expires:
            raise DescriptorExpiredError(
                f"expires: the descriptor expired at {self.expires:%Y-%m-%dT%H:%M:%SZ}; get the swarm's current "
                "descriptor (its owner signs a new one before the old one expires)")

    # -- text -------------------------------------------------------------------------------------------

    def to_yaml(self) -> str:
        """The document as YAML (the expiry as an ISO 8601 UTC time), with a short header comment."""
        doc = self.model_dump(mode="python")
        doc["expires"] = self.expires.strftime("%Y-%m-%dT%H:%M:%SZ")
        doc["tasks"] = dict(doc["tasks"])
        header = (f"# The swarm descriptor of {self.swarm_id}: members take every shared setting from it\n"
                  "#   swarm-node start --swarm FILE_OR_URL [-c MEMBER_CONFIG] --run-dir RUN_DIR\n"
                  "# Signed by its owner: a changed value breaks the signature (re-sign with swarm-node swarm sign).\n")
        return header + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=110)


def parse_descriptor(text: str | bytes) -> SwarmDescriptor:
    """A descriptor from untrusted YAML text; ``DescriptorError`` naming the field if it is not one.

    Only the shape is checked here: call ``verify`` and ``check_usable`` before trusting it.
    """
    raw = text.encode("utf-8") if isinstance(text, str) else text
    if len(raw) > MAX_DESCRIPTOR_BYTES:
        raise DescriptorError(f"the descriptor is {len(raw)} bytes, more than the {MAX_DESCRIPTOR_BYTES} allowed")
    if raw.count(b"[") + raw.count(b"{") > _MAX_FLOW_COLLECTIONS:
        raise DescriptorError(f"the descriptor has more than {_MAX_FLOW_COLLECTIONS} [...] or {{...}} collections")
    try:
        source = raw.decode("utf-8")
        if any(isinstance(event, yaml.AliasEvent) for event in yaml.parse(source, Loader=_Loader)):
            raise DescriptorError("the descriptor uses YAML aliases (*name); write every value out")
        data = yaml.load(source, Loader=_Loader)  # noqa: S506 (a safe loader)
    except UnicodeDecodeError:
        raise DescriptorError("the descriptor is not UTF-8 text") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise DescriptorError(f"the descriptor is not valid YAML{where}: {getattr(exc, 'problem', None) or exc}") from None
    except RecursionError:
        raise DescriptorError("the descriptor nests too deeply") from None
    if not isinstance(data, dict):
        raise DescriptorError("the descriptor must be a mapping (swarm_id: ..., hosts: [...], ...)")
    if data.get("format", DESCRIPTOR_FORMAT) != DESCRIPTOR_FORMAT:
        raise DescriptorVersionError(f"format: descriptor format {data.get('format')!r} is not one this swarm-node "
                                     f"reads ({DESCRIPTOR_FORMAT}); install a newer swarm-node")
    try:
        descriptor = SwarmDescriptor.model_validate(data)
        descriptor.canonical_bytes()  # dataset configs that do not encode fail here, not at verify time
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "descriptor"
        message = str(first["msg"]).removeprefix("Value error, ")
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise DescriptorError(f"{where}: {message}{more}") from None
    except (TypeError, ValueError, RecursionError) as exc:
        raise DescriptorError(f"tasks.dataset_configs: not plain data ({type(exc).__name__})") from None
    return descriptor


def _pairs(mapping: dict[str, Scalar]) -> list[list[Scalar]]:
    return [[key, mapping[key]] for key in sorted(mapping)]


def _canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def _decode(text: str, size: int, what: str, *, prefixed: bool = True) -> bytes:
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if not prefixed or len(raw) != size:
        raise ValueError(f"must be {what}")
    return raw
