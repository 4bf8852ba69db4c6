"""The README is a front page: short, with the two set-up commands, the links a newcomer needs, and the
embedded models' figures where they are stated (those their builds wrote: node/sources/assets/*/build_info.json).
The checks of every page (links, keys, paths, commands) are in tests/test_docs.py."""

from __future__ import annotations

import json
import re

from tests.doc_checks import ROOT

README = (ROOT / "README.md").read_text(encoding="utf-8")
RESULTS = ROOT / "docs" / "results"


def test_the_readme_is_a_front_page() -> None:
    assert len(README.splitlines()) <= 300, "README.md is a front page: move the detail into docs/"
    bash = "\n".join(re.findall(r"```bash\n(.*?)```", README, re.S))
    assert "scripts/demo.sh" in bash and "scripts/test.sh" in bash
    for page in ("docs/index.md", "docs/architecture.md", "docs/protocol.md", "docs/algorithms.md",
                 "docs/configuration.md", "docs/swarm.md", "docs/models.md", "docs/results/README.md"):
        assert f"]({page})" in README, page


def test_the_results_table_is_one_line_a_row() -> None:
    """"What it measured": a question, one figure and its page a row; the detail stays on the pages (a cell of
    100 words, as the table once had, fails)."""
    section = README.split("## What it measured", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith(("| question", "| ---"))]
    assert len(rows) >= 8
    for row in rows:
        question, answer, page = (cell.strip() for cell in row.strip("|").split(" | "))
        assert question.endswith("?") and "](docs/" in page, row
        assert len(answer.split()) <= 25, f"{question}: {len(answer.split())} words; one figure, the rest on its page"


def test_the_embedded_model_figures_are_the_ones_its_build_wrote() -> None:
    info = json.loads((ROOT / "node" / "sources" / "assets" / "tiny-base" / "build_info.json").read_text())
    page = (RESULTS / "tiny-base-build.md").read_text(encoding="utf-8")
    line = page[page.index("**Embedded model**") :].split("\n\n")[0].replace("\n", " ")
    assert f"{info['parameters']:,} parameters" in line
    assert f"{info['steps']} pretraining steps in {info['train_seconds']:.1f} s" in line
    assert f"greedy addition accuracy {info['greedy_add_accuracy']}" in line
    assert f"temperature 1 {info['sampled_add_accuracy_t1']}" in line
    assert f"sub {info['greedy_sub_accuracy']}, mul {info['greedy_mul_accuracy']}" in line
    index = (RESULTS / "README.md").read_text(encoding="utf-8")
    assert f"{info['parameters']:,} parameters, greedy addition {info['greedy_add_accuracy']}" in index
    millions = f"{info['parameters'] / 1e6:.2f}"
    assert f"| `tiny-base` (default) | {millions} M-parameter" in README
    assert f"| `tiny-base` (default) | {millions}M-parameter" in (ROOT / "docs" / "models.md").read_text()
    for path in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]:
        assert "byte-identical" not in path.read_text(encoding="utf-8"), path


def test_the_small_base_figures_are_the_shipped_model_s() -> None:
    """small-base is shipped, so the figures stated must be those of the shipped build_info.json."""
    info = json.loads((ROOT / "node" / "sources" / "assets" / "small-base" / "build_info.json").read_text())
    page = (RESULTS / "small-base-build.md").read_text(encoding="utf-8")
    text = page[page.index("**small-base** (`python scripts/build/build_small_base.py`") :].split("\n\n")[0]
    text = text.replace("\n", " ")
    assert f"{info['parameters']:,} parameters" in text
    for key, name in (("arith/add", "addition"), ("reasoning_gym/calendar_arithmetic", "calendar_arithmetic"),
                      ("reasoning_gym/propositional_logic", "propositional_logic")):
        assert f"{name} {info['greedy'][key]['reward']} / {info['sampled_t1'][key]['reward']}" in text, name
    assert f"in {info['total_seconds']} s ({info['cpu_seconds']} CPU-seconds" in text

    from scripts.lib import small_build
    LOSS_CURVE_MARGIN, SAMPLED_REWARD_MARGIN = small_build.LOSS_CURVE_MARGIN, small_build.SAMPLED_REWARD_MARGIN

    margins = page[page.index("A rebuild counts as the recipe's model") :][:300].replace("\n", " ")
    assert f"within {LOSS_CURVE_MARGIN}" in margins and f"within {SAMPLED_REWARD_MARGIN}" in margins
    millions = f"{info['parameters'] / 1e6:.1f}"
    assert f"| `small-base` | {millions} M-parameter" in README
    assert f"| `small-base` | {millions}M-parameter" in (ROOT / "docs" / "models.md").read_text()
    index = (RESULTS / "README.md").read_text(encoding="utf-8")
    assert f"{millions} M parameters" in index
