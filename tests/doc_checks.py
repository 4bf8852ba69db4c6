"""What keeps the docs true: every link resolves, every config key and path a page names exists, and every
command a page shows runs (parsed by the real argument parsers, its overrides validated by the config).

The functions take a page's text and return the problems found, one line each, so that a test can run them
on the repository's pages and on a broken example alike (``tests/test_docs.py``).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import get_args

ROOT = Path(__file__).resolve().parent.parent

SECTIONS = "model|adapter|tasks|generation|sampling|train|sapo|ingest|metrics|swarm|tracking|api"
_FILE_SUFFIXES = (".jsonl", ".yaml", ".json", ".py", ".md", ".safetensors")


def doc_pages() -> list[Path]:
    """The pages a user reads: the README, everything under docs/, and the scripts' index."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), ROOT / "scripts" / "README.md"]


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


# ---- links ------------------------------------------------------------------------------------------------

def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*_]|\[|\]\([^)]*\)", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors of a Markdown page's headings (outside code blocks; repeated ones numbered)."""
    seen: dict[str, int] = {}
    out = set()
    for line in _outside_code(text):
        m = re.match(r"#{1,6}\s+(.*)", line)
        if m:
            slug = _slug(m[1])
            out.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
    return out


def _outside_code(text: str) -> Iterator[str]:
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            yield line


def link_problems(path: Path, text: str) -> list[str]:
    """Relative links (and images) that do not resolve, anchors included; links out of the repository."""
    problems = []
    for line in _outside_code(text):
        for target in re.findall(r"\]\(([^)\s]+)\)", line):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            if not dest.exists():
                problems.append(f"{_rel(path)} links to missing {target}")
            elif not dest.is_relative_to(ROOT):
                problems.append(f"{_rel(path)} links out of the repository: {target}")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text(encoding="utf-8")):
                problems.append(f"{_rel(path)} links to {target}, a heading {_rel(dest)} does not have")
    for name in ("DESIGN.md", "ALGORITHMS.md", "REAL_MODEL.md", "../shared"):
        if name in text:
            problems.append(f"{_rel(path)} names {name}, which is not part of the project")
    return problems


# ---- config keys and paths --------------------------------------------------------------------------------

def config_key_exists(path: str) -> bool:
    from node.config import NodeConfig

    cls: object = NodeConfig
    for part in path.split("."):
        fields = getattr(cls, "model_fields", None)
        if fields is None or part not in fields:
            return False
        cls = fields[part].annotation
        models = [a for a in get_args(cls) if hasattr(a, "model_fields")]  # an optional section: X | None
        cls = models[0] if models else cls
    return True


def config_keys_named(text: str) -> set[str]:
    """Dotted config keys a page names in code (`train.lr`) or as an override (train.lr=...)."""
    keys = set(re.findall(rf"`((?:{SECTIONS})\.[a-z0-9_]+(?:\.[a-z0-9_]+)?)", text))
    keys |= set(re.findall(rf"\b((?:{SECTIONS})\.[a-z0-9_]+(?:\.[a-z0-9_]+)?)=", text))
    return {k for k in keys if not k.endswith(_FILE_SUFFIXES)}


def _is_module(name: str) -> bool:
    """``swarm.keys`` is a module of the repository, not a config key."""
    return (ROOT / name.replace(".", "/")).with_suffix(".py").is_file()


def key_problems(path: Path, text: str) -> list[str]:
    return [f"{_rel(path)} names config key {k}, which does not exist"
            for k in sorted(config_keys_named(text)) if not config_key_exists(k) and not _is_module(k)]


_PATH = re.compile(r"(?<![\w/.-])((?:scripts|configs|tests|node|swarm|protocol|docs)/[\w./*-]*[\w*/])")


def path_problems(path: Path, text: str) -> list[str]:
    """Repository paths a page names (`scripts/bench/bench_api.py`, `node/policy/remix/*.py`) that do not exist."""
    problems = []
    for named in sorted(set(_PATH.findall(text))):
        if named.endswith(".") or "..." in named:
            continue
        if not list(ROOT.glob(named.rstrip("/"))):
            problems.append(f"{_rel(path)} names {named}, which does not exist")
    return problems


# ---- commands ---------------------------------------------------------------------------------------------

def shell_commands(text: str) -> list[str]:
    """The command lines of a page's ```bash blocks (continuations joined, heredoc bodies skipped), and
    its inline `swarm-node ...` and `python scripts/...` spans."""
    commands = []
    block: list[str] | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if block is None:
            if stripped in ("```bash", "```sh", "```console"):
                block = []
            continue
        if stripped.startswith("```"):
            commands += _join_lines(block)
            block = None
        else:
            block.append(line)
    for span in re.findall(r"`([^`]+)`", "\n".join(_outside_code(text))):
        span = " ".join(span.split())
        # a command, not a name in prose: a subcommand with arguments, or a script
        if re.match(r"(?:[A-Z_]+=\S+ )*(?:swarm-node (?:silo|start|status|eval|export|keygen|fetch|swarm|host) \S|"
                    r"python scripts/)", span):
            commands.append(span)
    return commands


