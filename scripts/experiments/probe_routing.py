"""What a ReMix router sees: the pooled layer inputs of a mixture's prompts, and whether any router could
tell the datasets apart from them.

Usage: python scripts/experiments/probe_routing.py [-c configs/smollm2-silo.yaml] [--per-dataset 32]
                                       [--routers 8] [--threads 2] [--json OUT] [key=value ...]

ReMix routes a prompt from the input of each decoder layer (the residual stream) averaged over the prompt's
tokens (``node/policy/remix/adapter.py``), the same top-k for all of a sequence. This probe runs the base
model (an adapter's B starts at zero, so these are the inputs a fresh ReMix adapter's routers see) over the
held-out prompts of the config's datasets (``--per-dataset`` each, formatted as the node formats them) and,
for each decoder layer and three poolings, measures:

- ``common``: ``||mean_p x_p||^2 / mean_p ||x_p||^2``, the share of a pooled input that every prompt shares
  (1: all prompts pool to the same vector);
- ``dataset R2``: the share of the pooled inputs' spread around their mean that lies between the datasets'
  means (1: a prompt's dataset alone decides its pooled input; 0: the datasets pool alike);
- ``same pair``: with ``--routers`` random routers (Gaussian weights, each logit's scale alike), the share of
  prompts whose top-k LoRAs (the config's ``adapter.remix.k`` of ``n``) are the layer's most common set:
  1 when any router routes every prompt alike;
- ``same pair, centred``: the same with the prompts' mean pooled input taken from each (a router that saw
  only how a prompt differs from the others).

Poolings: ``prompt`` (every prompt token: what ReMix does), ``no-first`` (every token but the first, whose
residual in many models carries outsized activations) and ``task`` (the tokens from the task's own text on,
leaving out the system prompt and worked example every prompt of the mixture shares). The table gives
the mean over layers and the first, middle and last layer; ``--json`` saves every layer.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
POOLINGS = ("prompt", "no-first", "task")


def common_share(x: torch.Tensor) -> float:
    """``||mean x||^2 / mean ||x||^2`` over the rows of ``x`` ``[P, D]``."""
    return float(x.mean(0).pow(2).sum() / x.pow(2).sum(1).mean())


def dataset_r2(x: torch.Tensor, labels: list[str]) -> float:
    """Between-dataset sum of squares over the total, around the mean of all rows."""
    centred = x - x.mean(0)
    total = float(centred.pow(2).sum())
    between = 0.0
    for name in dict.fromkeys(labels):
        rows = centred[[i for i, d in enumerate(labels) if d == name]]
        between += rows.shape[0] * float(rows.mean(0).pow(2).sum())
    return between / total if total > 0 else 0.0


def same_pair_share(x: torch.Tensor, n: int, k: int, routers: int, seed: int = 0) -> float:
    """Mean over ``routers`` random routers of the share of rows whose top-k set is the most common one."""
    gen = torch.Generator().manual_seed(seed)
    shares = []
    for _ in range(routers):
        weight = torch.randn(x.shape[1], n, generator=gen, dtype=x.dtype)
        top = torch.topk(x @ weight, k, dim=-1).indices.sort(-1).values
        _, counts = torch.unique(top, dim=0, return_counts=True)
        shares.append(float(counts.max()) / x.shape[0])
    return statistics.fmean(shares)


def pooled_inputs(model: Any, ids: list[int], task_from: int) -> dict[str, list[torch.Tensor]]:
    """Each decoder layer's input, averaged over the prompt three ways (``POOLINGS``)."""
    captured: list[torch.Tensor] = []

    def hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        hidden = args[0] if args else kwargs["hidden_states"]
        captured.append(hidden[0].detach().float())

    from node.policy.remix.adapter import decoder_layers

    handles = [layer.register_forward_pre_hook(hook, with_kwargs=True) for layer in decoder_layers(model)]
    try:
        with torch.no_grad():
            model(torch.tensor([ids], device=next(model.parameters()).device))
    finally:
        for handle in handles:
            handle.remove()
    return {"prompt": [h.mean(0).cpu() for h in captured], "no-first": [h[1:].mean(0).cpu() for h in captured],
            "task": [h[task_from:].mean(0).cpu() for h in captured]}


