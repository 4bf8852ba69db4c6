"""swarm: who talks to whom. Rollout batches shared over a hivemind DHT and direct libp2p streams.

Imports ``protocol`` and hivemind, never ``node``. Async lives here only; the node's loop uses the
synchronous facade ``SwarmTransport``.

Modules, top to bottom:

- ``transport``  ``SwarmTransport``: the thread-safe synchronous facade (start, publish, collect, peers,
  stats, network_status, peer_stats, restart, close) over one network thread with its own asyncio loop.
- ``core``       ``SwarmCore``: the async side, one p2pd + one ``DHTNode``; a package with one module a
  job: ``join``, ``publish``, ``pull`` (the collect loop), ``serve`` (the ``rpc_get_batch`` handler that
  serves signed batches by id and the ``rpc_put_batch`` handler that takes batches handed over by nodes
  behind NAT), ``health``, ``shutdown``; ``base`` holds the shared state, ``lifecycle`` composes them.
- ``host``       ``SwarmHost``: a model-less member others join through (stable address, hand-offs, relay,
  p2pd limits), with ``members`` (``MemberTable``: who publishes what, as its DHT view shows) and the health
  of the swarm's other hosts.
- ``intake``     the checks every announced or handed-over batch passes (manifest, peer-book screening,
  verification, outcome), shared by ``core`` and ``memory`` (pure).
- ``memory``     ``InMemoryHub``: an in-process swarm carrying the same signed bytes through ``intake``.
- ``validator``  ``ManifestValidator``: hivemind record validator: owner-bound manifests in a window of
  epochs, finite and bounded records, bounded storage, checks on read.
- ``peer_book``  ``PeerBook``: quotas (per author and global), staleness window, dedup, offences and bans
  with backoff, counters in total and per peer (``PeerRow``, for status pages); pruned and bounded (pure).
- ``handoff``    ``HandoffStore``: batches held for peers behind NAT, quotas per identity and in total (pure).
- ``keys``       epochs, DHT keys, shards and owner-bound subkeys (pure).
- ``state``      ``SharedState``: what the network thread and callers share, behind one lock;
  ``NetworkStatus``: up or not and why.
- ``watchdog``   kills an orphaned p2pd if this process dies without cleaning up.
- ``settings``   ``SwarmSettings`` (pydantic) and ``SWARM_INITIAL_PEERS`` parsing.
- ``maddr``      multiaddr checks with hivemind's own parser, loaded without importing hivemind.
- ``hivemind_compat``  the hivemind internals the layer relies on, in one place.
- ``hivemind_lean``    hivemind's DHT and p2p modules without the package inits that import torch (a host's).
- ``p2p_keys``   libp2p key files and their peer ids (a host's address before it first starts).
- ``errors``     ``SwarmError`` root.
"""
