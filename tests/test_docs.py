"""The docs say what the repository does: on every page (README.md, docs/**, scripts/README.md) links
resolve, named keys and paths exist, and every command shown runs; the configuration reference is the
config models'; the results pages have their parts. Each check is also run on a broken page, to show that
it fails."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.doc_checks import (
    ROOT,
    command_problems,
    config_keys_named,
    doc_pages,
    key_problems,
    link_problems,
    path_problems,
    shell_commands,
)

PAGES = {path: path.read_text(encoding="utf-8") for path in doc_pages()}
RESULTS = ROOT / "docs" / "results"


def test_the_pages_are_there() -> None:
    names = {str(p.relative_to(ROOT)) for p in PAGES}
    assert {"README.md", "docs/index.md", "docs/configuration.md", "docs/results/README.md",
            "docs/architecture.md", "docs/protocol.md", "docs/algorithms.md", "scripts/README.md"} <= names
    index = PAGES[ROOT / "docs" / "index.md"]
    for page in (ROOT / "docs").glob("*.md"):
        assert page.name == "index.md" or f"]({page.name})" in index, f"docs/index.md does not list {page.name}"


def test_every_link_resolves() -> None:
    problems = [p for path, text in PAGES.items() for p in link_problems(path, text)]
    assert not problems, "\n".join(problems)


def test_every_config_key_a_page_names_exists() -> None:
    assert len(set().union(*(config_keys_named(t) for t in PAGES.values()))) > 100, "the key pattern is broken"
    problems = [p for path, text in PAGES.items() for p in key_problems(path, text)]
    assert not problems, "\n".join(problems)


def test_every_path_a_page_names_exists() -> None:
    problems = [p for path, text in PAGES.items() for p in path_problems(path, text)]
    assert not problems, "\n".join(problems)


def test_every_command_a_page_shows_runs() -> None:
    commands = [c for text in PAGES.values() for c in shell_commands(text)]
    assert sum(c.startswith("swarm-node ") for c in commands) > 30, "the command extraction is broken"
    assert sum("python scripts/" in c for c in commands) > 20, "the command extraction is broken"
    text = "\n\n".join(f"<!-- {path} -->\n{text}" for path, text in PAGES.items())
    problems = command_problems(ROOT / "docs" / "all-pages.md", text)
    assert not problems, "\n".join(problems)


BROKEN = """\
# A broken page

