"""``swarm-node start --swarm FILE|URL``: a member's config from its swarm's signed descriptor.

The descriptor (``protocol.descriptor``) fixes every setting that changes DHT keys, what a peer's
record or batch must pass, what counts as an offence, or how a peer's rollouts are re-scored
(``SHARED_SETTINGS``, the swarm id and the task set). A member's own config may leave those out or give
the same values; a different value is refused with one line naming the key: it would fork the swarm
silently (a node with another epoch length joins the DHT and never sees a batch). Everything else stays
the member's: model, adapter, generation backend, NAT settings, time-outs of its own DHT calls.

Trust, as ssh does it for hosts: the descriptor must be signed by its ``owner`` key; the owner's
fingerprint is pinned per swarm id in ``known_swarms`` (``$SWARM_NODE_KNOWN_SWARMS``, else
``$XDG_CONFIG_HOME/swarm-node/known_swarms``) on first use, or given with ``--swarm-owner``; a descriptor
of that swarm signed by another key is refused. Expired descriptors and other protocol versions too.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from node.errors import ConfigError
from protocol.descriptor import MAX_DESCRIPTOR_BYTES, Scalar, SwarmDescriptor, parse_descriptor
from protocol.errors import DescriptorError

__all__ = ["KNOWN_SWARMS_ENV", "REMEMBERED_PEERS", "SAVED_DESCRIPTOR", "SHARED_SETTINGS", "apply_descriptor", "get_key",
           "hardware_class", "known_swarms_path", "listed_members", "pinned_owners", "read_descriptor",
           "read_descriptor_text", "remember_peers", "remembered_peers", "save_descriptor", "set_key", "shared_values",
           "trust_descriptor", "with_members"]

KNOWN_SWARMS_ENV = "SWARM_NODE_KNOWN_SWARMS"
FETCH_TIMEOUT = 15.0
"""Seconds a descriptor URL may take to answer completely."""
REMEMBERED_PEERS = "known_peers.txt"
"""Run-dir file of the peers a member met, one multiaddr a line: its bootstrap when every host is gone."""
MAX_REMEMBERED_PEERS = 32
SAVED_DESCRIPTOR = "swarm.yaml"
"""Run-dir copy of the descriptor a member joined with: what it starts from when the URL does not answer."""
MEMBER_LINE = "# member: "
MEMBERS_HEADER = ("# Members that accept connections, as a host of the swarm reached them (not signed): dialed with the "
                  "hosts when joining, so a member joins while every host is down")
MAX_LISTED_MEMBERS = 16

SHARED_SETTINGS: dict[str, str] = {
    "swarm.epoch_seconds": "keys: manifests are filed under the epoch",
    "swarm.key_shards": "keys: an author's shard",
    "swarm.read_epochs": "validation: older batches are stale",
    "swarm.manifest_ttl": "validation: a record's lifetime",
    "swarm.max_manifest_ttl": "validation: the longest record lifetime accepted",
    "swarm.max_batches_per_peer_epoch": "validation: a quota, and the pace an author publishes at",
    "swarm.max_bytes_per_peer_epoch": "validation: a quota",
    "swarm.max_payload_bytes_per_peer_epoch": "validation: a quota",
    "swarm.max_batch_payload_bytes": "validation: the largest batch accepted",
    "swarm.max_handoffs_per_author_epoch": "validation: what a holder keeps for a member behind NAT",
    "swarm.max_handoff_bytes_per_author_epoch": "validation: what a holder keeps for a member behind NAT",
    "swarm.request_timeout": "offences: no byte for this long is a stall",
    "swarm.pull_timeout": "offences: a transfer's start",
    "swarm.pull_min_rate": "offences: a transfer's pace",
    "swarm.stall_grace": "offences: stalls forgiven",
    "swarm.max_pull_attempts": "offences: failed pulls before unreachable",
    "generation.max_new_tokens": "re-scoring: longer completions are too_long",
    "ingest.min_logprob": "offences: bad_logprobs",
    "ingest.score_timeout": "offences: score_timeout",
    "ingest.max_seeds_per_peer_epoch": "re-scoring: seed_cap",
}
"""Config keys every member takes from the descriptor's ``settings``, with why they must agree. The swarm
id (``swarm.swarm_id``) and the task set (``tasks.source``, ``tasks.datasets``, ``tasks.dataset_configs``)
come from their own fields."""
_TASK_KEYS = ("tasks.source", "tasks.datasets", "tasks.dataset_configs")


# -- reading and trusting a descriptor ------------------------------------------------------------------

def read_descriptor(source: str, *, timeout: float | None = None) -> SwarmDescriptor:
    """The descriptor at ``source`` (a file, or an http(s) URL fetched within ``timeout``, default
    ``FETCH_TIMEOUT``, and ``MAX_DESCRIPTOR_BYTES``), parsed; not yet trusted (``trust_descriptor``)."""
    return read_descriptor_text(source, timeout=timeout)[0]


def read_descriptor_text(source: str, *, timeout: float | None = None) -> tuple[SwarmDescriptor, str]:
    """``read_descriptor``, and the text it was read from (its comment lines may list members: ``listed_members``)."""
    if source.startswith(("http://", "https://")):
        raw = fetch(source, timeout=timeout or FETCH_TIMEOUT, max_bytes=MAX_DESCRIPTOR_BYTES)
    else:
        try:
            with open(source, "rb") as handle:
                raw = handle.read(MAX_DESCRIPTOR_BYTES + 1)
        except OSError as exc:
            raise ConfigError(f"--swarm {source}: cannot read it ({exc.strerror}); give the swarm's descriptor "
                              "file or its http(s) URL") from None
    try:
        return parse_descriptor(raw), raw.decode("utf-8", errors="replace")
    except DescriptorError as exc:
        raise ConfigError(f"--swarm {source}: {exc}") from None


def listed_members(text: str) -> list[str]:
    """The members a descriptor's text lists in comment lines (``# member: MADDR``: what a host adds to the
    descriptor it serves, the members it reached that accept connections), at most ``MAX_LISTED_MEMBERS``, each a
    full multiaddr (other lines are skipped). Unsigned hints: a member dials them beside the hosts, never
    instead of them, so one that starts while every host is down still finds the swarm."""
    from swarm.maddr import multiaddr_problem

    found = []
    for line in text.splitlines():
        if not line.startswith(MEMBER_LINE):
            continue
        maddr = line[len(MEMBER_LINE):].strip()
        if "/p2p/" in maddr and len(maddr) <= 512 and multiaddr_problem(maddr) is None:
            found.append(maddr)
    return list(dict.fromkeys(found))[:MAX_LISTED_MEMBERS]


def with_members(text: str, maddrs: list[str]) -> str:
    """A descriptor's ``text`` with its member lines (``listed_members``) replaced by ``maddrs`` (at most
    ``MAX_LISTED_MEMBERS``); the signed content is untouched (comments are not part of it)."""
    kept = [line for line in text.splitlines() if not line.startswith((MEMBER_LINE, MEMBERS_HEADER))]
    members = list(dict.fromkeys(maddrs))[:MAX_LISTED_MEMBERS]
    block = [MEMBERS_HEADER, *(MEMBER_LINE + m for m in members)] if members else []
    return "\n".join([*kept, *block]) + "\n"


class FetchError(ConfigError):
    """A descriptor URL did not answer (a server that answered with something else is a plain ``ConfigError``)."""


def fetch(url: str, *, timeout: float, max_bytes: int) -> bytes:
    """The body of ``url``: at most ``max_bytes``, all of it within ``timeout`` seconds (one line if not)."""
    deadline = time.monotonic() + timeout
    body = bytearray()
    try:
        request = urllib.request.Request(url, headers={"User-Agent": "swarm-node"})
        with urllib.request.urlopen(request, timeout=timeout) as answer:  # noqa: S310 (http(s) only, checked above)
            while len(body) <= max_bytes:
                if time.monotonic() > deadline:
                    raise TimeoutError
                chunk = answer.read1(64 * 1024)
                if not chunk:
                    break
                body += chunk
    except urllib.error.HTTPError as exc:
        raise ConfigError(f"--swarm {url}: the server answered {exc.code} {exc.reason}") from None
    except (TimeoutError, OSError, urllib.error.URLError, ValueError) as exc:
        reason = "no complete answer within " + f"{timeout:g} s" if isinstance(exc, TimeoutError) else (
            str(getattr(exc, "reason", "") or exc) or type(exc).__name__)
        raise FetchError(f"--swarm {url}: cannot fetch it ({reason}); check the URL, or pass a saved copy "
                         "of the descriptor") from None
    if len(body) > max_bytes:
        raise ConfigError(f"--swarm {url}: the answer is larger than a descriptor may be ({max_bytes} bytes)")
    return bytes(body)


def known_swarms_path() -> Path:
    """Where owner fingerprints are pinned: ``$SWARM_NODE_KNOWN_SWARMS``, else under the user's config dir."""
    if os.environ.get(KNOWN_SWARMS_ENV):
        return Path(os.environ[KNOWN_SWARMS_ENV])
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "swarm-node" / "known_swarms"


