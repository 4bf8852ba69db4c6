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
    shards_to_read,
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
        ("initial_peers", ["/ip4/127.0.0.1/tcp/1/p2p/notapeerid"], "not a valid multiaddr, p2p: .* base58"),
        ("initial_peers", [PEER.replace("127.0.0.1", "127.0.0.256")], "not a valid multiaddr, ip4:"),
        ("initial_peers", [PEER.replace("31337", "65536")], "not a valid multiaddr, tcp:"),
        ("initial_peers", [PEER.replace("/tcp/", "/tpc/")], "not a valid multiaddr, tpc: Unknown Protocol"),
        ("host_maddrs", ["/ip4/0.0.0.0/tcp/port"], "not a valid multiaddr, tcp:"),
        ("announce_maddrs", ["/ip4/1.2.3.4/tcp/0"], "port 0"),
        ("host_maddrs", [], "at least one"),
        ("epoch_seconds", 0, "greater than 0"),
        ("bogus", 1, "Extra inputs"),
    ],
)
def test_bad_settings_name_the_field(field: str, value: object, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        SwarmSettings.model_validate({field: value})


def test_valid_addresses_of_every_kind_pass() -> None:
    qm_peer = "/ip4/10.0.0.2/tcp/4001/p2p/QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"
    peers = [PEER, qm_peer, PEER.replace("/ip4/127.0.0.1", "/ip6/::1"), PEER.replace("/ip4/127.0.0.1", "/dns/a.example")]
    hosts = ["/ip4/0.0.0.0/tcp/31337", "/ip6/::/tcp/0", "/ip4/0.0.0.0/udp/31337/quic"]
    s = SwarmSettings(initial_peers=peers, host_maddrs=hosts, announce_maddrs=["/ip4/1.2.3.4/tcp/31337"])
    assert s.initial_peers == peers and s.host_maddrs == hosts


def test_ttl_must_not_exceed_its_ceiling() -> None:
    with pytest.raises(ValidationError, match="manifest_ttl"):
        SwarmSettings(manifest_ttl=700, max_manifest_ttl=600)


def test_epochs_and_keys() -> None:
    assert epoch_at(119.9, 60) == 1 and epoch_at(120.0, 60) == 2
    assert epochs_to_read(5, 2) == [5, 4] and epochs_to_read(0, 3) == [0]
    assert manifest_key("s", 3, 1) == "s/rollouts/e3/s1"
    # First 8 bytes of sha256("abc") = 0xba7816bf8f01cfea, whose last two bits are 0b10.
    assert shard_of("abc") == 2 and KEY_SHARDS == 4
    assert manifest_subkey("abc", SLOTS_PER_AUTHOR + 3) == "abc/3"
    assert split_subkey("abc/3") == ("abc", 3)
    for bad in ("abc", "abc/", "/3", f"abc/{SLOTS_PER_AUTHOR}", "abc/-1", "abc/x"):
        assert split_subkey(bad) is None


def test_shards_of_a_larger_swarm_and_the_ones_a_node_reads() -> None:
    # 0xba7816bf8f01cfea mod 16 = 0xa: the last hex digit.
    assert shard_of("abc", 16) == 10 and shard_of("abc", 4) == shard_of("abc") == 2
    assert shards_to_read("me", 7, 4, 0) == [0, 1, 2, 3] == shards_to_read("me", 7, 4, 4)
    picked = shards_to_read("me", 7, 64, 3)
    assert len(set(picked)) == 3 and all(0 <= s < 64 for s in picked)
    assert shards_to_read("me", 7, 64, 3) == picked  # the same all epoch long
    # Other epochs and other readers draw other shards: every shard is read by someone.
    drawn = {s for reader in ("a", "b", "c", "d") for epoch in range(100) for s in shards_to_read(reader, epoch, 64, 3)}
    assert len(drawn) == 64


def test_initial_peers_from_a_file_with_comments(tmp_path) -> None:
    from swarm.settings import expand_initial_peers

    a = "/ip4/203.0.113.5/tcp/31337/p2p/12D3KooWSGJwbGPGkUnb1XsUSZox7jyoFP1HhmHPF5USADDTe8zk"
    b = "/dns4/peer.example.org/tcp/31337/p2p/12D3KooWSGJwbGPGkUnb1XsUSZox7jyoFP1HhmHPF5USADDTe8zk"
    c = "/ip4/198.51.100.7/tcp/4001/p2p/12D3KooWSGJwbGPGkUnb1XsUSZox7jyoFP1HhmHPF5USADDTe8zk"
    peers = tmp_path / "peers.txt"
    peers.write_text(f"# bootstrap peers of the public swarm\n{a}   # eu\n\n  {b},{c}\n#{c}\n")
    assert expand_initial_peers([f"@{peers}", a]) == [a, b, c, a]
    with pytest.raises(ValueError, match=r"--initial-peers @.*nope\.txt: cannot read"):
        expand_initial_peers([f"@{tmp_path / 'nope.txt'}"])
