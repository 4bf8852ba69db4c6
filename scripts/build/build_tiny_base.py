"""Pretrain the embedded tiny base model on zero-padded arithmetic and save it into the package.

    python scripts/build/build_tiny_base.py [--out DIR] [--seed 0] [--target-acc 0.5]
    python scripts/build/build_tiny_base.py --out DIR --op-mix add=0.2,sub=0.8 --eval-ops sub [--steps N]

A tiny Llama (hidden 128, 2 layers, 4 heads, tied embeddings) with the character tokenizer of
``node.sources.embedded.tiny`` learns ``bos + prompt + answer + eos`` texts (loss on the answer and eos only), by
default mostly 2-digit addition with a little subtraction and multiplication. Training stops at the first
evaluation whose greedy accuracy on ``--eval-ops`` (default: addition) reaches ``--target-acc``, or after
exactly ``--steps`` steps: an imperfect base, as a real base model is before RL.
Deterministic for a given seed and machine (fixed seeds, deterministic algorithms, fixed thread count);
the defaults rebuild the shipped ``node/sources/assets/tiny-base`` byte for byte.

Other bases (different operation mixes, e.g. ``add3``/``sub3`` for 3-digit operands, or shorter
pretraining) are for experiments: ``scripts/lib/tiny_bases.py``'s ``cached_base(options)`` builds one once under a cache folder keyed by
its options (``runs/tiny-bases/`` by default) and returns its path; the package is never touched.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

# Idle OpenMP threads sleep instead of spinning: on a shared, oversubscribed CPU spinning threads slow
# every step several-fold. Must be set before torch is imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: E402

from node.sources.embedded.build_env import build_environment  # noqa: E402
from node.sources.embedded.tiny import build_char_tokenizer, tiny_base_path  # noqa: E402
from node.tasks.arith_format import DATASETS, answer_width, make_problem  # noqa: E402

OP_MIX: dict[str, float] = {"add": 0.8, "sub": 0.1, "mul": 0.1}
EVAL_OPS = ("add",)
BATCH_SIZE = 128
LEARNING_RATE = 3e-3
WARMUP_STEPS = 50
MAX_STEPS = 6000
EVAL_EVERY = 25
EVAL_PROBLEMS = 500
MAX_NEW_TOKENS = 5
SEQ_LEN = 12  # at least: bos + 6 prompt chars + up to 4 answer chars + eos (the shipped base's mix)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=tiny_base_path(), help="output folder")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--target-acc", type=float, default=0.5, help="stop at the first eval at or above this"
    )
    parser.add_argument("--max-steps", type=int, default=MAX_STEPS)
    parser.add_argument("--steps", type=int, default=None,
                        help="train exactly this many steps, whatever the accuracy (overrides --target-acc)")
    parser.add_argument("--op-mix", type=parse_mix, default=dict(OP_MIX),
                        help=f"dataset=weight,... of the pretraining problems (datasets: {', '.join(DATASETS)})")
    parser.add_argument("--eval-ops", type=parse_ops, default=EVAL_OPS,
                        help="datasets whose mean greedy accuracy is checked against --target-acc")
    parser.add_argument("--answer-format", choices=["padded", "unpadded"], default="padded",
                        help="unpadded: answers without leading zeros (42, not 042) -- a base that knows the "
                        "arithmetic but not the format the task's verifier expects")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (1 is fastest for this size on a busy CPU)"
    )
    return parser.parse_args(argv)


def parse_mix(text: str) -> dict[str, float]:
    """``add=0.2,sub=0.8`` -> ``{"add": 0.2, "sub": 0.8}``."""
    mix: dict[str, float] = {}
    for item in text.split(","):
        name, sep, weight = item.partition("=")
        if not sep or name not in DATASETS:
            raise argparse.ArgumentTypeError(f"{item!r}: expected dataset=weight with a dataset of {list(DATASETS)}")
        mix[name] = float(weight)
    if any(w < 0 for w in mix.values()) or sum(mix.values()) <= 0:
        raise argparse.ArgumentTypeError(f"weights must be >= 0 and not all 0, got {text!r}")
    return mix


def parse_ops(text: str) -> tuple[str, ...]:
    ops = tuple(text.split(","))
    unknown = [op for op in ops if op not in DATASETS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown dataset(s) {unknown}; choose from {list(DATASETS)}")
    return ops


def seq_len(op_mix: dict[str, float]) -> int:
    """Padded length of a training text: bos + prompt + answer + eos of the longest dataset, at least SEQ_LEN."""
    lengths = [2 * digits + 2 + answer_width(op, digits) + 2 for op, digits in (DATASETS[d] for d in op_mix)]
    return max(SEQ_LEN, *lengths)


def set_determinism(seed: int, threads: int) -> None:
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)


def build_model(tokenizer: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return LlamaForCausalLM(config)


def sample_problems(
    n: int, gen: torch.Generator, op_mix: dict[str, float], answer_format: str = "padded"
) -> list[tuple[str, str]]:
    """Draw ``n`` (prompt, answer) pairs: dataset by ``op_mix``, operands uniform over the dataset's digits.

    Operands are drawn in [0, 10**d) for the most digits d in the mix and reduced to each dataset's width,
    so a 2-digit-only mix draws exactly what it always did.
    """
    ops = list(op_mix)
    weights = torch.tensor([op_mix[op] for op in ops], dtype=torch.float)
    op_ids = torch.multinomial(weights, n, replacement=True, generator=gen).tolist()
    top = 10 ** max(DATASETS[op][1] for op in ops)
    operands = torch.randint(0, top, (n, 2), generator=gen).tolist()
    out = []
    for i, (a, b) in zip(op_ids, operands):
        width = 10 ** DATASETS[ops[i]][1]
        prompt, answer = make_problem(ops[i], a % width, b % width)
        out.append((prompt, answer.lstrip("0") or "0") if answer_format == "unpadded" else (prompt, answer))
    return out


def make_batch(
    problems: list[tuple[str, str]], tokenizer: PreTrainedTokenizerFast, length: int = SEQ_LEN
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask`` and ``labels`` ([B, length]); labels only on answer+eos."""
    pad, bos, eos = tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id
    input_ids = torch.full((len(problems), length), pad, dtype=torch.long)
    labels = torch.full((len(problems), length), -100, dtype=torch.long)
    for row, (prompt, answer) in enumerate(problems):
        prompt_ids = [bos, *tokenizer.encode(prompt)]
        answer_ids = [*tokenizer.encode(answer), eos]
        ids = prompt_ids + answer_ids
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, len(prompt_ids) : len(ids)] = torch.tensor(answer_ids)
    return input_ids, (input_ids != pad).long(), labels