def task_start(text: str, question: str, tokens_of: Any) -> int:
    """The index of the first token of the task's own text in the formatted prompt (its last occurrence)."""
    at = text.rfind(question[:40].strip())
    if at < 0:
        raise SystemExit(f"probe_routing: the task's text {question[:40]!r} is not in its formatted prompt")
    return len(tokens_of(text[:at]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-c", "--config", default=str(ROOT / "configs" / "smollm2-silo.yaml"))
    parser.add_argument("--per-dataset", type=int, default=32, help="held-out prompts of each dataset")
    parser.add_argument("--routers", type=int, default=8, help="random routers for the same-pair share")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default=None, help="save every layer's figures here")
    parser.add_argument("overrides", nargs="*", help="config overrides (key=value)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    from node.config import load_config
    from node.generation.rollouts import encode_prompt
    from node.policy.model import build_policy
    from node.tasks import build_task_source

    cfg = load_config(args.config, ["adapter.kind=lora", *args.overrides])
    t, remix = cfg.tasks, cfg.adapter.remix
    source = build_task_source(t.source, list(t.datasets), None, cfg.seed, **t.source_options(cfg.model.chat_template))
    policy = build_policy(cfg.model, cfg.adapter, cfg.seed)
    model: Any = policy.model  # peft's wrapper: its base model holds the decoder layers (B = 0: the same outputs)
    model = model.get_base_model() if hasattr(model, "get_base_model") else model
    model.eval()
    tasks = [source.task(r) for r in source.eval_refs(args.per_dataset * len(t.datasets))]
    labels, pooled = [], {p: [] for p in POOLINGS}  # type: ignore[var-annotated]
    task_share = []
    for task in tasks:
        text = source.format_prompt(task, policy.tokenizer)
        ids = encode_prompt(policy, text)
        start = task_start(text, task.prompt, lambda s: encode_prompt(policy, s))
        task_share.append((len(ids) - start) / len(ids))
        for name, layers in pooled_inputs(model, ids, start).items():
            pooled[name].append(torch.stack(layers))  # [L, D]
        labels.append(task.ref.dataset)
    layers = pooled["prompt"][0].shape[0]
    result: dict[str, Any] = {"config": args.config, "overrides": args.overrides, "prompts": len(tasks),
                              "datasets": {d: labels.count(d) for d in dict.fromkeys(labels)},
                              "task_token_share": statistics.fmean(task_share), "n": remix.n, "k": remix.k,
                              "layers": {}}
    for name in POOLINGS:
        x = torch.stack(pooled[name]).double()  # [P, L, D]
        rows = [{"common": common_share(x[:, i]), "dataset_r2": dataset_r2(x[:, i], labels),
                 "same_pair": same_pair_share(x[:, i], remix.n, remix.k, args.routers, seed=i),
                 "same_pair_centred": same_pair_share(x[:, i] - x[:, i].mean(0), remix.n, remix.k, args.routers,
                                                      seed=i)} for i in range(layers)]
        result["layers"][name] = rows
    print(f"probe_routing: {len(tasks)} prompts ({', '.join(f'{d} {c}' for d, c in result['datasets'].items())}), "
          f"{layers} layers; the task's own tokens {100 * result['task_token_share']:.0f}% of a prompt; "
          f"random routers choosing {remix.k} of {remix.n}; load {os.getloadavg()[0]:.1f}")
    picks = sorted({0, layers // 2, layers - 1})
    print("| pooling | measure | mean over layers | " + " | ".join(f"layer {i}" for i in picks) + " |")
    print("| --- " * (3 + len(picks)) + "|")
    for name in POOLINGS:
        for key in ("common", "dataset_r2", "same_pair", "same_pair_centred"):
            values = [row[key] for row in result["layers"][name]]
            print(f"| {name} | {key} | {statistics.fmean(values):.3f} | "
                  + " | ".join(f"{values[i]:.3f}" for i in picks) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
