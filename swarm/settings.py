"""``SwarmSettings``: everything the transport needs to join a swarm, typed and checked up front."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from swarm.maddr import MultiaddrParserMissing, multiaddr_problem

__all__ = [
    "DEFAULT_HOST_MADDR",
    "INITIAL_PEERS_ENV",
    "SwarmSettings",
    "expand_initial_peers",
    "initial_peers_from_env",
    "parse_initial_peers",
]

INITIAL_PEERS_ENV = "SWARM_INITIAL_PEERS"
DEFAULT_HOST_MADDR = "/ip4/127.0.0.1/tcp/0"
_SWARM_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_MIB = 1024 * 1024


def parse_initial_peers(text: str) -> list[str]:
    """Split a comma- and/or whitespace-separated list of multiaddrs (empty entries dropped)."""
    return [item for item in re.split(r"[\s,]+", text) if item]


def expand_initial_peers(items: list[str]) -> list[str]:
    """Multiaddrs from ``--initial-peers`` values: each a list (``parse_initial_peers``) or ``@FILE``.

    A peers file holds multiaddrs separated by newlines, commas or spaces; ``#`` starts a comment. A
    missing or unreadable file raises ``ValueError`` with one line naming it.
    """
    peers: list[str] = []
    for item in items:
        if not item.startswith("@"):
            peers += parse_initial_peers(item)
            continue
        path = item[1:]
        try:
            with open(path, encoding="utf-8") as handle:
                text = handle.read(1024 * 1024)
        except OSError as exc:
            raise ValueError(
                f"--initial-peers {item}: cannot read {path!r} ({exc.strerror}); give a file of multiaddrs, one a line"
            ) from None
        for line in text.splitlines():
            peers += parse_initial_peers(line.partition("#")[0])
    return peers


def initial_peers_from_env(environ: Mapping[str, str] | None = None) -> list[str]:
    """The initial peers named by ``$SWARM_INITIAL_PEERS`` (empty list when unset or blank)."""
    env = os.environ if environ is None else environ
    return parse_initial_peers(env.get(INITIAL_PEERS_ENV, ""))


def _check_maddr(field: str, maddr: str, *, need_peer_id: bool = False, explicit_port: bool = False) -> None:
    if not maddr.startswith("/"):
        raise ValueError(f"{field}: {maddr!r} is not a multiaddr (expected e.g. /ip4/127.0.0.1/tcp/31337)")
    if maddr == DEFAULT_HOST_MADDR:
        return  # ours: a run's saved config repeats it, and silo, eval and export load no multiaddr code for it
    try:
        problem = multiaddr_problem(maddr)
    except MultiaddrParserMissing:
        # hivemind is not installed, so this node cannot join a swarm (`start` says so): silo, eval and export
        # still read a config that names peers; the addresses are checked where hivemind is.
        return
    if problem is not None:
        hint = " (a peer id is base58, e.g. 12D3KooW...: copy the address a node prints)" if problem.startswith(
            "p2p:") else ""
        raise ValueError(f"{field}: {maddr!r} is not a valid multiaddr, {problem}{hint}")
    parts = maddr.strip("/").split("/")
    if need_peer_id and (len(parts) < 2 or parts[-2] != "p2p" or not parts[-1]):
        raise ValueError(
            f"{field}: {maddr!r} has no peer id; use the full address a node prints, ending in /p2p/<peer id>"
        )
    if explicit_port and any(a in ("tcp", "udp") and b == "0" for a, b in zip(parts, parts[1:])):
        raise ValueError(f"{field}: {maddr!r} uses port 0; announce the explicit port others can reach")


class SwarmSettings(BaseModel):
    """How one node joins and talks to a swarm. Durations are seconds; sizes bytes."""

    model_config = ConfigDict(extra="forbid")

    swarm_id: str = "swarm-node-dev"
    """Namespace of every DHT key and P2P handler: nodes with different ids never see each other's data."""
    initial_peers: list[str] = Field(default_factory=list)
    """Full multiaddrs (``.../p2p/<id>``) of running peers; empty for the first node of a swarm."""
    host_maddrs: list[str] = Field(default_factory=lambda: [DEFAULT_HOST_MADDR])
    """Where to listen. Use ``/ip4/0.0.0.0/tcp/<port>`` to accept peers from other hosts."""
    announce_maddrs: list[str] = Field(default_factory=list)
    """Addresses others should dial (e.g. a public IP behind a port forward); explicit ports only."""
    client_mode: bool | Literal["auto"] = False
    """Behind NAT: take part without answering DHT requests (others cannot dial in). ``auto``: start so, ask a
    peer to dial this node back at its listen ports (``swarm.core.reach``) and become a full member (a DHT
    server that serves its own batches and holds hand-offs) once one can; a node with no initial peers
    starts as a full member (it is a swarm's first node)."""
    nat_sharing: Literal["handoff", "relay", "direct"] = "handoff"
    """How a ``client_mode`` node gets its batches to peers that cannot dial it. ``handoff``: push each
    batch to ``handoff_copies`` reachable peers (the swarm's hosts and full members this node reached), which
    hold and serve it (within their quotas);
    ``relay``: become reachable through a libp2p circuit relay (the initial peers); ``direct``: neither
    (only peers already connected to it can pull). See docs/swarm.md, "Ports and NAT"."""
    handoff_copies: int = Field(default=2, ge=1, le=8)
    """``handoff``: how many reachable peers receive each batch."""
    accept_handoffs: bool = True
    """Hold and serve batches that ``client_mode`` peers hand over (never while in client mode itself)."""
    max_handoffs_per_author_epoch: int = Field(default=16, ge=0)
    """Hand-offs held per author and epoch; more are refused."""
    max_handoff_bytes_per_author_epoch: int = Field(default=16 * _MIB, ge=0)
    max_handoff_bytes: int = Field(default=128 * _MIB, ge=0)
    """All hand-offs held at once, every author together; more are refused until old ones expire."""
    identity_path: str = "identity.pem"
    """The node's Ed25519 key file, relative to the run dir (loaded by the daemon, not by ``swarm``)."""
    p2p_identity_path: str | None = None
    """Optional libp2p key file (created if missing; the node resolves a relative path against its run
    dir): keeps this node's ``/p2p/`` id, and with a fixed port in ``host_maddrs`` its whole multiaddr,
    the same across restarts."""
    startup_timeout: float = Field(default=60.0, gt=0)
    """How long p2pd may take to start, and how long ``start(wait=True)`` waits for the DHT."""
    epoch_seconds: float = Field(default=60.0, gt=0)
    key_shards: int = Field(default=4, ge=1, le=4096)
    """DHT keys an epoch's manifests are spread over, by a hash of the author (``swarm.keys``). Swarm-wide,
    like ``epoch_seconds``: every member must use the swarm's value. 4 suits a swarm of tens of nodes;
    a large one uses about one shard per few tens of authors (``docs/scaling.md``)."""
    read_shards: int = Field(default=0, ge=0)
    """How many of the ``key_shards`` this node reads each epoch (drawn at random per epoch); 0 reads them
    all. With all shards read, every node pulls every batch of the swarm, which bounds the swarm's size
    (``docs/scaling.md``); a few shards bound what a node reads and pulls, whatever the size."""
    read_epochs: int = Field(default=2, ge=1, le=16)
    """How many epochs of manifests are read and accepted: the current one and ``read_epochs - 1``
    before it. (How old a received group may be when it is trained on is the node's own setting.)"""
    max_batches_per_peer_epoch: int = Field(default=16, ge=1)
    max_bytes_per_peer_epoch: int = Field(default=64 * _MIB, ge=1)
    """Signed bytes pulled from one author per epoch."""
    max_payload_bytes_per_peer_epoch: int = Field(default=64 * _MIB, ge=1)
    """Expanded (decompressed) bytes decoded for one author per epoch, charged before decoding."""
    max_batch_payload_bytes: int = Field(default=8 * _MIB, ge=1)
    """Largest expanded payload of one batch this node decodes (a batch of 32 reasoning groups x 8
    completions of 512 tokens is about 2 MiB); larger ones are refused before decoding."""
    max_batches_per_epoch: int = Field(default=1024, ge=1)
    """Batches pulled per epoch from all authors together (identities are free: per-author quotas alone
    do not bound a flood)."""
    max_bytes_per_epoch: int = Field(default=256 * _MIB, ge=1)
    """Signed bytes pulled per epoch from all authors together."""
    newcomer_share: float = Field(default=0.5, gt=0, le=1)
    """Share of the global quota and of the pull slots that authors with no accepted batch yet may use."""
    max_peers_tracked: int = Field(default=4096, ge=16)
    """Authors remembered by the peer book (quiet ones are pruned with the epoch window anyway)."""
    ban_seconds: float = Field(default=30.0, gt=0)
    """First ban of a peer that sent invalid data; each further offence multiplies it by ``ban_backoff``."""
    ban_backoff: float = Field(default=2.0, ge=1.0)
    max_ban_seconds: float = Field(default=3600.0, gt=0)
    publish_timeout: float = Field(default=10.0, gt=0)
    """Bound on storing one manifest in the DHT, a failed store tried again within it (``publish`` itself
    only queues)."""
    request_timeout: float = Field(default=5.0, gt=0)
    """Bound on each DHT read, peer dial and batch pull."""
    collect_interval: float = Field(default=0.25, gt=0)
    """How often the DHT is polled for new manifests."""
    manifest_ttl: float = Field(default=180.0, gt=0)
    """How long a published manifest stays in the DHT."""
    max_manifest_ttl: float = Field(default=600.0, gt=0)
    """Ceiling on any record's remaining lifetime; longer-lived records from peers are rejected."""
    join_retry_seconds: float = Field(default=1.0, gt=0)
    join_retry_max_seconds: float = Field(default=30.0, gt=0)
    """Longest wait between two tries to (re)join; never more than a quarter of ``epoch_seconds`` either
    (``retry_cap``), so a node is back within an epoch of its peers' return."""
    pull_timeout: float = Field(default=10.0, gt=0)
    """How long a batch transfer (a pull, a hand-off, serving one) may take to get going; after that it
    must keep ``pull_min_rate``. A transfer of ``n`` bytes therefore takes at most ``pull_timeout + n /
    pull_min_rate``, and a peer that trickles bytes or stalls a stream holds a pull slot about
    ``pull_timeout`` and is banned for it (past ``stall_grace``)."""
    pull_min_rate: float = Field(default=16 * 1024, gt=0)
    """Bytes a second a batch transfer must keep once ``pull_timeout`` has passed: by ``pull_timeout +
    k / pull_min_rate`` seconds it has moved ``k`` bytes. Far below what a lossy home link carries (see
    docs/results/wide-area.md), far above what a peer that holds a slot on purpose sends."""
    stall_grace: int = Field(default=2, ge=0)
    """Stalled pulls forgiven to an established peer (one with an accepted batch) per ``max_ban_seconds``:
    retried instead of banned, so an honest peer on an overloaded machine is not cut off; the same grace
    covers a batch given up as unreachable after ``max_pull_attempts``. Newcomers get none; 0 bans every
    stall at once."""
    max_concurrent_pulls: int = Field(default=8, ge=1)
    max_pulls_per_author: int = Field(default=2, ge=1)
    max_pull_attempts: int = Field(default=3, ge=1)
    max_inbox_batches: int = Field(default=256, ge=1)
    """Collected batches waiting for ``collect()``; the oldest are dropped (and counted) beyond this."""
    max_inbox_bytes: int = Field(default=256 * _MIB, ge=1)
    """Estimated memory of the decoded batches waiting for ``collect()`` (oldest dropped beyond it)."""
    max_publish_queue: int = Field(default=32, ge=1)
    max_held_batches: int = Field(default=512, ge=1)
    """Signed batches kept in memory to serve to peers (own and collected)."""
    max_held_bytes: int = Field(default=128 * _MIB, ge=1)
    """Signed bytes kept in memory to serve to peers; the least recently added go first beyond it."""
    max_dht_store_bytes: int = Field(default=64 * _MIB, ge=1)
    """DHT records this node stores or caches for others, all keys together (accounted by the validator)."""
    max_foreign_dht_bytes: int = Field(default=4 * _MIB, ge=1)
    """Of which records under keys outside this swarm's recent manifest keys."""
    trace_path: str | None = None
    """Optional file (JSON lines, appended) of the network side's events: batches published, accepted,
    rejected and failed, with times (``swarm.trace``); for benchmarks and debugging. Relative to the run
    dir when the node resolves it."""

    @field_validator("swarm_id")
    @classmethod
    def _check_swarm_id(cls, value: str) -> str:
        if not _SWARM_ID_RE.fullmatch(value):
            raise ValueError(
                f"swarm_id {value!r} must be 1-64 chars of letters, digits, '.', '_' or '-' "
                "(starting with a letter or digit)"
            )
        return value

    @field_validator("initial_peers")
    @classmethod
    def _check_initial_peers(cls, value: list[str]) -> list[str]:
        for maddr in value:
            _check_maddr("initial_peers", maddr, need_peer_id=True)
        return value

    @field_validator("host_maddrs")
    @classmethod
    def _check_host_maddrs(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("host_maddrs: give at least one listen address, e.g. /ip4/127.0.0.1/tcp/0")
        for maddr in value:
            _check_maddr("host_maddrs", maddr)
        return value

    @field_validator("announce_maddrs")
    @classmethod
    def _check_announce_maddrs(cls, value: list[str]) -> list[str]:
        for maddr in value:
            _check_maddr("announce_maddrs", maddr, explicit_port=True)
        return value

    @property
    def starts_as_client(self) -> bool:
        """Whether the network side starts in client mode: ``client_mode`` true, or ``auto`` with peers to
        ask (with none, an ``auto`` node is the first of a swarm, and others must be able to join it)."""
        return self.client_mode is True or (self.client_mode == "auto" and bool(self.initial_peers))

    @property
    def retry_cap(self) -> float:
        """The longest wait between two tries to (re)join: ``join_retry_max_seconds``, at most a quarter epoch."""
        return max(self.join_retry_seconds, min(self.join_retry_max_seconds, self.epoch_seconds / 4))

    @model_validator(mode="after")
    def _check_relations(self) -> SwarmSettings:
        problems = []
        if self.manifest_ttl > self.max_manifest_ttl:
            problems.append(
                f"manifest_ttl ({self.manifest_ttl}) must not exceed max_manifest_ttl ({self.max_manifest_ttl})"
            )
        if self.join_retry_max_seconds < self.join_retry_seconds:
            problems.append("join_retry_max_seconds must be >= join_retry_seconds")
        if self.max_ban_seconds < self.ban_seconds:
            problems.append("max_ban_seconds must be >= ban_seconds")
        if problems:
            raise ValueError("; ".join(problems))
        return self
