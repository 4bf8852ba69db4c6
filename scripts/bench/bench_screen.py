"""What reading every peer completion with the node's own model costs a step (ingest.screen).

Usage: python scripts/bench/bench_screen.py [--config configs/smollm2-swarm.yaml] [--steps 8] [--threads 2]
                                            [--arm NAME:key=value,...] [key=value ...]

Two victims of the same config and seed, one with the screen on (the default) and one with it off, members of
one in-memory swarm with an honest peer of the same config: every batch the peer publishes reaches both, so
both ingest the same peer groups. The three nodes step in turn (peer, screened, unscreened), so the machine's
load falls on both victims alike; printed: each victim's median step, training and exchange seconds (the exchange:
publishing, ingestion, and the frozen base's read of the peer groups the step trains on), and the ratio of the
median steps; then each step's seconds and peer groups trained on side by side, with the screened victim's
base reads (own completions for the profile, peer completions the loss pushes up: rows and seconds), and the
ratio over the steps while the profile fills (the base reads more own completions than
``ingest.screen_profile_rows``) and over those after (the reads' medians and means: with
``ingest.screen_profile_every`` above 1 the own reads come every few steps), and its bounds after the last step.
Each ``--arm NAME:key=value,...`` adds a screened victim with those keys (``--arm
whole:ingest.screen_prefix_cache=false``: the base reading every prompt whole), stepped and reported beside the
others, its ratios against the unscreened victim.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/smollm2-swarm.yaml")
    p.add_argument("--steps", type=int, default=8, help="steps measured (after one warm-up step)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--arm", action="append", default=[], metavar="NAME:key=value,...",
                   help="another screened victim, with these keys set (repeatable)")
    p.add_argument("overrides", nargs="*", metavar="key=value")
    args = p.parse_args()
    arms = {}
    for text in args.arm:
        name, sep, keys = text.partition(":")
        if not sep or not name or name in ("screen", "no screen") or name in arms or not keys:
            p.error(f"--arm {text!r}: expected NAME:key=value,... with a new NAME")
        arms[name] = keys.split(",")
    torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging

    from node.config import load_config
    from node.run.node import Node
    from swarm.memory import InMemoryHub

    hf_logging.disable_progress_bar()
    hub = InMemoryHub()
    common = ["train.eval_every=0", "train.checkpoint_every=100000", f"train.steps={args.steps + 1}",
              *args.overrides]
    with tempfile.TemporaryDirectory(prefix="bench_screen_") as work:
        def node(name: str, seed: int, *extra: str) -> Node:
            cfg = load_config(ROOT / args.config, [*common, f"seed={seed}", f"run_dir={work}/{name}", *extra])
            n = Node(cfg, show_progress=False, transport=hub.join)
            n.setup()
            return n

        peer = node("peer", 1)
        victims = {"screen": node("screen", 0), "no screen": node("plain", 0, "ingest.screen=false")}
        for i, (name, keys) in enumerate(arms.items()):
            victims[name] = node(f"arm{i}", 0, *keys)
        records: dict[str, list[dict]] = {k: [] for k in victims}
        load = [os.getloadavg()[0]]
        try:
            for step in range(args.steps + 1):
                peer.train_step()
                for name, victim in victims.items():
                    record = victim.train_step()
                    if step > 0:
                        records[name].append(record)
                hub.epoch += 1
        finally:
            for n in (peer, *victims.values()):
                n.close()
        load.append(os.getloadavg()[0])
    med = {k: statistics.median(r["step_seconds"] for r in rs) for k, rs in records.items()}
    ing = {k: statistics.median(r.get("ingest_seconds", 0.0) for r in rs) for k, rs in records.items()}
    train = {k: statistics.median(r.get("train_seconds", 0.0) for r in rs) for k, rs in records.items()}
    exchange = {k: statistics.median(r.get("exchange_seconds", 0.0) for r in rs) for k, rs in records.items()}
    peer_groups = {k: statistics.fmean(r["n_peer_groups"] for r in rs) for k, rs in records.items()}
    print(f"bench_screen: {args.config}, {args.steps} steps, load {load[0]:.1f} -> {load[1]:.1f}")
    print("| victim | median step s | median training s | median exchange s (ingestion s) | peer groups a step | "
          "tokens masked |")
    print("| --- | --- | --- | --- | --- | --- |")
    for k in victims:
        masked = records[k][-1].get("screen_tokens_masked", 0)
        print(f"| {k} | {med[k]:.2f} | {train[k]:.2f} | {exchange[k]:.2f} ({ing[k]:.3f}) | {peer_groups[k]:.2f} | "
              f"{masked} |")
    screened = [k for k in victims if k != "no screen"]
    for k in screened:
        print(f"step ratio, {k} / no screen: {med[k] / med['no screen']:.3f}")
    for k in screened:
        _by_step(k, records[k], records["no screen"], victims[k].cfg.ingest.screen_profile_rows)
    return 0


def _by_step(name: str, screened: list[dict], plain: list[dict], rows: int) -> None:
    """One screened victim's steps beside the unscreened one's, with the base's reads, and the step ratio while
    its profile fills (the base reading more own completions than ``rows``) and after."""
    print(f"\n{name}:")
    print("| step | screened s | unscreened s | peer groups trained on | own rows read | own read s | peer rows read "
          "| peer read s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for k, (a, b) in enumerate(zip(screened, plain), start=2):
        print(f"| {k} | {a['step_seconds']:.2f} | {b['step_seconds']:.2f} | {a['n_peer_groups']} / "
              f"{b['n_peer_groups']} | {a.get('screen_read_own_rows', 0)} | "
              f"{a.get('screen_read_own_seconds', 0.0):.2f} | {a.get('screen_read_peer_rows', 0)} | "
              f"{a.get('screen_read_peer_seconds', 0.0):.2f} |")
    for phase, keep in (("profile filling", lambda n: n > rows), ("profile full", lambda n: n <= rows)):
        pairs = [(a, b) for a, b in zip(screened, plain) if keep(a.get("screen_read_own_rows", 0))]
        if pairs:
            ratio = statistics.median(a["step_seconds"] for a, _ in pairs) / statistics.median(
                b["step_seconds"] for _, b in pairs)
            own = [a.get("screen_read_own_seconds", 0.0) for a, _ in pairs]
            peer = [a.get("screen_read_peer_seconds", 0.0) for a, _ in pairs]
            print(f"{phase}: {len(pairs)} steps, step ratio {ratio:.3f}, base reads a step (median; mean) "
                  f"{statistics.median(own):.2f}; {statistics.fmean(own):.2f} s own, "
                  f"{statistics.median(peer):.2f}; {statistics.fmean(peer):.2f} s peer; of the unscreened median step "
                  f"{statistics.median(b['step_seconds'] for _, b in pairs):.2f} s")
    last = screened[-1]
    print(f"bounds at the end: span floor {last.get('screen_span_floor')}, sequence floors "
          f"{last.get('screen_sequence_floor')}, length bounds {last.get('screen_length_bound')}")


if __name__ == "__main__":
    raise SystemExit(main())
