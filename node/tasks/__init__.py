"""Verifiable tasks, named by ``TaskRef`` so any node regenerates and scores them itself.

- ``base``: ``Task``, ``TaskError``, the ``TaskSource`` interface (regenerate, sample, held-out eval refs,
  score, format the prompt) and the ``build_task_source`` factory.
- ``arith``: the built-in two-digit ``add``/``sub``/``mul`` source (text format in ``arith_format``).
- ``reasoning_gym``: the nine reasoning-gym datasets of the SAPO paper, scored by reasoning-gym itself.
- ``prompting``: chat-template or plain prompt formatting, and final-answer extraction.
- ``cache``: the LRU cache for regenerated tasks.
"""

from node.tasks.base import Task, TaskError, TaskSource, build_task_source

__all__ = ["Task", "TaskError", "TaskSource", "build_task_source"]
