"""The policy: ``model`` (base + peft LoRA + trainable norms), ``remix`` (routed LoRA mixture), ``logprobs``
(padding and the log-probs of completions, which the trainer, ingest and the sampling loop share), ``tiny``
and ``small`` (the embedded models, in ``assets/`` with the golden records), ``locate`` (where a model is
loaded from: embedded, a folder or the local Hugging Face cache; light enough to check before torch loads).

It may import config/ and node's leaf modules only.
"""
