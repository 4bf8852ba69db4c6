"""Build (or reuse) the embedded ``small-base`` model and print its measured reward.

    python scripts/build_small_base.py                  # build once into the cache, or reuse it; print figures
    python scripts/build_small_base.py --out DIR        # a fresh build into DIR (the cache untouched)
    python scripts/build_small_base.py --measure 200    # reward of the cached model on 200 tasks a dataset
    python scripts/build_small_base.py --where          # print the cache folder and exit

The node builds the same cached folder by itself the first time a config names ``small-base``; this
script does it ahead of time and shows the figures. The recipe, the data and the training are in
``node.policy.small_build``; the cache is ``~/.cache/swarm-node/`` (``$SWARM_NODE_CACHE`` moves it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

# Idle OpenMP threads sleep instead of spinning: on a shared, oversubscribed CPU spinning threads slow
# every step several-fold. Must be set before torch is imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from node.policy.small_build import build, ensure_built, measure, reward_table  # noqa: E402
from node.policy.small_recipe import FULL, cached_path  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="build into this folder (a fresh build, not the cache)")
    parser.add_argument("--measure", type=int, metavar="N",
                        help="measure the built model on N held-out tasks per dataset (no build if cached)")
    parser.add_argument("--where", action="store_true", help="print the cache folder of the recipe and exit")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.where:
        print(cached_path(FULL))
        return 0
    if args.out is not None:
        if args.out.exists() and any(args.out.iterdir()):
            print(f"--out {args.out} is not empty: give a new folder", file=sys.stderr)
            return 2
        info = build(FULL, args.out)
        path = args.out
    else:
        path = ensure_built(FULL)
        info = json.loads((path / "build_info.json").read_text())
        print(f"{FULL.name}: {path} ({info['parameters']:,} parameters, built in {info['total_seconds']}s, "
              f"load average then {info['load_average_at_end']})")
        for line in reward_table(info):
            print(line)
    if args.measure:
        measured = measure(path, FULL, args.measure)
        print(f"measured on {args.measure} held-out tasks per dataset (os.getloadavg {os.getloadavg()}):")
        for line in reward_table(measured):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
