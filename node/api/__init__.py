"""The node's status API: JSON endpoints, Prometheus ``/metrics`` and a live dashboard, on one port.

- ``board``   ``StatusBoard``: what the training thread publishes after each step (immutable snapshots);
  the only thing the API reads from the node besides the metrics file and the transport's thread-safe
  ``network_status()`` / ``peer_stats()``.
- ``server``  ``ApiServer``: an aiohttp app in its own thread and event loop (never the training thread),
  bearer-token auth, the endpoints and the static dashboard.
- ``views``   the JSON documents the endpoints answer, built from a board and a transport (pure).
- ``metrics_index``  reads ``metrics.jsonl`` incrementally and answers "rows after step S".
- ``client``  ``swarm-node status``: the terminal summary, from the API over HTTP (stdlib only).
- ``static/`` the dashboard (one HTML page, plain JS) and the vendored uPlot charting library (MIT).

It may import exchange/ (a transport's type), config/ and node's leaf modules; only run/ and cli/ import it.
``metrics``: the ``metrics.jsonl`` writer (and its Prometheus form) beside its reader.
"""
