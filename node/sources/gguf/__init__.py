"""A ``.gguf`` file as a model folder: ``facts`` reads what the file itself states (its special tokens and
vocabulary), ``convert`` de-quantizes it through transformers and checks the result against those facts,
``repair`` mends what a transformers version is known to get wrong (e.g. the eos token)."""
