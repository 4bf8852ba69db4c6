"""The embedded ``small-base`` model: its figures, a rebuild from the recipe, and the check of a rebuild.

    python scripts/build/build_small_base.py                     # the shipped model's figures (node/sources/assets/small-base)
    python scripts/build/build_small_base.py --out DIR           # rebuild from the recipe into DIR, then compare it
                                                           # with the shipped model (exit 1 if outside margins)
    python scripts/build/build_small_base.py --compare DIR       # compare an earlier rebuild in DIR
    python scripts/build/build_small_base.py --measure 200       # reward of the shipped model on 200 tasks a dataset
    python scripts/build/build_small_base.py --out DIR --seed 1  # a rebuild with another seed (how margins were measured)

Every node runs the shipped folder, so its figures hold on every machine. A rebuild follows the same recipe
(``node.sources.embedded.small_recipe.FULL``), but only this machine reproduces the shipped bytes: other machines'
kernels sum floats in other orders, and training turns that into another model of the same quality.
``compare_builds`` (``small_build.py`` beside this script) says whether a rebuild is one, with margins measured across
builds. To replace the shipped model, rebuild into an empty folder and copy its files over
``node/sources/assets/small-base`` (then update docs/results/small-base-build.md's figures from its ``build_info.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from pathlib import Path

# Idle OpenMP threads sleep instead of spinning: on a shared, oversubscribed CPU spinning threads slow
# every step several-fold. Must be set before torch is imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from node.sources.embedded.catalog import embedded_model  # noqa: E402
from node.sources.embedded.small_recipe import FULL  # noqa: E402
from scripts.lib.small_build import build, compare_builds, measure, reward_table  # noqa: E402  -- beside this script


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="rebuild from the recipe into this (new or empty) folder")
    parser.add_argument("--seed", type=int, help="with --out: the recipe with another seed (not comparable "
                        "with the shipped model by its key; the figures are printed side by side)")
    parser.add_argument("--compare", type=Path, metavar="DIR", help="compare an earlier rebuild with the shipped model")
    parser.add_argument("--measure", type=int, metavar="N", help="measure the shipped model on N held-out tasks "
                        "per dataset")
    return parser.parse_args(argv)


def shipped_folder() -> Path:
    model = embedded_model("small-base")
    if model is None:
        raise SystemExit("small-base is not an embedded model of this checkout")
    return model.path


def load_info(folder: Path) -> dict:
    path = folder / "build_info.json"
    if not path.is_file():
        raise SystemExit(f"{folder} holds no build_info.json: not a finished build")
    loaded: dict = json.loads(path.read_text())
    return loaded


def print_comparison(shipped: dict, rebuilt: dict) -> int:
    print(f"{'':36s} {'shipped':>18s} {'rebuilt':>18s}")
    for key in shipped["sampled_t1"]:
        print(f"{key:36s} greedy {shipped['greedy'][key]['reward']:.3f}  T=1 {shipped['sampled_t1'][key]['reward']:.3f}"
              f"   greedy {rebuilt['greedy'][key]['reward']:.3f}  T=1 {rebuilt['sampled_t1'][key]['reward']:.3f}")
    print(f"{'final loss':36s} {shipped['final_loss']:18.4f} {rebuilt['final_loss']:18.4f}")
    problems = compare_builds(shipped, rebuilt)
    for line in problems:
        print("OUTSIDE MARGIN: " + line)
    if not problems:
        print("the rebuild is within the margins of the shipped model")
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    shipped_dir = shipped_folder()
    shipped = load_info(shipped_dir)
    if args.out is not None:
        if args.out.exists() and any(args.out.iterdir()):
            print(f"--out {args.out} is not empty: give a new folder", file=sys.stderr)
            return 2
        recipe = FULL if args.seed is None else replace(FULL, seed=args.seed)
        rebuilt = build(recipe, args.out)
        return print_comparison(shipped, rebuilt)
    if args.compare is not None:
        return print_comparison(shipped, load_info(args.compare))
    print(f"{FULL.name}: {shipped['parameters']:,} parameters, recipe {shipped['recipe_key']}, built with torch "
          f"{shipped['torch_version']} ({shipped['cpu_capability']}) in {shipped['total_seconds']} s "
          f"({shipped['cpu_seconds']} CPU-seconds, load average then {shipped['load_average_at_end']})")
    for line in reward_table(shipped):
        print(line)
    if args.measure:
        measured = measure(shipped_dir, FULL, args.measure)
        print(f"measured on {args.measure} held-out tasks per dataset (os.getloadavg {os.getloadavg()}):")
        for line in reward_table(measured):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
