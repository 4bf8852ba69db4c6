"""The node daemon: it composes ``protocol/`` and ``swarm/`` with a policy, tasks and a trainer.

One folder a job, listed from the top down; a folder imports only folders below it (held by
tests/test_layering.py, which prints the order):

- ``cli/``: the ``swarm-node`` command, one module a verb (``train``: silo and start, ``evaluate``, ``export``,
  ``doctor``, ``fetch``, ``status``, ``keygen``, ``swarm``, ``host``).
- ``run/``: the run loop (``Node``: setup, run, one step, close), the daemon, checkpoints, trackers, the run dir.
- ``api/``: the status API, Prometheus ``/metrics``, the dashboard, ``swarm-node status``; the metrics file.
- ``exchange/``: the peer path: our groups out as signed records, peers' records in, checked, re-scored and
  re-tokenized into training groups within per-step budgets.
- ``generation/``: tasks to scored groups; the sampling loop and the backends behind one interface.
- ``train/``: advantages, losses and the SAPO sampler (pure functions) and the ``Trainer``.
- ``policy/``: base model loading and checks, LoRA, ReMix, the log-probs of completions, the embedded models.
- ``config/``: the typed configuration (YAML plus ``a.b=value`` overrides), a host's and a member's settings.
- ``tasks/``: verifiable task sources regenerated from a ``TaskRef``.
- leaf modules: ``errors`` (the error roots), ``modes`` (every mode ``Literal``), ``failpoints`` (crash tests).
"""