@torch.no_grad()
def accuracy(
    model: LlamaForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    problems: list[tuple[str, str]],
    temperature: float = 0.0,
    gen: torch.Generator | None = None,
) -> float:
    """Fraction of same-length prompts whose completion (up to eos, at most 5 tokens) equals the answer.

    ``temperature`` 0 is greedy; otherwise tokens are sampled from softmax(logits / temperature).
    """
    model.eval()  # type: ignore[no-untyped-call]
    ids = torch.tensor([[tokenizer.bos_token_id, *tokenizer.encode(p)] for p, _ in problems])
    prompt_len = ids.shape[1]
    for _ in range(MAX_NEW_TOKENS):
        logits = model(input_ids=ids).logits[:, -1, :].float()
        if temperature == 0.0:
            next_ids = logits.argmax(dim=-1)
        else:
            probs = torch.softmax(logits / temperature, dim=-1)
            next_ids = torch.multinomial(probs, 1, generator=gen).squeeze(-1)
        ids = torch.cat([ids, next_ids[:, None]], dim=1)
    model.train()
    correct = 0
    for row, (_, answer) in enumerate(problems):
        completion = ids[row, prompt_len:].tolist()
        if tokenizer.eos_token_id in completion:
            completion = completion[: completion.index(tokenizer.eos_token_id)]
        correct += int(tokenizer.decode(completion) == answer)
    return correct / len(problems)


def lr_at(step: int) -> float:
    return LEARNING_RATE * min(1.0, (step + 1) / WARMUP_STEPS)


def eval_accuracy(
    model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, eval_sets: dict[str, list[tuple[str, str]]]
) -> float:
    """Mean over the evaluation datasets of the greedy accuracy on each."""
    return sum(accuracy(model, tokenizer, problems) for problems in eval_sets.values()) / len(eval_sets)


