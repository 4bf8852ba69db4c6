"""What the new-author probation would have done on a finished sharing run: replayed from its screen figures.

Usage: python scripts/lab/replay_probation.py RUN.json [RUN.json ...] [--probation 16] [--pause-share 0.2]

A ``scripts/bench/bench_sapo.py`` run keeps, for every step, each node's running screen figures of each author
it judged that step (``screen_figures``: step, node, author, and the author's completions judged, failed, and
failed by the policy's read alone). With ``ingest.screen_probation_first`` an author's first ``--probation``
completions judged are held to the probation: ``--pause-share`` of them failing pauses it (4 of 16 at the
defaults), counted by whole steps, the step that reaches the count the last; with
``ingest.screen_probation_base`` only the failures the frozen base's read fails too count. Until that verdict
would pause an author, a run with the keys on is the run without them step for step (the probation changes
nothing but the pause), so replaying the figures says exactly whether and when it would have paused each
honest peer of the run. Printed: for each node and author, the completions of its probation, their failures
(all, and the base's), and the step each key would have paused it at ("-": never); then the count of authors
each would have paused. A run that paused an author itself is named: its figures after that pause are not the
keys' path.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path


def replay(figures: list, probation: int, share: float) -> dict[tuple[int, int], dict]:
    """For each (node, author): its probation's judged and failed counts (all; the base's) and the step each
    count would pause it at (None: never)."""
    need = math.ceil(share * probation)
    out: dict[tuple[int, int], dict] = {}
    last: dict[tuple[int, int], tuple[int, int, int]] = {}
    for step, node, author, f in sorted(figures, key=lambda e: (e[0], e[1], e[2])):
        key = (int(node), int(author))
        judged, failed, policy = int(f["judged"]), int(f["failed"]), int(f.get("policy_failed", 0))
        was = last.get(key, (0, 0, 0))
        last[key] = (judged, failed, policy)
        n, fail, pol = judged - was[0], failed - was[1], policy - was[2]
        r = out.setdefault(key, {"judged": 0, "failed": 0, "base_failed": 0, "every": None, "base": None,
                                 "done": False})
        if r["done"] or n <= 0:
            continue
        r["judged"] += n
        r["failed"] += fail
        r["base_failed"] += fail - pol
        if r["every"] is None and r["failed"] >= need:
            r["every"] = int(step)
        if r["base"] is None and r["base_failed"] >= need:
            r["base"] = int(step)
        if r["judged"] >= probation:
            r["done"] = True
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, metavar="RUN.json")
    p.add_argument("--probation", type=int, default=16, help="ingest.screen_probation")
    p.add_argument("--pause-share", type=float, default=0.2, help="ingest.screen_pause_share")
    args = p.parse_args()
    if args.probation < 1 or not 0 < args.pause_share <= 1:
        p.error("--probation must be at least 1 and --pause-share in (0, 1]")
    paused = {"every": 0, "base": 0}
    authors = 0
    for path in args.runs:
        try:
            run = json.loads(path.read_text())
            figures = run["screen_figures"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"{path}: not a bench_sapo run with screen figures ({exc})", file=sys.stderr)
            return 2
        print(f"{path.name}: {len(figures)} figures; the run's own pauses: {run.get('screen_pauses') or 'none'}")
        print("| node | author | probation judged | failed | of them the base's | paused, every failure | "
              "paused, the base's |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for (node, author), r in sorted(replay(figures, args.probation, args.pause_share).items()):
            authors += 1
            for key in paused:
                paused[key] += r[key] is not None
            print(f"| {node} | {author} | {r['judged']} | {r['failed']} | {r['base_failed']} | "
                  f"{r['every'] if r['every'] is not None else '-'} | {r['base'] if r['base'] is not None else '-'} |")
    print(f"authors: {authors}; paused by the new-author probation counting every failure: {paused['every']}; "
          f"counting the base's: {paused['base']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
