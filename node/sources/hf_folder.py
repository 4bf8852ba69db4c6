"""Writing a tokenizer into a model folder that transformers 4 and 5 and vLLM all load the same way."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# Keys transformers 5 writes from the arguments of the load that produced the tokenizer, not from the
# tokenizer itself: they would make the saved folder claim e.g. local_files_only.
_LOAD_ARGUMENTS = ("is_local", "local_files_only")


def save_tokenizer(tokenizer: Any, out: Path, *, model_max_length: int | None = None) -> None:
    """``tokenizer.save_pretrained(out)``, then its config in the classic keys: the fast tokenizer's own class
    (not transformers 5's alias), ``additional_special_tokens``, and the chat template inside the config,
    where every transformers version looks, instead of a separate ``chat_template.jinja``."""
    tokenizer.save_pretrained(out)
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    extra = config.pop("extra_special_tokens", None)
    if extra is not None or "additional_special_tokens" in config:
        config["additional_special_tokens"] = extra or config.get("additional_special_tokens", [])
    for key in _LOAD_ARGUMENTS:
        config.pop(key, None)
    if model_max_length is not None:
        config["model_max_length"] = model_max_length
    template = out / "chat_template.jinja"
    if template.exists():
        config["chat_template"] = template.read_text()
        template.unlink()
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
