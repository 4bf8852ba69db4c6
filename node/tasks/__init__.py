"""Verifiable tasks, named by ``TaskRef`` so any node regenerates and scores them itself.

- ``base``: ``Task`` and the ``TaskSource`` interface (regenerate, sample, held-out eval refs, score,
  format the prompt).
- ``registry``: the sources by name and ``build_task_source``.
- ``arith``: the built-in two-digit ``add``/``sub``/``mul`` source (text format in ``arith_format``).
- ``reasoning_gym``: reasoning-gym datasets (SAPO's nine and easier ones), scored by reasoning-gym itself.
- ``prompting``: chat-template or plain prompt formatting (system prompt, worked examples), and final-answer
  extraction.
- ``cache``: the LRU cache for regenerated tasks.

It may import node's leaf modules only.
"""

from node.errors import TaskError
from node.tasks.base import Task, TaskSource
from node.tasks.registry import build_task_source

__all__ = ["Task", "TaskError", "TaskSource", "build_task_source"]
