"""The swarm descriptor: canonical bytes, signature, expiry, versions, and parsing of untrusted text."""

from __future__ import annotations

import base64
import hashlib
from datetime import datetime, timedelta, timezone

import msgpack
import pytest

from protocol import Identity
from protocol.descriptor import (
    MAX_DESCRIPTOR_BYTES,
    SwarmDescriptor,
    TaskSet,
    fingerprint,
    owner_text,
    parse_descriptor,
)
from protocol.errors import (
    DescriptorError,
    DescriptorExpiredError,
    DescriptorSignatureError,
    DescriptorVersionError,
    ProtocolError,
)
from tests.protocol.strategies import RFC8032_PUBLIC

HOST = "/ip4/203.0.113.2/tcp/31337/p2p/12D3KooWJWoaqZhDaoEFshF7Rh1bpY9ohihFhzcW6d69Lr2NASuq"
EXPIRES = datetime(2031, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


def make(owner: Identity, **changes: object) -> SwarmDescriptor:
    fields: dict[str, object] = dict(
        swarm_id="demo", name="Demo swarm", protocol_version=1, hosts=[HOST], expires=EXPIRES,
        settings={"swarm.epoch_seconds": 60.0, "swarm.key_shards": 4},
        tasks=TaskSet(source="arith", datasets=["add"], config_hash="0123456789ab"),
        recommended_models={"cpu": {"model.name_or_path": "tiny-base"}}, owner=owner_text(owner.public_key))
    fields.update(changes)
    return SwarmDescriptor.model_validate(fields).sign(owner)


def test_canonical_bytes_are_the_documented_msgpack_array(identity: Identity) -> None:
    """Worked by hand from docs/protocol.md, section 12: a 10-array in field order, mappings as sorted pairs."""
    d = make(identity, recommended_models={})
    expected = (
        b"\x9a" + b"\x01" + b"\xa4demo" + b"\xaaDemo swarm" + b"\x01"
        + b"\x91" + b"\xd9" + bytes([len(HOST)]) + HOST.encode()
        + b"\xce" + int(EXPIRES.timestamp()).to_bytes(4, "big")
        + b"\x92" + b"\x92\xb3swarm.epoch_seconds\xcb" + bytes.fromhex("404e000000000000")
        + b"\x92\xb0swarm.key_shards\x04"
        + b"\x94\xa5arith\x91\xa3add\xa2{}\xac0123456789ab"
        + b"\x90"
        + b"\xc4\x20" + RFC8032_PUBLIC
    )
    assert d.canonical_bytes() == expected
    assert d.owner_key == RFC8032_PUBLIC
    assert identity.sign(b"swarm-node/swarm-descriptor/v1\x00" + expected) == base64.b64decode(d.signature or "")


def test_fingerprint_is_sha256_of_the_raw_key_as_ssh_shows_it() -> None:
    digest = hashlib.sha256(RFC8032_PUBLIC).digest()
    assert fingerprint(RFC8032_PUBLIC) == "SHA256:" + base64.b64encode(digest).decode().rstrip("=")
    assert len(fingerprint(RFC8032_PUBLIC)) == 7 + 43


def test_a_signed_descriptor_survives_yaml_and_reformatting(identity: Identity) -> None:
    d = make(identity)
    text = d.to_yaml()
    again = parse_descriptor(text)
    again.verify()
    assert again == d
    # Comments, key order and layout are not content.
    lines = text.splitlines()
    moved = "\n".join(["# a comment", *reversed([ln for ln in lines if ln.startswith(("owner:", "signature:"))]),
                       *[ln for ln in lines if not ln.startswith(("owner:", "signature:"))]])
    parse_descriptor(moved).verify()


@pytest.mark.parametrize("change", [
    {"swarm_id": "demo2"}, {"name": "Other"}, {"hosts": [HOST.replace("203.0.113.2", "203.0.113.3")]},
    {"expires": EXPIRES + timedelta(days=1)},
    {"settings": {"swarm.epoch_seconds": 30.0, "swarm.key_shards": 4}},
    {"settings": {"swarm.epoch_seconds": 60, "swarm.key_shards": 4}},  # an int is another value than a float
    {"settings": {"swarm.epoch_seconds": 60.0}},
    {"tasks": TaskSet(source="arith", datasets=["add", "mul"], config_hash="0123456789ab")},
    {"tasks": TaskSet(source="arith", datasets=["add"], dataset_configs={"add": {"x": 1}}, config_hash="0123456789ab")},
    {"tasks": TaskSet(source="arith", datasets=["add"], config_hash="0123456789ac")},
    {"recommended_models": {"cpu": {"model.name_or_path": "small-base"}}},
    {"protocol_version": 2},
])
def test_any_change_of_a_value_breaks_the_signature(identity: Identity, change: dict[str, object]) -> None:
    signed = make(identity)
    tampered = parse_descriptor(signed.model_copy(update=change).to_yaml())
    with pytest.raises(DescriptorSignatureError, match="does not match"):
        tampered.verify()


def test_another_owner_cannot_sign_for_the_first(identity: Identity, other_identity: Identity) -> None:
    signed = make(identity)
    swapped = signed.model_copy(update={"owner": owner_text(other_identity.public_key)})
    with pytest.raises(DescriptorSignatureError):
        swapped.verify()
    resigned = signed.sign(other_identity)
    resigned.verify()  # valid, but by another owner: pinning (node.config.join) refuses it
    assert resigned.owner_fingerprint != signed.owner_fingerprint


def test_an_unsigned_descriptor_is_refused(identity: Identity) -> None:
    with pytest.raises(DescriptorSignatureError, match="not signed"):
        make(identity).model_copy(update={"signature": None}).verify()


def test_expiry_and_protocol_version_are_checked(identity: Identity) -> None:
    d = make(identity)
    d.check_usable(EXPIRES - timedelta(seconds=1))
    with pytest.raises(DescriptorExpiredError, match="^expires: .*2031-01-02T03:04:05Z"):
        d.check_usable(EXPIRES)
    with pytest.raises(DescriptorVersionError, match="^protocol_version: .* 2, .* 1"):
        make(identity, protocol_version=2).check_usable(EXPIRES - timedelta(days=1))
    with pytest.raises(DescriptorVersionError, match="^format"):
        parse_descriptor(d.to_yaml().replace("format: 1", "format: 2"))


def test_a_naive_expiry_is_utc_and_whole_seconds(identity: Identity) -> None:
    d = make(identity, expires=datetime(2031, 1, 2, 3, 4, 5, 999))
    assert d.expires == EXPIRES


@pytest.mark.parametrize(("edit", "field"), [
    (lambda t: t.replace("swarm_id: demo", "swarm_id: 'no spaces allowed'"), "swarm_id"),
    (lambda t: t.replace(HOST, "/ip4/203.0.113.2/tcp/31337"), "hosts"),
    (lambda t: t.replace("swarm.key_shards", "Shards"), "settings"),
    (lambda t: t.replace("owner: ed25519:", "owner: rsa:"), "owner"),
    (lambda t: t.replace("signature: ", "signature: x"), "signature"),
    (lambda t: t.replace("cpu:", "laptop:"), "recommended_models"),
    (lambda t: t + "extra_field: 1\n", "extra_field"),
    (lambda t: t.replace("config_hash: 0123456789ab", "config_hash: XYZ"), "tasks.config_hash"),
])
def test_a_bad_field_is_one_error_naming_it(identity: Identity, edit: object, field: str) -> None:
    text = edit(make(identity).to_yaml())  # type: ignore[operator]
    with pytest.raises(DescriptorError) as info:
        parse_descriptor(text)
    message = str(info.value)
    assert message.startswith(field) and "\n" not in message, message


@pytest.mark.parametrize(("text", "match"), [
    ("- a list", "must be a mapping"),
    ("a: [unclosed", "not valid YAML"),
    ("a: &x [1, 2]\nb: *x\n", "aliases"),
    ("x" * (MAX_DESCRIPTOR_BYTES + 1), "bytes, more than"),
    (b"\xff\xfe", "not UTF-8"),
    ("[" * 20000, "collections"),
    ("a:\n" + "".join(" " * i + "b:\n" for i in range(1, 300)), "required"),  # deep by indentation: parses, fast
])
def test_untrusted_text_fails_with_one_descriptor_error(text: str | bytes, match: str) -> None:
    with pytest.raises(DescriptorError, match=match) as info:
        parse_descriptor(text)
    assert isinstance(info.value, ProtocolError)


def test_the_canonical_encoding_does_not_depend_on_mapping_order(identity: Identity) -> None:
    a = make(identity, settings={"swarm.epoch_seconds": 60.0, "swarm.key_shards": 4})
    b = make(identity, settings={"swarm.key_shards": 4, "swarm.epoch_seconds": 60.0})
    assert a.canonical_bytes() == b.canonical_bytes() and a.signature == b.signature
    assert msgpack.unpackb(a.canonical_bytes())[6] == [["swarm.epoch_seconds", 60.0], ["swarm.key_shards", 4]]