def pinned_owners(path: Path) -> dict[str, str]:
    pins: dict[str, str] = {}
    with contextlib.suppress(FileNotFoundError):
        for line in path.read_text(encoding="utf-8").splitlines():
            fields = line.partition("#")[0].split()
            if len(fields) == 2:
                pins[fields[0]] = fields[1]
    return pins


def trust_descriptor(descriptor: SwarmDescriptor, *, owner: str | None = None, known: Path | None = None,
                     now: datetime | None = None) -> list[str]:
    """Check signature, owner pin, expiry and protocol version (``ConfigError``, one line, if one fails);
    pin the owner on first use. Returns what to tell the user."""
    try:
        descriptor.verify()
        descriptor.check_usable(now or datetime.now(timezone.utc))
    except DescriptorError as exc:
        raise ConfigError(f"swarm descriptor of {descriptor.swarm_id}: {exc}") from None
    path = known or known_swarms_path()
    pinned = pinned_owners(path).get(descriptor.swarm_id)
    signer = descriptor.owner_fingerprint
    if owner is not None and owner != signer:
        raise ConfigError(f"--swarm-owner: the descriptor of {descriptor.swarm_id} is signed by {signer}, not {owner}; "
                          "it is not the swarm you meant to join")
    if pinned is not None and pinned != signer and owner is None:
        raise ConfigError(f"swarm descriptor of {descriptor.swarm_id}: signed by {signer}, but {pinned} is pinned for "
                          f"this swarm in {path}; if its owner really changed keys, delete that line (or pass "
                          f"--swarm-owner {signer})")
    if pinned == signer:
        return []
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [ln for ln in (path.read_text(encoding="utf-8").splitlines() if path.exists() else [])
             if ln.partition("#")[0].split()[:1] != [descriptor.swarm_id]]
    path.write_text("".join(f"{ln}\n" for ln in [*lines, f"{descriptor.swarm_id} {signer}"]), encoding="utf-8")
    how = "as given with --swarm-owner" if owner is not None else "first use: compare it with what the swarm publishes"
    return [f"swarm {descriptor.swarm_id} is owned by {signer}; pinned in {path} ({how})"]


