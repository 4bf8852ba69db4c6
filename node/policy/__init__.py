"""The policy: ``model`` (base + peft LoRA + trainable norms), ``remix`` (routed LoRA mixture),
``tiny`` (the embedded default model and its character tokenizer)."""