See [the missing page](missing.md), [a heading that is not there](index.md#no-such-heading) and
`train.no_such_key`.  Paths: `scripts/bench/bench_nothing.py`, `configs/nothing.yaml`.

```bash
swarm-node silo -c configs/tiny-silo.yaml --no-such-flag
swarm-node silo -c configs/tiny-silo.yaml train.stepz=3
swarm-node start -c configs/tiny-swarm.yaml train.loss=ppo
swarm-node eval --model tiny-base -c configs/missing.yaml
python scripts/bench/bench_api.py --no-such-flag
python scripts/bench/bench_missing.py --rounds 2
scripts/missing.sh 3
scripts/local_swarm.sh 3 train.stepz=5
```

Inline: `swarm-node export runs/demo --merged` (no --out).
"""


def test_each_check_fails_on_a_broken_page() -> None:
    page = ROOT / "docs" / "broken.md"
    links = link_problems(page, BROKEN)
    assert any("missing.md" in p for p in links) and any("no-such-heading" in p for p in links)
    assert key_problems(page, BROKEN) == [f"docs/broken.md names config key {k}, which does not exist"
                                         for k in ("train.no_such_key", "train.stepz")]
    paths = path_problems(page, BROKEN)
    assert any("bench_nothing.py" in p for p in paths) and any("configs/nothing.yaml" in p for p in paths)
    problems = command_problems(page, BROKEN)
    for expected in ("--no-such-flag`: the CLI's parser refuses it", "train.stepz", "train.loss",
                     "configs/missing.yaml does not exist", "bench_api.py --no-such-flag`: ",
                     "bench_missing.py does not exist", "scripts/missing.sh does not exist",
                     "local_swarm.sh 3 train.stepz=5`: train.stepz is no config key", "export runs/demo --merged"):
        assert any(expected in p for p in problems), (expected, problems)
    assert len(problems) == 9, problems


FINE = """\
# A correct page

See [the index](index.md), [a heading that is there](index.md#finding-things) and
`train.lr`.  Paths: `scripts/bench/bench_api.py`, `configs/tiny-silo.yaml`.

```bash
swarm-node silo -c configs/tiny-silo.yaml --no-progress
swarm-node silo -c configs/tiny-silo.yaml train.steps=3
swarm-node start -c configs/tiny-swarm.yaml train.loss=reinforce
swarm-node eval --model tiny-base -c configs/tiny-silo.yaml
OMP_NUM_THREADS=1 python scripts/bench/bench_api.py --rounds 2
python scripts/bench/bench_protocol.py --help
scripts/test.sh tests/test_docs.py
scripts/local_swarm.sh 3 train.steps=5
```

Inline: `swarm-node export runs/demo --out runs/export/merged --merged`.
"""


def test_a_correct_page_passes_every_check() -> None:
    """Every check of the broken page finds nothing wrong in the same page made correct, item for item (they
    are not failing on everything), and each has something to check."""
    page = ROOT / "docs" / "fine.md"
    assert config_keys_named(FINE) == {"train.lr", "train.steps", "train.loss"}
    assert len(shell_commands(FINE)) == 9
    assert link_problems(page, FINE) == []
    assert key_problems(page, FINE) == []
    assert path_problems(page, FINE) == []
    assert command_problems(page, FINE) == []


def test_the_configuration_reference_is_generated_from_the_config_models() -> None:
    from tests.scripts import load_script

    reference = load_script("dev/config_reference")
    assert (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8") == reference.render(), (
        "docs/configuration.md is out of date: run python scripts/dev/config_reference.py")
    keys = reference.keys()
    undocumented = [k for k, field, meaning in keys if not meaning and reference._section_model(field.annotation) is None]
    assert not undocumented, f"keys without a meaning: {undocumented}"
    stale = set(reference.MEANINGS) - {k for k, _, _ in keys}
    assert not stale, f"MEANINGS names keys that no longer exist: {stale}"
    page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert all(f"| `{k}` |" in page for k, field, _ in keys if reference._section_model(field.annotation) is None)


def test_the_trust_page_names_every_rejection_reason() -> None:
    from node.exchange.ingest import OFFENCES, REJECT_REASONS, SURPLUS_REASONS

    trust = (ROOT / "docs" / "trust.md").read_text(encoding="utf-8")
    missing = [r for r in sorted(REJECT_REASONS | SURPLUS_REASONS) if f"`{r}`" not in trust]
    assert not missing, missing
    for reason in OFFENCES:
        assert re.search(rf"`{reason}`\s+\(\*offence\*", trust), f"docs/trust.md does not mark {reason} an offence"


def _result_pages() -> list[Path]:
    return sorted(p for p in RESULTS.glob("*.md") if p.name not in ("README.md", "sapo-method.md"))


@pytest.mark.parametrize("page", _result_pages(), ids=lambda p: p.name)
def test_a_results_page_says_question_command_machine_and_date(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    assert text.startswith("# ")
    for part in ("**Question.**", "**Machine and load.**", "**Date and commit.**"):
        assert part in text, f"{page.name} lacks {part}"
    assert re.search(r"\*\*Commands?\.\*\*", text), f"{page.name} gives no command"
    date = text[text.index("**Date and commit.**"):].split("\n\n")[0]
    assert re.search(r"20\d\d-\d\d-\d\d", date) and re.search(r"`[0-9a-f]{7,}`", date), date
    machine = " ".join(text[text.index("**Machine and load.**"):].split("\n\n")[0].split())
    assert re.search(r"load average|idle|not recorded", machine), f"{page.name} does not say the machine's load"
    assert re.search(r"^##.*what (it|they) means?$", text, re.M | re.I), f"{page.name} does not say what it means"


def test_the_results_index_links_every_page_and_every_plot_is_shown() -> None:
    index = (RESULTS / "README.md").read_text(encoding="utf-8")
    for page in RESULTS.glob("*.md"):
        assert page.name == "README.md" or f"]({page.name})" in index, f"results/README.md misses {page.name}"
    shown = "\n".join(p.read_text(encoding="utf-8") for p in RESULTS.glob("*.md"))
    for plot in (RESULTS / "plots").glob("*.png"):
        assert f"](plots/{plot.name})" in shown, f"no results page shows {plot.name}"
    assert not list((ROOT / "docs").glob("*_curves.png")), "plots belong in docs/results/plots/"


def test_the_scripts_index_lists_every_script() -> None:
    index = (ROOT / "scripts" / "README.md").read_text(encoding="utf-8")
    scripts = [p for p in (ROOT / "scripts").rglob("*") if p.suffix in (".py", ".sh") and p.name != "__init__.py"]
    assert len(scripts) > 30
    # named by its path inside its group's folder: `runs.py` in bench/, `sapo/runs.py` in lib/
    missing = [str(p.relative_to(ROOT)) for p in scripts
               if f"`{Path(*p.relative_to(ROOT / 'scripts').parts[1:]) if len(p.relative_to(ROOT / 'scripts').parts) > 1 else p.name}" not in index]
    assert not missing, f"scripts/README.md does not list {missing}"


def test_no_source_file_passes_500_lines() -> None:
    # docs/architecture.md's rule: a file past it is split along its jobs
    roots = [ROOT / name for name in ("protocol", "swarm", "node", "scripts")]
    long = {str(p.relative_to(ROOT)): n for root in roots for p in root.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 500}
    assert not long, long