# -- the member's config -----------------------------------------------------------------------------------

def get_key(data: dict[str, Any], key: str) -> tuple[bool, Any]:
    """``(whether the raw config sets key, its value)`` for a dotted key such as ``swarm.epoch_seconds``."""
    node: Any = data
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def set_key(data: dict[str, Any], key: str, value: Any) -> None:
    """Set a dotted key in a raw config, making its sections as needed."""
    *sections, last = key.split(".")
    node = data
    for part in sections:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{part}: is a value, but the swarm descriptor sets {key}; make {part} a section")
        node = child
    node[last] = value


def fixed_by(descriptor: SwarmDescriptor) -> dict[str, Any]:
    """Every config key the descriptor fixes, with its value (``ConfigError`` if it lacks a shared setting
    or names one this release does not know)."""
    unknown = sorted(set(descriptor.settings) - set(SHARED_SETTINGS))
    if unknown:
        raise ConfigError(f"swarm descriptor of {descriptor.swarm_id}: settings.{unknown[0]} is not a setting this "
                          "swarm-node shares (a newer release's?); install the release the swarm names")
    missing = [key for key in SHARED_SETTINGS if key not in descriptor.settings]
    if missing:
        raise ConfigError(f"swarm descriptor of {descriptor.swarm_id}: settings lacks {missing[0]}, which every "
                          "member must share; its owner adds it and signs again")
    t = descriptor.tasks
    return {"swarm.swarm_id": descriptor.swarm_id, "tasks.source": t.source, "tasks.datasets": list(t.datasets),
            "tasks.dataset_configs": dict(t.dataset_configs), **descriptor.settings}


