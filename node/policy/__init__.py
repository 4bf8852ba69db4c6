"""The policy: ``model`` (base + peft LoRA + trainable norms), ``remix`` (routed LoRA mixture),
``tiny`` (the embedded default model and its character tokenizer), ``locate`` (where a model is loaded
from: embedded, a folder or the local Hugging Face cache; light enough to check before torch loads)."""
