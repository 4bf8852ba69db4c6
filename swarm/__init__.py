"""swarm: who talks to whom. Rollout batches shared over a hivemind DHT and direct libp2p streams.

Imports ``protocol`` and hivemind, never ``node``. Async lives here only; the node's loop uses the
synchronous facade ``SwarmTransport``.

Modules, top to bottom:

- ``transport``  ``SwarmTransport``: the thread-safe synchronous facade (start, publish, collect, peers,
  stats, restart, close) over one network thread with its own asyncio loop.
- ``core``       ``SwarmCore``: the async side, one p2pd + one ``DHTNode``; join / publish / collect /
  health loops and the ``rpc_get_batch`` handler that serves signed batches by id.
- ``intake``     the checks every announced batch passes (manifest, peer-book screening, verification,
  outcome), shared by ``core`` and ``memory`` (pure).
- ``memory``     ``InMemoryHub``: an in-process swarm carrying the same signed bytes through ``intake``.
- ``validator``  ``ManifestValidator``: hivemind record validator: owner-bound manifests in a window of
  epochs, finite and bounded records, bounded storage, checks on read.
- ``peer_book``  ``PeerBook``: quotas (per author and global), staleness window, dedup, offences and bans
  with backoff, counters; pruned and bounded (pure).
- ``keys``       epochs, DHT keys, shards and owner-bound subkeys (pure).
- ``state``      ``SharedState``: what the network thread and callers share, behind one lock.
- ``watchdog``   kills an orphaned p2pd if this process dies without cleaning up.
- ``settings``   ``SwarmSettings`` (pydantic) and ``SWARM_INITIAL_PEERS`` parsing.
- ``maddr``      multiaddr checks with hivemind's own parser, loaded without importing hivemind.
- ``hivemind_compat``  the hivemind internals the layer relies on, in one place.
- ``errors``     ``SwarmError`` root.
"""