def apply_descriptor(data: dict[str, Any], descriptor: SwarmDescriptor, *, hardware: str | None,
                     section: str | None = None) -> list[str]:
    """Put the descriptor's settings into a member's raw config (``load_config_data``'s mapping) in place:
    a key the member set to another value is a ``ConfigError`` naming it; the recommended model of
    ``hardware`` fills what the member left unset (None: no recommendation). ``section``: only the keys of
    that section (``swarm``: a host's). Returns what to tell the user."""
    fixed = fixed_by(descriptor)
    for key, value in fixed.items():
        if section is not None and not key.startswith(section + "."):
            continue
        present, local = get_key(data, key)
        if present and local != value:
            raise ConfigError(f"{key}={local!r} is set locally, but the swarm {descriptor.swarm_id} sets {value!r} for "
                              f"every member ({SHARED_SETTINGS.get(key, 'shared')}); remove it from your config "
                              "and overrides")
        set_key(data, key, value)
    notes = []
    recommended = descriptor.recommended_models.get(hardware, {}) if hardware is not None else {}
    for key, value in recommended.items():
        if key in fixed:
            raise ConfigError(f"swarm descriptor of {descriptor.swarm_id}: recommended_models.{hardware} sets {key}, "
                              "a shared setting; its owner moves it to settings")
        if not get_key(data, key)[0]:
            set_key(data, key, value)
            notes.append(f"{key}={value} (recommended by the swarm for {hardware})")
    if notes:
        return ["taking " + ", ".join(notes)]
    return []


def shared_values(cfg: Any) -> dict[str, Scalar]:
    """The ``SHARED_SETTINGS`` of a validated ``NodeConfig``: what ``swarm init`` writes into a descriptor."""
    values: dict[str, Scalar] = {}
    for key in SHARED_SETTINGS:
        node = cfg
        for part in key.split("."):
            node = getattr(node, part)
        values[key] = node
    return values


def hardware_class(classes: list[str]) -> str:
    """Which of ``classes`` (``cpu``, ``gpu-<GiB>gb``) this machine is: the largest GPU class whose memory
    the first GPU has (``nvidia-smi``; no torch needed), else ``cpu``."""
    memory_gb = 0.0
    if shutil.which("nvidia-smi"):
        with contextlib.suppress(OSError, subprocess.SubprocessError, ValueError):
            out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=5, check=True).stdout
            memory_gb = float(out.split()[0]) / 1024
    fitting = [(int(c[4:-2]), c) for c in classes if c.startswith("gpu-") and int(c[4:-2]) <= memory_gb]
    return max(fitting)[1] if fitting else "cpu"


def task_config_hash(cfg: Any) -> str:
    """The config hash of the task source ``cfg.tasks`` builds (what a peer's task references must name)."""
    from node.tasks.registry import build_task_source

    t = cfg.tasks
    return build_task_source(t.source, list(t.datasets), None, 0, **t.source_options(cfg.model.chat_template)).config_hash


