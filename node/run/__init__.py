"""The run loop and what it writes: ``Node`` (``node``: setup, run, one step, close) with its builders
(``setup``), shared state (``state``), peer selection (``peers``) and status (``status``); ``daemon`` (``swarm-node
start``), checkpoints, trackers, the run dir and a run read back at a checkpoint (``rundir``, ``saved``).
It may import api/, exchange/, generation/, train/, policy/, config/, tasks/ and node's leaf modules.
"""
