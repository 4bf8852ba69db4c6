"""The README and docs/ say what the repository does: links resolve, named files exist, config keys are
real, and the embedded model's figures are those its build wrote (node/assets/tiny-base/build_info.json)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import get_args

from node.config import NodeConfig

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
DOCS = sorted((ROOT / "docs").glob("*.md"))
_SECTIONS = "model|adapter|tasks|generation|sampling|train|sapo|ingest|metrics|swarm|tracking|api"


def _config_key_exists(path: str) -> bool:
    cls: object = NodeConfig
    for part in path.split("."):
        fields = getattr(cls, "model_fields", None)
        if fields is None or part not in fields:
            return False
        cls = fields[part].annotation
        models = [a for a in get_args(cls) if hasattr(a, "model_fields")]  # an optional section: X | None
        cls = models[0] if models else cls
    return True


def test_docs_live_in_the_repository_and_every_relative_link_resolves() -> None:
    assert {p.name for p in DOCS} >= {"architecture.md", "protocol.md", "algorithms.md"}
    for path, text in [(ROOT / "README.md", README), *((p, p.read_text(encoding="utf-8")) for p in DOCS)]:
        assert "DESIGN.md" not in text and "ALGORITHMS.md" not in text, path
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):
            assert (path.parent / target).exists(), f"{path.name} links to missing {target}"
    for name in ("architecture.md", "protocol.md", "algorithms.md"):
        assert f"](docs/{name})" in README


def test_every_config_key_the_readme_and_docs_name_exists() -> None:
    for text in [README, *(p.read_text(encoding="utf-8") for p in DOCS)]:
        keys = set(re.findall(rf"`((?:{_SECTIONS})\.[a-z0-9_]+(?:\.[a-z0-9_]+)?)", text))
        keys |= set(re.findall(rf"\b((?:{_SECTIONS})\.[a-z0-9_]+(?:\.[a-z0-9_]+)?)=", text))
        keys = {k for k in keys if not k.endswith((".jsonl", ".yaml", ".json", ".py", ".md", ".safetensors"))}
        assert keys, "no config key found: the pattern is broken"
        missing = sorted(k for k in keys if not _config_key_exists(k))
        assert not missing, missing


def test_every_script_and_config_the_readme_names_exists() -> None:
    named = set(re.findall(r"\b((?:scripts|configs)/[\w./-]+\.(?:py|sh|yaml))", README))
    assert "scripts/demo.sh" in named and "configs/tiny-swarm.yaml" in named
    assert not [n for n in named if not (ROOT / n).is_file()]


def test_the_embedded_model_figures_are_the_ones_its_build_wrote() -> None:
    info = json.loads((ROOT / "node" / "assets" / "tiny-base" / "build_info.json").read_text())
    line = README[README.index("**Embedded model**") :].split("\n\n")[0].replace("\n", " ")
    assert f"{info['parameters']:,} parameters" in line
    assert f"{info['steps']} pretraining steps in {info['train_seconds']:.1f} s" in line
    assert f"greedy addition accuracy {info['greedy_add_accuracy']}" in line
    assert f"temperature 1 {info['sampled_add_accuracy_t1']}" in line
    assert f"sub {info['greedy_sub_accuracy']}, mul {info['greedy_mul_accuracy']}" in line
    assert "byte-identical" not in README


def test_the_small_base_figures_are_the_shipped_model_s() -> None:
    """small-base is shipped, so the README's figures must be those of the shipped build_info.json."""
    info = json.loads((ROOT / "node" / "assets" / "small-base" / "build_info.json").read_text())
    text = README[README.index("**small-base** (`python scripts/build/build_small_base.py`") :].split("\n\n")[0]
    text = text.replace("\n", " ")
    assert f"{info['parameters']:,} parameters" in text
    for key, name in (("arith/add", "addition"), ("reasoning_gym/calendar_arithmetic", "calendar_arithmetic"),
                      ("reasoning_gym/propositional_logic", "propositional_logic")):
        assert f"{name} {info['greedy'][key]['reward']} / {info['sampled_t1'][key]['reward']}" in text, name
    assert f"in {info['total_seconds']} s ({info['cpu_seconds']} CPU-seconds" in text
    from node.policy.small_build import LOSS_CURVE_MARGIN, SAMPLED_REWARD_MARGIN

    margins = README[README.index("A rebuild counts as the recipe's model") :][:300].replace("\n", " ")
    assert f"within {LOSS_CURVE_MARGIN}" in margins and f"within {SAMPLED_REWARD_MARGIN}" in margins
