"""A model folder is checked against what its source states (``node.sources.check``), whatever library
converted it: each invariant broken one at a time in a copy of the real smollm2 folder is found, a folder
whose tokenizer and configs disagree is refused in one line by ``silo``, ``start`` and ``eval``, and a
cached conversion that fails is converted again by ``swarm-node fetch``."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from node.errors import PolicyError
from node.sources.cache import DONE_FILE
from node.sources.check import check_folder, check_source
from node.sources.gguf.facts import read_source_tokenizer
from node.sources.gguf.repair import repair_from_source
from node.sources.golden import load_golden, tokenizer_record
from tests.node.tiny_gguf import CHAT_TEMPLATE, write_tiny_gguf

REPO_ROOT = Path(__file__).resolve().parents[2]
SMOLLM2 = "smollm2-135m"


def copy_folder(source: Path, dest: Path) -> Path:
    """A copy of a model folder whose weights are a link to the original's (the checks read no weights)."""
    dest.mkdir(parents=True)
    for file in source.iterdir():
        if file.suffix == ".safetensors":
            (dest / file.name).symlink_to(file)
        else:
            shutil.copy(file, dest / file.name)
    return dest


def edit_json(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    change(data)
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")


def findings_of(folder: Path) -> list[str]:
    return [f.line() for f in check_folder(folder, AutoTokenizer.from_pretrained(folder), golden_name=SMOLLM2)]


def test_the_golden_record_matches_the_fetched_folder(smollm2: Path) -> None:
    golden = load_golden(SMOLLM2)
    assert golden is not None and findings_of(smollm2) == []
    assert golden["tokenizer"]["special"]["eos"] == {"token": "<|im_end|>", "id": 2}
    assert tokenizer_record(AutoTokenizer.from_pretrained(smollm2)) == golden["tokenizer"]


def _swap_eos(folder: Path) -> None:  # what transformers 5.17 writes for SmolLM2's GGUF
    edit_json(folder / "tokenizer_config.json", lambda c: c.update(eos_token="<|im_start|>"))


def _config_eos(folder: Path) -> None:
    edit_json(folder / "config.json", lambda c: c.update(eos_token_id=0))


def _generation_eos(folder: Path) -> None:
    edit_json(folder / "generation_config.json", lambda c: c.update(eos_token_id=[0, 1]))


def _pad(folder: Path) -> None:
    edit_json(folder / "tokenizer_config.json", lambda c: c.update(pad_token="<|endoftext|>"))


def _bos(folder: Path) -> None:
    edit_json(folder / "tokenizer_config.json", lambda c: c.update(bos_token="<|endoftext|>"))


def _unk(folder: Path) -> None:
    edit_json(folder / "tokenizer_config.json", lambda c: c.update(unk_token="<|im_end|>"))


def _vocabulary_entry(folder: Path) -> None:  # two tokens trade ids: each id now spells another string
    def swap(t: dict[str, Any]) -> None:
        vocab = t["model"]["vocab"]
        a, b = (next(k for k, v in vocab.items() if v == i) for i in (49150, 49151))
        vocab[a], vocab[b] = vocab[b], vocab[a]

    edit_json(folder / "tokenizer.json", swap)


def _pre_tokenizer(folder: Path) -> None:  # encodings change: a space before every text
    edit_json(folder / "tokenizer.json", lambda t: t["pre_tokenizer"].update(add_prefix_space=True))


def _merges(folder: Path) -> None:  # encodings change: digits pairs no longer merge
    def drop(t: dict[str, Any]) -> None:
        t["model"]["merges"] = t["model"]["merges"][:100]

    edit_json(folder / "tokenizer.json", drop)


def _decoder(folder: Path) -> None:  # decoding changes: spaces lost, as a sentencepiece decoder on byte-level BPE
    edit_json(folder / "tokenizer.json", lambda t: t.update(decoder={
        "type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "Ġ"}, "content": ""},
                                         {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                                          "use_regex": True}]}))


