"""The node daemon: it composes ``protocol/`` and ``swarm/`` with a policy, tasks and a trainer.

- ``config``: the typed configuration (YAML plus ``a.b=value`` overrides) and ``ConfigError``.
- ``cli``: the ``swarm-node`` command (``silo``, ``start``, ``status``, ``keygen``).
- ``runner``: ``Node``, the lifecycle (``setup``, ``run``, ``close``) and one training step.
- ``daemon``: ``swarm-node start``: a ``Node`` joined to a swarm.
- ``exchange`` / ``ingest``: our groups as signed records out; peers' records in, checked, re-scored and
  re-tokenized for our policy within per-step budgets.
- ``scoring``: peers' completions scored in a child process with a time limit per completion.
- ``rollouts`` / ``generation``: tasks to scored groups; the node's own sampling loop with behaviour
  log-probs.
- ``engines/``: the generation backends behind one interface (``hf``: the node's loop; ``vllm``: an
  in-process vLLM engine kept in step with the policy).
- ``checkpoint`` / ``metrics``: atomic checkpoints (a damaged one falls back to the previous); the metrics
  sink (JSONL) and its Prometheus form. ``rundir``: the run dir, checked writable before anything heavy loads.
- ``api/``: the status API, Prometheus ``/metrics`` and the dashboard (``api.port``), ``swarm-node status``.
- ``policy/``: base model loading, LoRA, ReMix, the embedded tiny model.
- ``tasks/``: verifiable task sources regenerated from a ``TaskRef``.
- ``train/``: advantages, losses and the SAPO sampler (pure functions) and the ``Trainer``.
"""
