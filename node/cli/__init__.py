"""The ``swarm-node`` command: ``main`` parses the command line and runs one verb, each verb a module here
(``train``: silo and start, ``status``, ``keygen``, ``evaluate``, ``export``, ``fetch``, ``doctor``,
``swarm``, ``host``). It may import every other folder of ``node/``; nothing imports it.

User mistakes (bad config, bad flags) exit with code 2 and one line naming the field and the fix.
"""

from node.cli.main import main

__all__ = ["main"]