def _chat_template(folder: Path) -> None:
    edit_json(folder / "tokenizer_config.json",
              lambda c: c.update(chat_template=c["chat_template"].replace("message['role'] + ", "message['role'] + ' ' + ")))


@pytest.mark.parametrize(("breaks", "named"), [
    (_swap_eos, "eos_token_id ('<|im_start|>') is 1 where config.json's eos_token_id states 2"),
    (_config_eos, "eos_token_id ('<|im_end|>') is 2 where config.json's eos_token_id states 0"),
    (_generation_eos, "eos_token_id ('<|im_end|>') is 2 where generation_config.json's eos_token_id states [0, 1]"),
    (_pad, "pad_token_id ('<|endoftext|>') is 0 where config.json's pad_token_id states 2"),
    (_bos, "bos_token_id ('<|endoftext|>') is 0 where config.json's bos_token_id states 1"),
    (_unk, "unk_token is {'token': '<|im_end|>', 'id': 2} where the golden record"),
    (_vocabulary_entry, "vocab_sha256 is"),
    (_pre_tokenizer, "ids of '0123456789' is [216, 32, "),
    (_merges, "ids of '-17 * 2 = -34, 100/4=25 and 2^10 = 1024' is"),
    (_decoder, "decoding of '3 + 4 = 7.' is '3+4=7.' where the golden record"),
    (_chat_template, "chat_ids is"),
], ids=lambda v: v.__name__.strip("_") if callable(v) else "")
def test_each_broken_invariant_is_found(smollm2: Path, tmp_path: Path, breaks: Callable[[Path], None],
                                        named: str) -> None:
    folder = copy_folder(smollm2, tmp_path / "broken")
    breaks(folder)
    found = findings_of(folder)
    assert any(named in line for line in found), found


def test_what_a_conversion_recorded_of_its_gguf_is_checked_later(smollm2: Path, tmp_path: Path) -> None:
    """A cached conversion without its GGUF is checked against the summary its build_info.json keeps."""
    folder = copy_folder(smollm2, tmp_path / "cached")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    stated = {"model": "gpt2", "pre": "smollm", "n_tokens": 49152,
              "vocab_sha256": load_golden(SMOLLM2)["tokenizer"]["vocab_sha256"],  # type: ignore[index]
              "special_ids": {"bos": 1, "eos": 2, "pad": 2, "unk": 0}, "add_bos_token": False,
              "chat_template": tokenizer.chat_template}
    edit_json(folder / DONE_FILE, lambda info: info.update(source_tokenizer=stated))
    assert check_folder(folder, tokenizer) == []
    edit_json(folder / DONE_FILE, lambda info: info["source_tokenizer"]["special_ids"].update(eos=1))
    [finding] = check_folder(folder, tokenizer)
    assert finding.line() == "eos_token_id is 2 where its GGUF's tokenizer.ggml.eos_token_id states 1"


def test_the_gguf_is_the_source_of_the_special_ids_and_every_token(tmp_path: Path) -> None:
    from node.sources.gguf.convert import load_from_gguf

    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    source = read_source_tokenizer(gguf)
    assert source.special_ids == {"bos": 1, "eos": 2, "pad": 2, "unk": 0} and source.model == "gpt2"
    tokenizer, model = load_from_gguf(gguf)
    found = [f.what for f in check_source(tokenizer, source)]
    repaired = repair_from_source(tokenizer, model, source)
    # Each finding repaired and no other field of the tokenizer: none with 5.19, the swapped eos with 5.17.
    assert [f"{r['field']}_id" if r["field"].endswith("_token") else r["field"] for r in repaired
            if r["field"].endswith("_token") or r["field"] == "chat_template"] == found
    assert check_source(tokenizer, source) == []
    tokenizer.eos_token = "<|im_start|>"
    assert [f.line() for f in check_source(tokenizer, source)] == [
        "eos_token_id is 1 where the GGUF's tokenizer.ggml.eos_token_id states 2"]
    assert repair_from_source(tokenizer, model, source) == [
        {"field": "eos_token", "library": {"token": "<|im_start|>", "id": 1}, "gguf": {"token": "<|im_end|>", "id": 2}}]
    assert tokenizer.eos_token_id == 2 and check_source(tokenizer, source) == []
    changed = read_source_tokenizer(write_tiny_gguf(tmp_path / "other.gguf"))
    object.__setattr__(changed, "tokens", [*changed.tokens[:-1], "lx"])  # type: ignore[misc]
    tokenizer.eos_token = "<|im_end|>"
    assert [f.line() for f in check_source(tokenizer, changed)] == [
        f"token {changed.n_tokens - 1} is 'll' where the GGUF's token list states 'lx'"]


