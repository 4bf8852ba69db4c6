"""Where a model is loaded from: embedded, a folder, or the local Hugging Face cache (never the hub)."""

from __future__ import annotations

import pytest

from node.errors import PolicyError
from node.sources.locate import locate_model, tiny_base_path


def test_embedded_names_and_folders_load_from_disk(tmp_path):
    assert locate_model("tiny-base").path == str(tiny_base_path())
    assert locate_model("embedded").local_files_only is False
    assert locate_model(str(tmp_path)).path == str(tmp_path)


def _fake_cache(cache, repo_id: str) -> None:
    """The hub cache layout: refs/main names a snapshot folder holding the files."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0123abcd")
    (repo / "snapshots" / "0123abcd").mkdir(parents=True)
    (repo / "snapshots" / "0123abcd" / "config.json").write_text("{}")


def test_a_hub_name_in_the_cache_is_loaded_without_asking_the_hub(tmp_path):
    from huggingface_hub import try_to_load_from_cache

    _fake_cache(tmp_path, "someone/small-model")
    where = locate_model("someone/small-model", cache_dir=str(tmp_path))
    assert where.path == "someone/small-model" and where.local_files_only is True
    # The layout read by locate is the hub's own: its lookup finds the same file, and nothing else.
    found = try_to_load_from_cache("someone/small-model", "config.json", cache_dir=str(tmp_path))
    assert found == str(tmp_path / "models--someone--small-model" / "snapshots" / "0123abcd" / "config.json")
    assert try_to_load_from_cache("someone/other", "config.json", cache_dir=str(tmp_path)) is None


def test_a_hub_name_not_in_the_cache_says_how_to_get_it(tmp_path):
    _fake_cache(tmp_path, "someone/small-model")
    with pytest.raises(PolicyError, match=r"nor in the local Hugging Face cache.*`hf download someone/other`"):
        locate_model("someone/other", cache_dir=str(tmp_path))


@pytest.mark.parametrize("name", ["/no/such/folder", "./models/x/y", "a/b/c"])
def test_a_missing_folder_is_named(tmp_path, name):
    with pytest.raises(PolicyError, match="is not a folder"):
        locate_model(name, cache_dir=str(tmp_path))
    file = tmp_path / "config.json"
    file.write_text("{}")
    with pytest.raises(PolicyError, match="is not a folder"):
        locate_model(str(file), cache_dir=str(tmp_path))
