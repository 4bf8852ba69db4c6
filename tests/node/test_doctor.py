"""``swarm-node doctor`` prints the stack and passes on the shipped models; a model folder with a swapped eos or
changed weights makes it exit 1 with one FAIL line per failure. (scripts/test.sh runs it on the fetched
smollm2-135m too.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from node.cli import doctor, main
from tests.node.test_model_check import copy_folder, edit_json

REPO_ROOT = Path(__file__).resolve().parents[2]
TINY = REPO_ROOT / "node" / "sources" / "assets" / "tiny-base"


def test_doctor_prints_the_stack_and_passes_on_a_shipped_model() -> None:
    proc = subprocess.run([sys.executable, "-m", "node.cli", "doctor", "--model", "tiny-base", "--no-vllm"],
                          capture_output=True, text=True, cwd=REPO_ROOT, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    for start in ("python ", "torch ", "libraries     transformers ", "device        cpu", "dtypes        float32"):
        assert any(line.startswith(start) for line in lines), (start, lines)
    assert any(line.startswith("ok   tiny-base: tokenizer (16 strings") for line in lines), lines
    assert lines[-1].startswith("swarm-node doctor: all checks pass")


def _run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], folder: Path) -> tuple[int, list[str]]:
    monkeypatch.setattr(doctor, "models_to_check", lambda names: [("tiny-base", folder)])
    code = doctor.run_doctor(["tiny-base"], device_name="cpu", vllm=False)
    return code, [line for line in capsys.readouterr().out.splitlines() if line.startswith("FAIL")]


def test_doctor_fails_on_a_tokenizer_that_disagrees(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    folder = copy_folder(TINY, tmp_path / "tiny")
    assert _run(monkeypatch, capsys, folder) == (0, [])
    edit_json(folder / "tokenizer_config.json", lambda c: c.update(eos_token="<bos>"))
    code, failures = _run(monkeypatch, capsys, folder)
    assert code == doctor.EXIT_FAILED and failures[0] == (
        "FAIL tiny-base: the tokenizer's eos_token_id ('<bos>') is 1 where config.json's eos_token_id states 2")
    assert any("eos_token is {'token': '<bos>', 'id': 1} where the golden record" in f for f in failures)


def test_doctor_fails_on_changed_weights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "tiny"
    folder.mkdir()
    for file in TINY.iterdir():
        (folder / file.name).write_bytes(file.read_bytes())
    weights = load_file(folder / "model.safetensors")
    name = next(n for n in weights if n.endswith("layers.1.mlp.down_proj.weight"))
    weights[name] = weights[name] * 1.01  # a 1% change, as a wrong de-quantization or a bad kernel could give
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    code, failures = _run(monkeypatch, capsys, folder)
    assert code == doctor.EXIT_FAILED and len(failures) == 2  # one line for each of the two prompts
    assert failures[0].startswith("FAIL tiny-base: prompt 0: logit of the greedy token at new token 0 is ")
    assert failures[0].endswith("where the golden record states "
                                f"{json.loads((REPO_ROOT / 'node/sources/assets/golden/tiny-base.json').read_text())['greedy'][0]['top_logits'][0][0]} "
                                "(float32 on cpu, tolerance 0.001)")


def test_doctor_names_a_model_it_has_no_record_of_as_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--model", "nope", "--no-vllm"]) == 2
    assert "--model 'nope': doctor checks the models it has golden records of: tiny-base" in capsys.readouterr().err


def test_a_float32_cpu_forward_reproduces_the_stored_logits_within_half_of_doctors_tolerance() -> None:
    """Doctor's CPU tolerance has room: the shipped model's stored logits come back within half of it (a
    machine whose kernels sum in another order differs by far less; a 1% weight change, above, by more)."""
    from transformers import AutoModelForCausalLM

    from node.sources.golden import LOGIT_TOLERANCE, compare_greedy, load_golden

    golden = load_golden("tiny-base")
    assert golden is not None
    tolerance = LOGIT_TOLERANCE["cpu"]
    model = AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32).eval()
    for stored in golden["greedy"]:
        differences, largest = compare_greedy(model, stored, tolerance)
        assert differences == [] and largest <= tolerance / 2, largest