def test_a_gguf_known_by_its_summary_is_checked_by_its_vocabulary_hash_and_whether_it_adds_a_bos(
        tmp_path: Path) -> None:
    """What a conversion records of its GGUF (``build_info.json``) keeps the vocabulary's sha256, not its
    tokens, and whether the GGUF adds a BOS: a vocabulary of the same size with one token respelled, and a
    tokenizer that adds a BOS where its GGUF says it does not (or the other way round), are found."""
    from node.sources.gguf.convert import load_from_gguf
    from node.sources.gguf.facts import SourceTokenizer, tokens_sha256

    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    source = read_source_tokenizer(gguf)
    assert source.tokens is not None
    tokenizer, model = load_from_gguf(gguf)
    repair_from_source(tokenizer, model, source)  # as a conversion does first (5.17 swaps the tiny GGUF's eos)
    summary = SourceTokenizer.from_summary(source.summary())
    assert summary.tokens is None and summary.add_bos_token is None and check_source(tokenizer, summary) == []
    respelled = [*source.tokens[:-1], "lx"]  # as many tokens; the last one ('ll') spelled otherwise
    other = dataclasses.replace(summary, vocab_sha256=tokens_sha256(respelled))
    assert [f.line() for f in check_source(tokenizer, other)] == [
        f"vocabulary sha256 is {tokens_sha256(source.tokens)[:16]!r} where the GGUF's token list states "
        f"{tokens_sha256(respelled)[:16]!r}"]
    adds = tokenizer("a")["input_ids"][0] == tokenizer.bos_token_id  # 5.19: no BOS (the tiny GGUF states none)
    assert check_source(tokenizer, dataclasses.replace(summary, add_bos_token=adds)) == []
    assert [f.line() for f in check_source(tokenizer, dataclasses.replace(summary, add_bos_token=not adds))] == [
        f"adds BOS is {adds} where the GGUF's tokenizer.ggml.add_bos_token states {not adds}"]


@pytest.mark.parametrize("command", [
    ["silo", "-c", "configs/tiny-silo.yaml", "--no-progress"],
    ["start", "-c", "configs/tiny-silo.yaml", "--no-progress"],
    ["eval", "--n", "2"],
])
def test_a_folder_whose_tokenizer_and_config_disagree_is_refused_in_one_line(tmp_path: Path,
                                                                             command: list[str]) -> None:
    folder = copy_folder(REPO_ROOT / "node" / "sources" / "assets" / "tiny-base", tmp_path / "model")
    edit_json(folder / "tokenizer_config.json", lambda c: c.update(eos_token="<bos>"))
    if command[0] == "eval":
        command = [*command, "--model", str(folder)]
    else:
        command = [*command, "--run-dir", str(tmp_path / "run"), f"model.name_or_path={folder}"]
    proc = subprocess.run([sys.executable, "-m", "node.cli", *command], capture_output=True, text=True,
                          cwd=REPO_ROOT, timeout=300)
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith(f"swarm-node: error: model {folder}: the tokenizer's eos_token_id ('<bos>') is 1 where "
                           "config.json's eos_token_id states 2"), line
    assert "transformers 5" in line and not (tmp_path / "run").exists()


