"""``swarm-node swarm init|sign|verify``: write, sign and check a swarm's descriptor (``swarm.yaml``).

``init`` takes the shared settings and the task set from a config (``configs/swarm-shared.yaml`` holds
the wide-area set), the hosts from ``--host`` (a full multiaddr, or one without ``/p2p/`` whose libp2p key
a ``--host-key`` names: created if missing, then given to that ``swarm-node host``), and signs with the owner's
Ed25519 key (``--key``, created if missing). ``sign`` signs a descriptor again after the owner edited it;
``verify`` checks one as a member would, without pinning anything.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from datetime import datetime, timedelta, timezone
from pathlib import Path

from pydantic import ValidationError

from node.errors import ConfigError
from protocol.descriptor import Scalar, SwarmDescriptor, TaskSet, owner_text
from protocol.errors import DescriptorError, IdentityError
from protocol.identity import Identity

__all__ = ["add_swarm_parser", "cmd_swarm"]

_DEFAULT_DAYS = 90


def add_swarm_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    swarm = sub.add_parser("swarm", help="write, sign and check a swarm's descriptor (swarm.yaml)")
    verbs = swarm.add_subparsers(dest="verb", required=True)
    init = verbs.add_parser("init", help="a new signed descriptor from a config's shared settings")
    init.add_argument("--config", "-c", help="config whose shared settings and tasks the swarm uses "
                      "(e.g. configs/swarm-shared.yaml; defaults apply when omitted)")
    init.add_argument("--id", required=True, dest="swarm_id", help="the swarm id (letters, digits, '.', '_', '-')")
    init.add_argument("--name", help="a human-readable name (default: the id)")
    init.add_argument("--host", action="append", required=True, metavar="MADDR",
                      help="a host's multiaddr (repeat): full (.../p2p/<id>), or without /p2p/ for the host whose "
                           "key --host-key names")
    init.add_argument("--host-key", action="append", default=[], metavar="FILE",
                      help="libp2p key of a host given without /p2p/ (repeat, in the order of those hosts; created if "
                           "missing): that host runs with it (swarm-node host --p2p-key FILE, or RUN_DIR/p2p.key)")
    init.add_argument("--recommend", action="append", default=[], metavar="CLASS:KEY=VALUE[,KEY=VALUE]",
                      help="recommended settings for a hardware class (cpu, gpu-24gb, ...), e.g. "
                           "gpu-24gb:model.name_or_path=smollm2-135m (default: cpu takes the config's model)")
    init.add_argument("--expires-days", type=float, default=_DEFAULT_DAYS, help="valid for this many days "
                      f"(default {_DEFAULT_DAYS})")
    init.add_argument("--key", required=True, help="the owner's Ed25519 key file (created if missing, mode 0600)")
    init.add_argument("--out", default="swarm.yaml", help="the descriptor to write (default swarm.yaml)")
    init.add_argument("--force", action="store_true", help="replace an existing --out")
    init.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. swarm.epoch_seconds=30")
    sign = verbs.add_parser("sign", help="sign a descriptor again (after editing it)")
    sign.add_argument("file", metavar="FILE")
    sign.add_argument("--key", required=True, help="the owner's Ed25519 key file")
    sign.add_argument("--expires-days", type=float, help="also move the expiry to this many days from now")
    verify = verbs.add_parser("verify", help="check a descriptor as a member would (signature, expiry, version)")
    verify.add_argument("source", metavar="FILE_OR_URL")
    verify.add_argument("--swarm-owner", metavar="SHA256:...", help="the owner fingerprint the swarm publishes")


def cmd_swarm(args: argparse.Namespace) -> int:
    return {"init": _init, "sign": _sign, "verify": _verify}[args.verb](args)


def _owner(path: str, *, create: bool) -> Identity:
    try:
        return Identity.load_or_create(path) if create else Identity.load(path)
    except IdentityError as exc:
        raise ConfigError(f"--key: {exc}") from None


def _write(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError as exc:
        raise ConfigError(f"cannot write {path} ({exc.strerror}); choose a writable path") from None


def _hosts(given: list[str], host_keys: list[str]) -> list[str]:
    """Full host addresses: those given without ``/p2p/`` get the peer ids of ``host_keys``, in order (each key
    file created if missing)."""
    from swarm.maddr import multiaddr_problem

    bare = [h for h in given if "/p2p/" not in h]
    if len(bare) != len(host_keys):
        raise ConfigError(f"--host-key: {len(bare)} --host without /p2p/<peer id> but {len(host_keys)} --host-key; give "
                          "one key file per host named without its peer id (created if missing), in the same order")
    peers: list[str] = []
    if bare:
        from swarm import hivemind_lean

        hivemind_lean.load()  # the key's peer id needs hivemind's p2p modules, not torch
        from swarm.p2p_keys import P2pKeyError, ensure_p2p_key

        try:
            peers = [ensure_p2p_key(key) for key in host_keys]
        except P2pKeyError as exc:
            raise ConfigError(f"--host-key: {exc}") from None
    ids = iter(peers)
    hosts = [h if "/p2p/" in h else f"{h.rstrip('/')}/p2p/{next(ids)}" for h in given]
    for host in hosts:
        if (problem := multiaddr_problem(host)) is not None:
            raise ConfigError(f"--host {host}: not a valid multiaddr ({problem}), e.g. /dns4/host.example.org/tcp/31337")
    return hosts


def _recommendations(items: list[str], model: str) -> dict[str, dict[str, Scalar]]:
    from node.config import apply_overrides

    if not items:
        return {"cpu": {"model.name_or_path": model}}
    found: dict[str, dict[str, Scalar]] = {}
    for item in items:
        hardware, sep, rest = item.partition(":")
        if not sep or not rest:
            raise ConfigError(f"--recommend {item!r}: write CLASS:KEY=VALUE, e.g. cpu:model.name_or_path=tiny-base")
        for pair in rest.split(","):
            key = pair.partition("=")[0].strip()
            found.setdefault(hardware, {})[key] = _flat(apply_overrides({}, [pair]), key)
    return found


def _flat(data: dict[str, object], key: str) -> Scalar:
    node: object = data
    for part in key.split("."):
        node = node[part]  # type: ignore[index]
    if not isinstance(node, (bool, int, float, str)):
        raise ConfigError(f"--recommend {key}: a recommended value is a number, a word or true/false")
    return node


def _init(args: argparse.Namespace) -> int:
    from node.config import load_config
    from node.config.join import shared_values, task_config_hash
    from protocol.codec import SCHEMA_VERSION

    out = Path(args.out)
    if out.exists() and not args.force:
        raise ConfigError(f"--out {out} already exists; choose another path or pass --force")
    if args.expires_days <= 0:
        raise ConfigError("--expires-days must be positive")
    cfg = load_config(args.config, [*args.overrides, f"swarm.swarm_id={args.swarm_id}"])
    hosts = _hosts(args.host, args.host_key)
    owner = _owner(args.key, create=True)
    t = cfg.tasks
    try:
        descriptor = SwarmDescriptor(
            swarm_id=cfg.swarm.swarm_id, name=args.name or cfg.swarm.swarm_id, protocol_version=SCHEMA_VERSION,
            hosts=hosts, expires=datetime.now(timezone.utc) + timedelta(days=args.expires_days),
            settings=shared_values(cfg), tasks=TaskSet(source=t.source, datasets=list(t.datasets),
                                                       dataset_configs=dict(t.dataset_configs),
                                                       config_hash=task_config_hash(cfg)),
            recommended_models=_recommendations(args.recommend, cfg.model.name_or_path),
            owner=owner_text(owner.public_key)).sign(owner)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ConfigError(f"swarm init: {'.'.join(map(str, first['loc']))}: {first['msg']}") from None
    _write(out, descriptor.to_yaml())
    print(f"swarm-node swarm: wrote {out}: swarm {descriptor.swarm_id}, {len(hosts)} host(s), expires "
          f"{descriptor.expires:%Y-%m-%d}, owner {descriptor.owner_fingerprint}")
    from node.cli.host import descriptor_url, join_command
    from node.config.host import HostApiConfig

    print(f"swarm-node swarm: the first host runs with: swarm-node host --swarm {out} -c configs/host.yaml "
          "--run-dir runs/host")
    print(f"swarm-node swarm: members join with: {join_command(descriptor_url(hosts[0], HostApiConfig().port or 8780))}")
    print(f"swarm-node swarm: publish the owner fingerprint {descriptor.owner_fingerprint} beside that URL "
          "(--swarm-owner checks it)")
    return 0


def _sign(args: argparse.Namespace) -> int:
    from node.config.join import read_descriptor

    descriptor = read_descriptor(args.file)
    if args.expires_days is not None:
        descriptor = descriptor.model_copy(update={
            "expires": (datetime.now(timezone.utc) + timedelta(days=args.expires_days)).replace(microsecond=0)})
    signed = descriptor.sign(_owner(args.key, create=False))
    _write(Path(args.file), signed.to_yaml())
    print(f"swarm-node swarm: signed {args.file} (swarm {signed.swarm_id}, owner {signed.owner_fingerprint}, "
          f"expires {signed.expires:%Y-%m-%d %H:%M} UTC)")
    return 0


def _verify(args: argparse.Namespace) -> int:
    from node.config.join import fixed_by, known_swarms_path, pinned_owners, read_descriptor

    descriptor = read_descriptor(args.source)
    try:
        descriptor.verify()
        descriptor.check_usable(datetime.now(timezone.utc))
    except DescriptorError as exc:
        raise ConfigError(f"swarm descriptor of {descriptor.swarm_id}: {exc}") from None
    signer = descriptor.owner_fingerprint
    if args.swarm_owner is not None and args.swarm_owner != signer:
        raise ConfigError(f"--swarm-owner: the descriptor is signed by {signer}, not {args.swarm_owner}")
    fixed_by(descriptor)  # every shared setting present, none unknown
    pinned = pinned_owners(known_swarms_path()).get(descriptor.swarm_id)
    pin = "not pinned yet" if pinned is None else ("pinned" if pinned == signer else f"DIFFERENT from the pinned {pinned}")
    lines = [f"swarm     {descriptor.swarm_id} ({descriptor.name}) · wire protocol {descriptor.protocol_version}",
             f"owner     {signer} ({pin})",
             f"expires   {descriptor.expires:%Y-%m-%d %H:%M} UTC",
             f"tasks     {descriptor.tasks.source}: {', '.join(descriptor.tasks.datasets)} "
             f"(config {descriptor.tasks.config_hash})",
             f"shared    {len(descriptor.settings)} settings, e.g. swarm.epoch_seconds="
             f"{descriptor.settings.get('swarm.epoch_seconds')}",
             *[f"host      {h}" for h in descriptor.hosts]]
    print(f"swarm-node swarm: {args.source} is valid", *lines, sep="\n", file=sys.stdout)
    return 0
