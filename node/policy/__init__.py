"""The policy: ``model`` (base + peft LoRA + trainable norms), ``remix/`` (the routed LoRA mixture),
``logprobs`` (padding and the log-probs of completions, which the trainer, ingest and the sampling loop
share) and ``special`` (which tokens end a completion and which it never contains). Where a model comes from
is ``node/sources/``; the fused training pass is ``node/fused/``.

It may import sources/, config/ and node's leaf modules only.
"""