def train(
    model: LlamaForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    eval_sets: dict[str, list[tuple[str, str]]],
    args: argparse.Namespace,
) -> tuple[int, float]:
    """Train until the greedy eval accuracy reaches the target (or for ``args.steps``); return (steps, accuracy)."""
    gen = torch.Generator().manual_seed(args.seed + 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.01)
    model.train()
    acc = 0.0
    length = seq_len(args.op_mix)
    last = args.steps if args.steps is not None else args.max_steps
    for step in range(1, last + 1):
        problems = sample_problems(BATCH_SIZE, gen, args.op_mix, args.answer_format)
        input_ids, attention_mask, labels = make_batch(problems, tokenizer, length)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % EVAL_EVERY == 0 or step == last:
            acc = eval_accuracy(model, tokenizer, eval_sets)
            print(f"step {step:5d}  loss {loss.item():.4f}  greedy {'+'.join(eval_sets)} acc {acc:.3f}", flush=True)
            if args.steps is None and acc >= args.target_acc:
                return step, acc
    return last, acc


def save(
    model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, out: Path, info: dict[str, object]
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model.generation_config.do_sample = False
    model.generation_config.max_new_tokens = MAX_NEW_TOKENS
    model.save_pretrained(out, safe_serialization=True)
    (out / "model.safetensors").chmod(0o644)  # safetensors writes 0600; the file ships in the package
    tokenizer.save_pretrained(out)
    # Name the generic fast class (transformers 5 writes its own alias) so transformers 4 loads it too.
    config_path = out / "tokenizer_config.json"
    tokenizer_config = json.loads(config_path.read_text())
    tokenizer_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(tokenizer_config, indent=2, sort_keys=True) + "\n")
    (out / "build_info.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    set_determinism(args.seed, args.threads)
    tokenizer = build_char_tokenizer()
    model = build_model(tokenizer)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"tiny base: {n_params} parameters, vocab {len(tokenizer)}, seed {args.seed}", flush=True)

    eval_sets = {op: sample_problems(EVAL_PROBLEMS, torch.Generator().manual_seed(10_000 + args.seed), {op: 1.0},
                                     args.answer_format)
                 for op in args.eval_ops}
    steps, greedy_acc = train(model, tokenizer, eval_sets, args)
    train_seconds = time.perf_counter() - started
    first = next(iter(eval_sets.values()))
    sampled_acc = accuracy(
        model, tokenizer, first, temperature=1.0, gen=torch.Generator().manual_seed(args.seed + 2)
    )
    report_ops = ["sub", "mul", *(op for op in (*args.op_mix, *args.eval_ops) if op not in ("add", "sub", "mul"))]
    other_ops = {
        f"greedy_{op}_accuracy": accuracy(
            model,
            tokenizer,
            sample_problems(200, torch.Generator().manual_seed(20_000 + args.seed), {op: 1.0}, args.answer_format),
        )
        for op in dict.fromkeys(report_ops)
    }
    reached = args.steps is not None or greedy_acc >= args.target_acc
    default_eval = tuple(args.eval_ops) == EVAL_OPS
    info: dict[str, object] = {
        "seed": args.seed,
        "steps": steps,
        "batch_size": BATCH_SIZE,
        "learning_rate": LEARNING_RATE,
        "op_mix": args.op_mix,
        "target_acc": args.target_acc,
        "reached_target": reached,
        "eval_problems": EVAL_PROBLEMS,
        "greedy_add_accuracy" if default_eval else "greedy_eval_accuracy": greedy_acc,
        "sampled_add_accuracy_t1" if default_eval else "sampled_eval_accuracy_t1": sampled_acc,
        **other_ops,
        "parameters": n_params,
        "train_seconds": round(train_seconds, 1),
        "threads": args.threads,
        **build_environment(),
    }
    if not default_eval:
        info["eval_ops"] = list(args.eval_ops)
    if args.steps is not None:
        info["fixed_steps"] = args.steps
    if args.answer_format != "padded":
        info["answer_format"] = args.answer_format
    save(model, tokenizer, args.out, info)
    print(
        f"saved {args.out}: {steps} steps, greedy {greedy_acc:.3f}, sampled(T=1) {sampled_acc:.3f}, "
        f"{train_seconds:.1f}s",
        flush=True,
    )
    if not reached:
        print(f"warning: target accuracy {args.target_acc} not reached in {steps} steps", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
