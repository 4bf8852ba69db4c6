"""Write the golden record of a fetched or embedded model: ``node/sources/assets/golden/NAME.json``.

    python scripts/build/make_golden.py smollm2-135m tiny-base small-base

The record (``node.sources.golden``) holds the model's special tokens, vocabulary hash, the ids and decoded
text of fixed strings and of a fixed conversation, and the greedy continuation of fixed prompts with the
float32 CPU logits behind it. Every later conversion or cached folder of that model, with whatever library
versions, is checked against it (at load, and by ``swarm-node doctor``), so write it only from a folder
that passes the checks against its source: a fetched model must have been converted by this version of
the node (its ``build_info.json`` records what the GGUF states, ``source_tokenizer``), and this script
refuses a folder that disagrees with it. Run it with the versions scripts/test.sh installs.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import re
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from node.errors import PolicyError
from node.sources.cache import DONE_FILE
from node.sources.check import check_folder, read_json, refuse
from node.sources.golden import MAKE_COMMAND, golden_path, greedy_prompts, greedy_record, tokenizer_record
from node.sources.locate import locate_model


def _dump(record: dict[str, object]) -> str:
    """JSON with one key a line and each list of numbers on one line."""
    text = json.dumps(record, indent=1, ensure_ascii=False)
    return re.sub(r"\[\s*(-?[\d.]+(?:,\s*-?[\d.]+)*)\s*\]",
                  lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]", text)


def make(name: str) -> Path:
    where = locate_model(name)
    folder = Path(where.build() if where.build is not None else where.path)
    info = read_json(folder / DONE_FILE)
    if "gguf_sha256" in info and "source_tokenizer" not in info:
        raise PolicyError(f"{folder} was converted before conversions recorded their GGUF's tokenizer: remove it "
                          f"and run `swarm-node fetch {name}` first")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    refuse(check_folder(folder, tokenizer), model=name, folder=folder, fix="not writing a golden record from it")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    record = {
        "model": name,
        "command": f"{MAKE_COMMAND} {name}",
        "made_with": {pkg: md.version(pkg) for pkg in ("torch", "transformers", "tokenizers")},
        "tokenizer": tokenizer_record(tokenizer),
        "greedy": [greedy_record(model, prompt) for prompt in greedy_prompts(tokenizer)],
    }
    out = golden_path(name)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(_dump(record) + "\n", encoding="utf-8")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="+", help="fetched or embedded model names (smollm2-135m, tiny-base, ...)")
    args = parser.parse_args()
    for name in args.names:
        try:
            print(f"{name}: wrote {make(name)}")
        except PolicyError as exc:
            print(f"{name}: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