def join_config(config: str | None, overrides: list[str], source: str, *, owner: str | None,
                extra_peers: list[str]) -> tuple[Any, list[str], SwarmDescriptor, list[str]]:
    """A member's validated ``NodeConfig`` from its config file and overrides plus the swarm's descriptor at
    ``source``, with the swarm's hosts and ``extra_peers`` as initial peers (the peers it remembers in its
    run dir are the daemon's to dial beside them: ``node.run.daemon``, never taken for hosts); the
    lines to tell the user; the descriptor and the members its text lists (``listed_members``;
    ``save_descriptor`` keeps both in the run dir, where the daemon dials the members too). When ``source``
    is a URL that does not answer (every host down), the copy saved in the run dir at an earlier start is
    used instead, checked as the original was. Every mistake is one ``ConfigError`` line."""
    from node.config import NodeConfig, load_config_data, resolve_api, validate_config, with_initial_peers
    from swarm.maddr import multiaddr_problem

    data = load_config_data(config, overrides)
    run_dir = Path(str(get_key(data, "run_dir")[1] or NodeConfig.model_fields["run_dir"].default))
    notes: list[str] = []
    try:
        descriptor, text = read_descriptor_text(source)
    except FetchError:
        saved = run_dir / SAVED_DESCRIPTOR
        if not saved.is_file():
            raise
        descriptor, text = read_descriptor_text(str(saved))
        notes.append(f"{source} does not answer; joining with the copy of the descriptor saved in {saved} at an "
                     "earlier start, through the peers this node remembers")
    notes += trust_descriptor(descriptor, owner=owner)
    for host in descriptor.hosts:
        if (problem := multiaddr_problem(host)) is not None:
            raise ConfigError(f"swarm descriptor of {descriptor.swarm_id}: hosts: {host!r} is not a valid multiaddr "
                              f"({problem}); its owner fixes it and signs again")
    notes += apply_descriptor(data, descriptor, hardware=hardware_class(list(descriptor.recommended_models)))
    cfg = validate_config(data)
    resolve_api(cfg)
    own_hash = task_config_hash(cfg)
    if own_hash != descriptor.tasks.config_hash:
        raise ConfigError(f"tasks: this node's {cfg.tasks.source} tasks have config hash {own_hash}, the swarm's "
                          f"{descriptor.tasks.config_hash} (another task generator or library version); install the "
                          "swarm-node release (and reasoning-gym version) the swarm uses")
    peers = list(dict.fromkeys([*extra_peers, *cfg.swarm.initial_peers, *descriptor.hosts]))
    cfg = with_initial_peers(cfg, peers)
    others = len(peers) - len(descriptor.hosts)
    members = [m for m in listed_members(text) if m not in peers]
    remembered = [p for p in _known_peers(cfg.run_dir) if p not in peers and p not in members]  # dialed too (daemon)
    notes.append(f"joining swarm {descriptor.swarm_id} ({descriptor.name}) through {len(descriptor.hosts)} host(s)"
                 f"{f' and {others} other peer(s)' if others > 0 else ''}"
                 f"{f' and the {len(remembered)} peer(s) it remembers' if remembered else ''}"
                 f"{f' and {len(members)} member(s) the descriptor lists' if members else ''}"
                 f"; descriptor valid until {descriptor.expires:%Y-%m-%d %H:%M} UTC")
    return cfg, notes, descriptor, members


def save_descriptor(run_dir: str | os.PathLike[str], descriptor: SwarmDescriptor,
                    members: list[str] | None = None) -> None:
    """Keep the descriptor a member joined with in its run dir (atomically), with the members it listed: its way
    in when no host answers, and a copy to hand a newcomer."""
    path = Path(run_dir) / SAVED_DESCRIPTOR
    tmp = path.with_suffix(".tmp")
    tmp.write_text(with_members(descriptor.to_yaml(), members or []), encoding="utf-8")
    os.replace(tmp, path)


# -- peers met: a member's bootstrap when every host is gone ----------------------------------------------

def _known_peers(run_dir: str | os.PathLike[str]) -> list[str]:
    with contextlib.suppress(OSError):
        text = (Path(run_dir) / REMEMBERED_PEERS).read_text(encoding="utf-8")
        return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    return []


def remembered_peers(run_dir: str | os.PathLike[str]) -> list[str]:
    """The peers a member dials beside its initial ones: those saved by ``remember_peers`` (the peers it
    reached), then the members its saved descriptor lists (``listed_members``); empty if none."""
    listed: list[str] = []
    with contextlib.suppress(OSError):
        listed = listed_members((Path(run_dir) / SAVED_DESCRIPTOR).read_text(encoding="utf-8", errors="replace"))
    return list(dict.fromkeys([*_known_peers(run_dir), *listed]))


def remember_peers(run_dir: str | os.PathLike[str], maddrs: list[str]) -> None:
    """Save the peers met (newest first, at most ``MAX_REMEMBERED_PEERS``, atomically)."""
    kept = list(dict.fromkeys([*maddrs, *_known_peers(run_dir)]))[:MAX_REMEMBERED_PEERS]
    path = Path(run_dir) / REMEMBERED_PEERS
    tmp = path.with_suffix(".tmp")
    tmp.write_text("# peers this node met; used to join again when every host of the swarm is gone\n"
                   + "".join(f"{m}\n" for m in kept), encoding="utf-8")
    os.replace(tmp, path)