def test_fetch_converts_again_a_cached_folder_that_fails_its_checks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    smollm2: Path) -> None:
    """A cache written by a library that swapped the eos: the node refuses it, and `swarm-node fetch` (which
    would otherwise return it as it is) makes it again."""
    from node.config import ModelConfig
    from node.policy.model import load_base
    from node.sources import fetched

    model = fetched.registry_model(SMOLLM2)
    assert model is not None
    monkeypatch.setenv("SWARM_NODE_CACHE", str(tmp_path / "cache"))
    bad = copy_folder(smollm2, model.path)
    _swap_eos(bad)
    with pytest.raises(PolicyError, match=r"eos_token_id .* run `swarm-node fetch smollm2-135m` to convert it again"):
        load_base(ModelConfig(name_or_path=SMOLLM2))
    made: list[Path] = []

    def convert(_path: Path, out: Path, **_kw: Any) -> None:  # stands in for the download and conversion
        copy_folder(smollm2, out / "x")
        for file in (out / "x").iterdir():
            file.rename(out / file.name)
        made.append(out)

    def download(_model: Any, dest: Path, echo: Any) -> Path:
        (dest / "model.gguf").write_bytes(b"")
        return dest / "model.gguf"

    monkeypatch.setattr(fetched, "download_member", download)
    monkeypatch.setattr("node.sources.gguf.convert.convert_gguf", convert)
    lines: list[str] = []
    assert fetched.fetch(model, echo=lines.append) == model.path and made == []  # no recheck: as it is
    assert fetched.fetch(model, echo=lines.append, recheck=True) == model.path and len(made) == 1
    assert "the cached folder fails its checks (the tokenizer's eos_token_id" in lines[0]
    assert findings_of(model.path) == []


def _converting_as_5_17(monkeypatch: pytest.MonkeyPatch, *, vocabulary: bool = False, configs: bool = False) -> None:
    """The GGUF's tokenizer as transformers 5.17 builds SmolLM2's: eos <|im_start|>, no pad, a text clean-up
    and a sentencepiece-style decoder; with ``vocabulary``, also a token respelled (not repairable); with
    ``configs``, also the model's config and generation config given the same eos and no pad, and the chat
    template without its generation prompt."""
    from tokenizers import decoders

    from node.sources.gguf import convert as gguf_import

    real = gguf_import.load_from_gguf

    def load(path: Path, dtype: Any = None) -> Any:
        tokenizer, model = real(path)
        tokenizer.eos_token = "<|im_start|>"
        tokenizer.pad_token = None
        tokenizer.clean_up_tokenization_spaces = True
        tokenizer.backend_tokenizer.decoder = decoders.Sequence([decoders.Replace("Ġ", ""), decoders.ByteLevel()])
        if vocabulary:
            tokenizer.add_tokens(["<extra>"])
        if configs:
            for holder in (model.config, model.generation_config):
                holder.bos_token_id, holder.eos_token_id, holder.pad_token_id = 1, 1, None
            tokenizer.chat_template = CHAT_TEMPLATE[:CHAT_TEMPLATE.index("{% if add_generation_prompt")]
        return tokenizer, model

    monkeypatch.setattr(gguf_import, "load_from_gguf", load)


