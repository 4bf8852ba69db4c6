"""A ReMix node among LoRA nodes on another task mix: does routing keep peers' tasks from overwriting the
node's own?

Usage:
  python scripts/experiments/remix_swarm.py run --focus {remix,lora} --seed S [--peers 2] [--steps 100]
                                            [--remix-lr LR] [--eval-every 25] [--eval-size 128]
                                            [--out runs/remix_swarm] [--threads 1] [--extra key=value ...]
  python scripts/experiments/remix_swarm.py report [--out runs/remix_swarm]

Nodes in one process over an in-memory hub (the swarm's exchange: signing, verification, ingest and
re-scoring, without a network), on ``configs/small-silo.yaml`` (small-base; calendar_arithmetic and
propositional_logic, both in every node's task source and held-out set). Node 0, the focus, samples its
own groups on calendar_arithmetic only and takes peers' groups on top (its 16 own and up to 8 peer groups
a step); its ``--peers`` peers are LoRA nodes (the config's) that sample propositional_logic only and take
peer groups the same way. The focus is a LoRA node (the config's: rank 8 on every projection) or a ReMix
node (n = 8, k = 2 LoRAs of rank 4 on the MLP projections, the same active rank, at ``--remix-lr``);
``--peers 0`` is the focus in silo, the reference a swarm focus is compared with. The peers' seeds do not
depend on the focus, so ``remix`` and ``lora`` runs of one seed are paired.

Writes ``OUT/FOCUS-pP-sS.json``: the focus's held-out greedy by dataset at every evaluation (every
``--eval-every`` steps, 25 by default, and the last), its sampled reward and the peer groups it trained on
a step, and for ReMix its routing specialisation. ``report`` prints, by seed, the focus's own-dataset (calendar_arithmetic) and
peers'-dataset greedy in swarm and in silo and the swarm's effect on each, ReMix beside LoRA.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "small-silo.yaml"
OWN, PEERS = "calendar_arithmetic", "propositional_logic"
FOCUS = {
    "lora": [],
    "remix": ["adapter.kind=remix", "adapter.rank=4", "adapter.remix.n=8", "adapter.remix.k=2"],
}


def node_overrides(args: argparse.Namespace, index: int, run_dir: Path) -> list[str]:
    sharing = args.peers > 0
    own = [1.0, 0.0] if index == 0 else [0.0, 1.0]
    out = [f"seed={args.seed * 100 + index}", f"run_dir={run_dir}", f"tasks.datasets=[{OWN},{PEERS}]",
           f"tasks.weights=[{own[0]},{own[1]}]", f"tasks.eval_datasets=[{OWN},{PEERS}]", f"tasks.eval_size={args.eval_size}",
           "sapo.local_groups=16", f"sapo.external_groups={8 if sharing else 0}", "sapo.generated_groups=16",
           f"train.steps={args.steps}", f"train.eval_every={args.eval_every}", f"train.checkpoint_every={args.steps + 1}"]
    if index == 0:
        out += FOCUS[args.focus]
        if args.focus == "remix" and args.remix_lr is not None:
            out.append(f"train.lr={args.remix_lr!r}")
        out += args.extra
    return out


def run(args: argparse.Namespace) -> int:
    import torch

    from node.config import load_config
    from node.run.node import Node
    from swarm.memory import InMemoryHub

    torch.set_num_threads(args.threads)
    out = Path(args.out) / f"{args.focus}-p{args.peers}-s{args.seed}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    hub = InMemoryHub()
    result: dict[str, Any] = {"focus": args.focus, "peers": args.peers, "seed": args.seed, "steps": args.steps,
                              "evals": [], "reward": [], "peer_groups": [], "specialisation": []}
    t0, cpu0 = time.perf_counter(), time.process_time()
    with tempfile.TemporaryDirectory(prefix="remix_swarm_") as tmp:
        nodes = []
        for i in range(1 + args.peers):
            cfg = load_config(CONFIG, node_overrides(args, i, Path(tmp) / f"node{i}"))
            node = Node(cfg, show_progress=False, transport=hub.join if args.peers else None)
            node.setup()
            nodes.append(node)
        result["config"] = node_overrides(args, 0, Path("RUN_DIR"))
        try:
            for _ in range(args.steps):
                records = [node.train_step() for node in nodes]
                hub.epoch += 1
                focus = records[0]
                result["reward"].append(focus["reward_mean"])
                result["peer_groups"].append(focus["n_peer_groups"])
                if "eval_by_dataset" in focus:
                    result["evals"].append({"step": focus["step"], "all": focus["eval_accuracy"],
                                            **focus["eval_by_dataset"]})
                    if "routing_specialisation" in focus:
                        result["specialisation"].append([focus["step"], focus["routing_specialisation"]])
                    print(f"step {focus['step']}: focus {result['evals'][-1]}", flush=True)
        finally:
            for node in nodes:
                node.close()
    result["seconds"], result["cpu_seconds"] = time.perf_counter() - t0, time.process_time() - cpu0
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


def report(args: argparse.Namespace) -> int:
    results = {p.stem: json.loads(p.read_text()) for p in sorted(Path(args.out).glob("*.json"))}
    if not results:
        print(f"no results under {args.out}")
        return 1
    print(f"| focus | peers | seed | {OWN} (own) | {PEERS} (peers') | all | peer groups a step | CPU-s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results.values():
        last = r["evals"][-1]
        print(f"| {r['focus']} | {r['peers']} | {r['seed']} | {last[OWN]:.3f} | {last[PEERS]:.3f} | {last['all']:.3f} | "
              f"{statistics.fmean(r['peer_groups']):.1f} | {r['cpu_seconds']:.0f} |")
    print("\nthe swarm's effect on the focus (swarm - silo, points of held-out greedy at the last step), by seed:")
    for focus in FOCUS:
        for seed in sorted({r["seed"] for r in results.values()}):
            silo = results.get(f"{focus}-p0-s{seed}")
            swarm = [r for r in results.values() if r["focus"] == focus and r["seed"] == seed and r["peers"] > 0]
            if silo and swarm:
                a, b = swarm[0]["evals"][-1], silo["evals"][-1]
                print(f"  {focus:5s} seed {seed}: own {100 * (a[OWN] - b[OWN]):+.1f}, peers' "
                      f"{100 * (a[PEERS] - b[PEERS]):+.1f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--focus", choices=sorted(FOCUS), required=True)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--peers", type=int, default=2)
    r.add_argument("--steps", type=int, default=100)
    r.add_argument("--remix-lr", type=float, default=None, help="the ReMix focus's train.lr (default: the config's)")
    r.add_argument("--eval-every", type=int, default=25)
    r.add_argument("--eval-size", type=int, default=128, help="held-out tasks, split over the two datasets")
    r.add_argument("--threads", type=int, default=1)
    r.add_argument("--out", default="runs/remix_swarm")
    r.add_argument("--extra", nargs="*", default=[], help="more config overrides (key=value) for the focus alone "
                   "(adapter.remix.centre=true, say: give such runs their own --out)")
    p = sub.add_parser("report")
    p.add_argument("--out", default="runs/remix_swarm")
    args = parser.parse_args(argv)
    return run(args) if args.command == "run" else report(args)


if __name__ == "__main__":
    sys.exit(main())
