"""SwarmSettings validation, SWARM_INITIAL_PEERS parsing and key/subkey helpers."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from swarm.keys import (
    KEY_SHARDS,
    SLOTS_PER_AUTHOR,
    epoch_at,
    epochs_to_read,
    manifest_key,
    manifest_subkey,
    shard_of,
    split_subkey,
)
from swarm.settings import SwarmSettings, initial_peers_from_env, parse_initial_peers

PEER = "/ip4/127.0.0.1/tcp/31337/p2p/12D3KooWDePaggDhKViWWG9BiNRGvevgFHi49xfYoAErMVvSS9oA"


def test_defaults() -> None:
    s = SwarmSettings()
    assert (
        s.swarm_id == "swarm-node-dev" and s.initial_peers == [] and s.host_maddrs == ["/ip4/127.0.0.1/tcp/0"]
    )
    assert s.startup_timeout == 60.0 and s.read_epochs == 2


def test_initial_peers_from_env_splits_commas_and_spaces() -> None:
    assert parse_initial_peers(f" {PEER},{PEER}\n {PEER} ,") == [PEER] * 3
    assert initial_peers_from_env({"SWARM_INITIAL_PEERS": f"{PEER} {PEER}"}) == [PEER, PEER]
    assert initial_peers_from_env({}) == []


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("swarm_id", "has space", "swarm_id"),
        ("initial_peers", ["/ip4/127.0.0.1/tcp/1"], "/p2p/"),
        ("initial_peers", ["127.0.0.1:1"], "not a multiaddr"),
        ("announce_maddrs", ["/ip4/1.2.3.4/tcp/0"], "port 0"),
        ("host_maddrs", [], "at least one"),
        ("epoch_seconds", 0, "greater than 0"),
        ("bogus", 1, "Extra inputs"),
    ],
)
def test_bad_settings_name_the_field(field: str, value: object, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        SwarmSettings.model_validate({field: value})


def test_ttl_must_not_exceed_its_ceiling() -> None:
    with pytest.raises(ValidationError, match="manifest_ttl"):
        SwarmSettings(manifest_ttl=700, max_manifest_ttl=600)


def test_epochs_and_keys() -> None:
    assert epoch_at(119.9, 60) == 1 and epoch_at(120.0, 60) == 2
    assert epochs_to_read(5, 2) == [5, 4] and epochs_to_read(0, 3) == [0]
    assert manifest_key("s", 3, 1) == "s/rollouts/e3/s1"
    assert 0 <= shard_of("abc") < KEY_SHARDS
    assert manifest_subkey("abc", SLOTS_PER_AUTHOR + 3) == "abc/3"
    assert split_subkey("abc/3") == ("abc", 3)
    for bad in ("abc", "abc/", "/3", f"abc/{SLOTS_PER_AUTHOR}", "abc/-1", "abc/x"):
        assert split_subkey(bad) is None