def test_a_conversion_takes_the_gguf_value_of_each_field_the_library_got_wrong(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from node.sources.fetched import convert_local_gguf

    monkeypatch.setenv("SWARM_NODE_CACHE", str(tmp_path / "cache"))
    _converting_as_5_17(monkeypatch)
    lines: list[str] = []
    folder = convert_local_gguf(write_tiny_gguf(tmp_path / "tiny.gguf"), echo=lines.append)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert (tokenizer.eos_token_id, tokenizer.pad_token_id) == (2, 2) and check_folder(folder, tokenizer) == []
    assert tokenizer.decode(tokenizer("he ll")["input_ids"]) == "he ll"
    info = json.loads((folder / DONE_FILE).read_text())
    assert [r["field"] for r in info["repaired"]] == ["eos_token", "pad_token", "clean_up_tokenization_spaces", "decoder"]
    assert info["repaired"][0] == {"field": "eos_token", "library": {"token": "<|im_start|>", "id": 1},
                                   "gguf": {"token": "<|im_end|>", "id": 2}}
    assert info["source_tokenizer"]["special_ids"] == {"bos": 1, "eos": 2, "pad": 2, "unk": 0}
    assert any("converted eos_token as {'token': '<|im_start|>', 'id': 1} where the GGUF states" in line
               for line in lines)


def test_a_conversion_takes_the_gguf_ids_in_both_configs_and_its_chat_template(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from node.sources.fetched import convert_local_gguf

    monkeypatch.setenv("SWARM_NODE_CACHE", str(tmp_path / "cache"))
    _converting_as_5_17(monkeypatch, configs=True)
    folder = convert_local_gguf(write_tiny_gguf(tmp_path / "tiny.gguf"), echo=lambda _line: None)
    info = json.loads((folder / DONE_FILE).read_text())
    broken_template = CHAT_TEMPLATE[:CHAT_TEMPLATE.index("{% if add_generation_prompt")]
    assert info["repaired"][2:7] == [  # after the tokenizer's eos and pad, before its decoding
        {"field": "config.eos_token_id", "library": 1, "gguf": 2},
        {"field": "config.pad_token_id", "library": None, "gguf": 2},
        {"field": "generation_config.eos_token_id", "library": 1, "gguf": 2},
        {"field": "generation_config.pad_token_id", "library": None, "gguf": 2},
        {"field": "chat_template", "library": broken_template, "gguf": CHAT_TEMPLATE}]
    assert [r["field"] for r in info["repaired"]] == [
        "eos_token", "pad_token", "config.eos_token_id", "config.pad_token_id", "generation_config.eos_token_id",
        "generation_config.pad_token_id", "chat_template", "clean_up_tokenization_spaces", "decoder"]
    # The files written hold the GGUF's values (bos was right and stays).
    config, generation = (json.loads((folder / f).read_text()) for f in ("config.json", "generation_config.json"))
    assert [config[f"{n}_token_id"] for n in ("bos", "eos", "pad")] == [1, 2, 2]
    assert [generation[f"{n}_token_id"] for n in ("bos", "eos", "pad")] == [1, 2, 2]
    assert AutoTokenizer.from_pretrained(folder).chat_template == CHAT_TEMPLATE


def test_a_conversion_that_cannot_be_repaired_is_refused_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from node.sources.fetched import convert_local_gguf, gguf_cache_key

    monkeypatch.setenv("SWARM_NODE_CACHE", str(tmp_path / "cache"))
    _converting_as_5_17(monkeypatch, vocabulary=True)
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    with pytest.raises(PolicyError) as caught:
        convert_local_gguf(gguf, echo=lambda _line: None)
    message = str(caught.value)
    assert "\n" not in message and message.startswith("model tiny: vocabulary size is 262 where the GGUF's token "
                                                      "list states 261 [transformers ")
    assert not (tmp_path / "cache" / gguf_cache_key(gguf)).exists()


def test_a_byte_level_token_written_in_raw_text_is_compared_as_transformers_spells_it(tmp_path: Path) -> None:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    from node.sources.gguf.convert import load_from_gguf
    from node.sources.gguf.facts import _BYTE_ALPHABET

    assert bytes_to_unicode() == _BYTE_ALPHABET
    gguf = write_tiny_gguf(tmp_path / "raw.gguf", extra_tokens=(" x",))  # a space, not the alphabet's 'Ġ'
    source = read_source_tokenizer(gguf)
    assert source.tokens is not None and source.tokens[-1] == "Ġx"
    tokenizer, model = load_from_gguf(gguf)
    repair_from_source(tokenizer, model, source)
    found = [f.line() for f in check_source(tokenizer, source)]
    if tokenizer.convert_ids_to_tokens(261) == "Ġx":  # transformers 5.19 spells it in the byte alphabet
        assert found == []
    else:  # 5.17 keeps ' x', which its byte-level pre-tokenizer never produces: refused, not trained on
        assert found == ["token 261 is ' x' where the GGUF's token list states 'Ġx'"]
