"""A GGUF file into a plain Hugging Face folder the node (and vLLM) loads: de-quantized weights in float32
safetensors, the tokenizer with its chat template, the generation config, and ``build_info.json``.

transformers reads a GGUF with ``from_pretrained(folder, gguf_file=...)`` (the ``gguf`` package de-quantizes
it), but a model loaded that way refuses ``save_pretrained``; a plain model built from its config takes its
state dict, key for key, and saves normally. Before that, the file's header is read (cheap, memory-mapped)
so an architecture or a quantization that cannot be de-quantized is a one-line error naming what can.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from node.errors import PolicyError
from node.sources.cache import DONE_FILE, echo_stderr
from node.sources.check import check_agreement, check_golden, check_lossless, check_source, refuse
from node.sources.gguf.facts import SourceTokenizer, read_source_tokenizer
from node.sources.gguf.repair import repair_from_source
from node.sources.hf_folder import save_tokenizer

# GGUF architectures transformers maps to its own model classes that are decoder-only language models
# (the mapping also covers encoder-decoders, which the node cannot train).
_NOT_CAUSAL = frozenset({"general", "tokenizer", "t5", "umt5"})
_PLAIN_TYPES = frozenset({"F32", "F16", "BF16"})


def supported_architectures() -> list[str]:
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    return sorted(set(GGUF_CONFIG_MAPPING) - _NOT_CAUSAL)


def supported_quantizations() -> list[str]:
    from gguf import quants

    return sorted(_PLAIN_TYPES | {t.name for t in quants._type_traits})


def read_header(path: Path) -> tuple[str, dict[str, int]]:
    """The GGUF's architecture and its tensors' storage types with counts; ``PolicyError`` if unreadable."""
    try:
        from gguf import GGUFReader

        reader = GGUFReader(path)
        field = reader.fields["general.architecture"]
        architecture = bytes(field.parts[field.data[0]]).decode("utf-8")
    except ImportError:
        raise PolicyError("reading a GGUF file needs the gguf package: pip install gguf") from None
    except (KeyError, ValueError, OSError) as exc:
        raise PolicyError(f"{path.name} is not a readable GGUF file ({exc})") from None
    types: dict[str, int] = {}
    for tensor in reader.tensors:
        types[tensor.tensor_type.name] = types.get(tensor.tensor_type.name, 0) + 1
    return architecture, types


def check_supported(path: Path) -> tuple[str, dict[str, int]]:
    """Raise a one-line ``PolicyError`` when ``path``'s architecture or quantization cannot be converted."""
    architecture, types = read_header(path)
    archs = supported_architectures()
    if architecture not in archs:
        raise PolicyError(f"{path.name}: GGUF architecture {architecture!r} cannot be converted (transformers "
                          f"de-quantizes decoder-only {', '.join(archs)})")
    quants = supported_quantizations()
    unknown = sorted(set(types) - set(quants))
    if unknown:
        raise PolicyError(f"{path.name}: tensor types {unknown} cannot be de-quantized (the gguf package "
                          f"handles {', '.join(quants)})")
    return architecture, types


def load_from_gguf(path: Path, dtype: torch.dtype = torch.float32) -> tuple[Any, Any]:
    """The tokenizer and model transformers builds from the GGUF (model in eval mode)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype)
    model.eval()
    return tokenizer, model


def plain_copy(loaded: Any, dtype: torch.dtype = torch.float32) -> Any:
    """A model of the same class without the GGUF quantization record, holding ``loaded``'s weights."""
    from transformers import AutoModelForCausalLM

    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config, dtype=dtype)
    plain.load_state_dict(loaded.state_dict(), strict=True, assign=True)
    plain.tie_weights()
    plain.generation_config = loaded.generation_config
    plain.eval()
    return plain


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    return {pkg: md.version(pkg) for pkg in ("transformers", "gguf", "torch", "tokenizers", "safetensors")}


def check_conversion(out: Path, source_tokenizer: SourceTokenizer, *, name: str, golden_name: str | None) -> None:
    """Load the tokenizer written to ``out`` and raise a one-line ``PolicyError`` if anything differs from what
    the GGUF states (every token, special ids, chat template, lossless decoding of a byte-level BPE), from its
    golden record, or between the tokenizer and the written configs."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(out)
    findings = check_source(tokenizer, source_tokenizer) + check_agreement(out, tokenizer)
    if source_tokenizer.model == "gpt2":
        findings += check_lossless(tokenizer)
    if golden_name is not None:
        findings += check_golden(tokenizer, golden_name)
    refuse(findings, model=name, folder=None,
           fix="this library version cannot convert the GGUF faithfully; use the versions scripts/test.sh installs")


def convert_gguf(path: Path, out: Path, *, name: str, source: dict[str, Any], gguf_sha256: str,
                 golden_name: str | None = None, echo: Callable[[str], None] = echo_stderr) -> dict[str, Any]:
    """Convert the GGUF at ``path`` into the folder ``out`` (``build_info.json`` last); return that record.

    Where the library's conversion disagrees with a field the GGUF states, the GGUF's value is taken (listed in
    ``build_info.json`` as ``repaired``); the written folder is then checked against the GGUF and, for a model
    the repository holds golden ids of (``golden_name``), against those."""
    started = time.perf_counter()
    architecture, types = check_supported(path)
    echo(f"{name}: de-quantizing {sum(types.values())} tensors ({', '.join(f'{n} {t}' for t, n in sorted(types.items()))}) "
         f"of a {architecture} GGUF to float32")
    try:
        tokenizer, loaded = load_from_gguf(path)
    # the library failing on this file: a Llama GGUF named exactly "mistral" (5.19), a llama-architecture GGUF
    # that states an eos and no bos (5.17 reads a bos id it does not have: AttributeError)
    except (NotImplementedError, ValueError, KeyError, AttributeError, TypeError, IndexError) as exc:
        first = (str(exc).strip().splitlines() or [""])[0][:160]
        raise PolicyError(f"{path.name}: transformers {_versions()['transformers']} cannot convert this {architecture} "
                          f"GGUF ({type(exc).__name__}: {first}); a newer transformers may (scripts/test.sh "
                          "installs the newest the project admits)") from None
    source_tokenizer = read_source_tokenizer(path)
    model = plain_copy(loaded)
    del loaded
    repairs = repair_from_source(tokenizer, model, source_tokenizer)
    for repair in repairs:
        echo(f"{name}: transformers {_versions()['transformers']} converted {repair['field']} as {repair['library']!r} "
             f"where the GGUF states {repair['gguf']!r}; taking the GGUF's")
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    save_tokenizer(tokenizer, out, model_max_length=getattr(model.config, "max_position_embeddings", None))
    for file in out.iterdir():
        file.chmod(0o644)  # safetensors writes 0600; the cache is the user's, readable like any model folder
    check_conversion(out, source_tokenizer, name=name, golden_name=golden_name)
    info = {
        "name": name,
        "source": source,
        "gguf_sha256": gguf_sha256,
        "gguf_bytes": path.stat().st_size,
        "architecture": architecture,
        "gguf_tensor_types": types,
        "model_type": model.config.model_type,
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tokenizer),
        "dtype": "float32",
        "chat_template": bool(getattr(tokenizer, "chat_template", None)),
        "source_tokenizer": source_tokenizer.summary(),
        "repaired": repairs,
        "versions": _versions(),
        "convert_seconds": round(time.perf_counter() - started, 1),
    }
    (out / DONE_FILE).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    echo(f"{name}: {info['parameters']:,} parameters, vocabulary {info['vocab_size']:,}, converted in "
         f"{info['convert_seconds']} s")
    return info