def _join_lines(lines: list[str]) -> list[str]:
    """Command lines: a trailing backslash continues a line; a heredoc's body is data, not commands."""
    out, current, heredoc = [], "", None
    for line in lines:
        if heredoc is not None:
            heredoc = None if line.strip() == heredoc else heredoc
            continue
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        current += line
        m = re.search(r"<<-?\s*'?(\w+)'?", current)
        heredoc = m[1] if m else None
        out.append(current.strip())
        current = ""
    return [c for c in out if c and not c.startswith("#")]


def _words(command: str) -> list[str]:
    """The command's words, without environment assignments and wrappers (sudo, nice, time)."""
    words = shlex.split(command, comments=True)
    while words:
        if re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]) or words[0] in ("sudo", "exec"):
            words = words[1:]
        elif words[0] == "nice":
            words = words[3:] if words[1:2] == ["-n"] else words[1:]
        elif words[0] in ("time", "/usr/bin/time"):
            words = words[1:]
            while words and words[0].startswith("-"):
                words = words[1:]
        else:
            break
    if words and words[0] in (".venv/bin/swarm-node",):
        words[0] = "swarm-node"
    if words and re.fullmatch(r"(?:\.venv/bin/)?python3?", words[0]):
        words[0] = "python"
    return words


_OVERRIDE = re.compile(rf"(?:seed|run_dir|(?:{SECTIONS})\.[a-z0-9_.]+)=")


def swarm_node_problem(words: list[str]) -> str | None:
    """Why ``swarm-node WORDS...`` would not get past its parser and the config, or None."""
    from node.cli.main import build_parser
    from node.config import load_config
    from node.errors import ConfigError

    parser = build_parser()
    try:
        args = parser.parse_args(words[1:])
    except SystemExit:
        return "the CLI's parser refuses it"
    config = getattr(args, "config", None)
    overrides = list(getattr(args, "overrides", []) or [])
    if args.command == "host":  # a host's config is a HostConfig
        from node.config import load_config_data
        from node.config.host import validate_host_config

        try:
            validate_host_config(load_config_data(ROOT / config if config else None, overrides))
        except ConfigError as exc:
            return str(exc)
        return None
    if config is not None and not config.startswith("configs/"):
        # a run's own config.yaml, which is no file of the repository: the keys must exist at least
        missing = [o.partition("=")[0] for o in overrides if not config_key_exists(o.partition("=")[0])]
        return f"no config key {', '.join(missing)}" if missing else None
    if config is not None and not (ROOT / config).is_file():
        return f"{config} does not exist"
    if config is not None or overrides:
        try:
            load_config(ROOT / config if config else None, overrides)
        except ConfigError as exc:
            return str(exc)
    return None


def command_problems(path: Path, text: str) -> list[str]:
    """Commands a page shows that would not run: swarm-node lines the CLI or config refuse, scripts that do
    not exist, script flags their parsers refuse, config overrides naming no key."""
    problems, scripts = [], []
    for command in shell_commands(text):
        try:
            words = _words(command)
        except ValueError as exc:
            problems.append(f"{_rel(path)}: cannot split {command!r}: {exc}")
            continue
        if not words:
            continue
        if words[0] == "swarm-node":
            why = swarm_node_problem(words)
            if why:
                problems.append(f"{_rel(path)}: `{command}`: {why}")
            continue
        target = words[1] if words[0] == "python" and len(words) > 1 else words[0]
        if not target.startswith("scripts/"):
            continue
        if not (ROOT / target).is_file():
            problems.append(f"{_rel(path)}: `{command}`: {target} does not exist")
            continue
        for word in words[2:] if words[0] == "python" else words[1:]:
            key = word.partition("=")[0]
            if _OVERRIDE.match(word) and not config_key_exists(key):
                problems.append(f"{_rel(path)}: `{command}`: {key} is no config key")
        if words[0] == "python" and target.endswith(".py"):
            scripts.append((command, target, words[2:]))
    problems += [f"{_rel(path)}: `{c}`: {why}" for c, why in script_flag_problems(scripts)]
    return problems


_PARSE_ONLY = r"""
import argparse, contextlib, io, json, runpy, sys
class Parsed(Exception):
    pass
parse_args = argparse.ArgumentParser.parse_args
def parse_only(self, args=None, namespace=None):
    parse_args(self, args, namespace)
    raise Parsed
argparse.ArgumentParser.parse_args = parse_only
out = []
for command, script, argv in json.loads(sys.stdin.read()):
    sys.argv, err = [script, *argv], io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            runpy.run_path(script, run_name="__main__")
        out.append([command, "ran without parsing its arguments"])
    except Parsed:
        pass
    except SystemExit as exc:
        if exc.code not in (0, None):
            lines = err.getvalue().strip().splitlines()
            out.append([command, lines[-1] if lines else f"exit {exc.code}"])
    except Exception as exc:
        out.append([command, f"{type(exc).__name__}: {exc}"])
print(json.dumps(out))
"""


def script_flag_problems(scripts: list[tuple[str, str, list[str]]]) -> list[tuple[str, str]]:
    """Run each script's own argument parser on the flags a page gives it, and stop there (nothing else of
    the script runs): all in one process, so the heavy imports are paid once."""
    if not scripts:
        return []
    run = subprocess.run([sys.executable, "-c", _PARSE_ONLY], input=json.dumps(scripts), cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    if run.returncode != 0:
        return [(scripts[0][0], f"the parse-only run failed: {run.stderr.strip()[-500:]}")]
    return [(c, why) for c, why in json.loads(run.stdout.strip().splitlines()[-1])]
