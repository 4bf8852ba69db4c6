"""``python -m node.cli``: the same as the ``swarm-node`` command."""

import sys

from node.cli.main import main

sys.exit(main())
