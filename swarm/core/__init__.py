"""``SwarmCore``: the async side of one node, living in the network thread's event loop.

It owns one p2pd (hivemind ``P2P``), one ``DHTNode`` on top of it, the ``rpc_get_batch`` handler that
serves signed batches by id, and its background loops. One module a job:

* ``join``: dial the initial peers until the DHT has a neighbour, retrying with exponential backoff; and
  again whenever every neighbour is gone;
* ``publish``: store queued manifests in the DHT (a failed store tried again, all of it bounded by
  ``publish_timeout``; a client-mode node's own storage never counts);
* ``pull`` (the collect loop): poll the manifest keys of the recent epochs (each key on its own, every
  entry checked again by the validator), screen new manifests with the peer book, pull the batches from
  their authors (a few at a time per author, newcomers at most ``newcomer_share`` of the slots, each pull
  bounded in total time), verify them (size, hash, expanded size charged before decoding, signature,
  manifest match, content not seen before) and queue them; the screening and verification steps are
  ``swarm.intake``'s, shared with the in-process hub;
* ``serve``: ``rpc_get_batch`` and ``rpc_put_batch``, the handlers other nodes call;
* ``health``: watch p2pd, refresh the peer list and this node's visible addresses, prune old state;
* ``census`` (a host's only): read the older epochs' manifests once an epoch, and whenever it has a
  neighbour again, to count what it missed while it was down;
* ``shutdown``: cancel every task and stop p2pd, in bounded time.

``base`` holds the state and the steps they share (dialing, paced transfers, held batches); ``lifecycle``
composes the jobs into ``SwarmCore`` and starts, runs and shuts it down.

Behind NAT (``client_mode``) a node cannot be dialed; ``settings.nat_sharing`` picks how its batches still
reach the swarm: ``handoff`` pushes each batch to reachable holders (``rpc_put_batch``, ``swarm.handoff``)
before its manifest is stored, ``relay`` makes p2pd reserve a circuit-relay slot with the initial peers
and announce the relayed address first.

Every network await is bounded by a timeout. CPU-heavy decoding runs in the default executor, one batch
at a time, not on the loop. Held batches and the inbox are bounded in bytes as well as in count. Peer
input that fails a check is counted in the peer book and logged at debug level; when it shows intent
(bytes that are not what their author signed for, stalled pulls) the author is banned.
"""

from swarm.core.base import PublishItem, describe_error, handler_name, put_handler_name
from swarm.core.lifecycle import SwarmCore
from swarm.intake import decoded_cost

__all__ = ["PublishItem", "SwarmCore", "decoded_cost", "describe_error", "handler_name", "put_handler_name"]
