"""Where the screen's weight on positive peer tokens falls in an honest peer's correct completions.

    python scripts/lab/weight_deficit.py --peer RUN_DIR --peer-step 20 [--node RUN_DIR] [--node-step 10]
                                         [--tasks 128] [--datasets basic_arithmetic] [--floor -2.3]

A peer (the run's checkpoint at ``--peer-step``) samples 4 completions for each of ``--tasks`` held-out tasks
of its own evaluation, at its temperature; the receiver (the checkpoint at ``--node-step`` of ``--node``, the
peer's own run by default: another node of a sharing run at the same step, say, whose checkpoints
``bench_sapo.py --checkpoint-every`` keeps under ``OUT/work/<run>/node<i>`` while it runs; or the base model
with ``--node-step 0``) reads every correct one with its own model, as its training pass does, and weighs
each token ``min(1, p / exp(floor))`` (``node.train.screen.positive_peer_weights``). What the weight holds
back of a token is ``1 - weight``; the table sums it over three parts of each completion: the tagged answer
(lifted by ``ingest.screen_answer_full``), the working's statement of the answer right before the tag
(lifted by ``ingest.screen_answer_working`` too: ``answer_token_span``) and the rest, the peer's own text.
"""

from __future__ import annotations

import argparse

import torch

from node.exchange.plausibility import answer_token_span
from node.policy.logprobs import right_pad, shared_prompt_logprobs
from node.train.screen import positive_peer_weights
from scripts.lib.checkpoints import held_out_tasks, policy_at, sample

PARTS = ("tagged answer", "working's answer", "the rest")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--peer", required=True, help="a run dir (the folder a node trained in)")
    p.add_argument("--peer-step", type=int, required=True, help="the checkpoint the peer samples with")
    p.add_argument("--node", default=None, help="the receiver's run dir (default: the peer's)")
    p.add_argument("--node-step", type=int, default=0, help="the receiver's checkpoint; 0: the base")
    p.add_argument("--tasks", type=int, default=128)
    p.add_argument("--datasets", default=None, help="comma-separated; default the run's")
    p.add_argument("--floor", type=float, default=None,
                   help="ingest.screen_positive_floor (default: the one the peer's run was configured with)")
    args = p.parse_args()
    torch.set_num_threads(1)

    datasets = args.datasets.split(",") if args.datasets else None
    cfg, source, tasks = held_out_tasks(args.peer, args.peer_step, args.tasks, datasets)
    g = cfg.generation
    floor = args.floor if args.floor is not None else cfg.ingest.screen_positive_floor
    if floor is None:
        raise SystemExit("weight_deficit: the run's ingest.screen_positive_floor is null (no weight); pass --floor")
    peer, node = policy_at(args.peer, args.peer_step, cfg), policy_at(args.node or args.peer, args.node_step, cfg)
    groups = sample(peer, cfg, source, tasks, group_size=4, seed=0)
    tok = node.tokenizer

    def decode(ids: list[int]) -> str:
        return str(tok.decode(ids, skip_special_tokens=True))

    tokens, held = dict.fromkeys(PARTS, 0), dict.fromkeys(PARTS, 0.0)
    positive = 0
    for sampled in groups:
        group = sampled.group
        for ids, reward in zip(group.completions, group.rewards):
            if reward <= 0:
                continue
            positive += 1
            cid, cmask = right_pad([ids], tok.pad_token_id, torch.long)
            with torch.no_grad():
                lp = shared_prompt_logprobs(node.model, [group.prompt_ids], cid, cmask, pad_id=tok.pad_token_id,
                                            temperature=g.temperature)[0]
            # the training pass's own weights (node.train.screen), this row a positive peer row
            weights = positive_peer_weights(lp[None], cmask, torch.tensor([True]), torch.tensor([1.0]), floor)[0]
            answer = sampled.task.answer or ""
            tagged = answer_token_span(decode, ids, answer) or (0, 0)
            working = answer_token_span(decode, ids, answer, working=True) or tagged
            spans = {PARTS[0]: range(*tagged), PARTS[1]: range(working[0], tagged[0])}
            for i, w in enumerate(weights.tolist()):
                part = next((name for name, span in spans.items() if i in span), PARTS[2])
                tokens[part] += 1
                held[part] += 1.0 - w
    total = sum(held.values()) or 1.0
    print(f"{positive} correct completions of {sum(len(s.group.completions) for s in groups)}; node "
          f"{args.node + ' ' if args.node else ''}step {args.node_step or 'base'}, peer step {args.peer_step}, "
          f"floor {floor}")
    print("| part | tokens | held back (sum of 1 - weight) | share of it | mean weight |")
    print("| --- | --- | --- | --- | --- |")
    for part in PARTS:
        mean = 1.0 - held[part] / tokens[part] if tokens[part] else float("nan")
        print(f"| {part} | {tokens[part]} | {held[part]:.1f} | {100 * held[part] / total:.0f}% | {mean:.3f} |")
    n = sum(tokens.values()) or 1
    print(f"mean weight over every token of the correct completions: {1 - (held[PARTS[1]] + held[PARTS[2]]) / n:.4f} "
          f"with the tagged answer lifted, {1 - held[PARTS[2]] / n:.4f} with the working's answer too")


if __name__ == "__main__":
    main()
