"""The request router of the engine deployment (Ray Serve's RequestRouter API, in the process of the
handle that sends: the gateway's):

- a protocol session's call goes to the replica that created the session (its id names it); an id
  no live replica issued goes to any replica, which answers 404;
- a prompt goes to the replica that reuses the most of its block chain: the longest prefix its
  block pool holds, then what its disk tier holds beyond it, worth a little less (a restore is cheaper
  than a compute, dearer than a pool hit: affinity.DISK_BLOCK_WORTH). Each replica's digest of both
  comes with its routing stats; the chains of what this router sent it lately are added to its pool's.
  Unless that replica's queue is longer than the shortest by more than `imbalanced_threshold`: then
  to the least loaded one (a fallback, counted);
- a new protocol session: a replica with the fewest open sessions (by their digests);
- anything else, and a prompt no replica holds a block of: the least loaded replica.
"""
from __future__ import annotations

import collections
from collections.abc import Iterable
from typing import Any

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from . import router_metrics as metrics
from .affinity import Affinity, Held
from .forwarding import ForwardedRequest

# the chains of the latest requests routed to each replica, remembered beside its digest: a
# conversation's next turn usually comes before the replica's next digest
_RECENT_CHAINS = 8192


class AffinityRouter(RequestRouter):
    def initialize_state(self, imbalanced_threshold: int = 4, **kwargs: Any) -> None:
        self.imbalanced_threshold = imbalanced_threshold
        self._recent: dict[str, collections.OrderedDict[int, None]] = collections.defaultdict(collections.OrderedDict)

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        affinity = _affinity(pending_request)
        if affinity is None:
            metrics.ROUTED.labels(reason="other").inc()
            return [candidate_replicas]  # Ray's choice among them: the shortest queue
        if affinity.session_replica is not None:
            owner = [r for r in candidate_replicas if r.replica_id.unique_id == affinity.session_replica]
            metrics.ROUTED.labels(reason="session" if owner else "session_unknown").inc()
            return [owner] if owner else [candidate_replicas]
        if affinity.new_session:
            metrics.ROUTED.labels(reason="session_new").inc()
            return _fewest_sessions_first(candidate_replicas)
        queues = [self.replica_queue_len_cache.get(r.replica_id) for r in candidate_replicas]
        index, chosen = affinity.choose([self._held(r, affinity.block_size, queue)
                                         for r, queue in zip(candidate_replicas, queues)])
        best = candidate_replicas[index]
        if chosen.worth == 0:
            metrics.ROUTED.labels(reason="no_prefix").inc()
            return [candidate_replicas]
        if self._imbalanced(queues[index], queues):
            metrics.ROUTED.labels(reason="prefix_imbalanced").inc()
            return [candidate_replicas]
        metrics.ROUTED.labels(reason="prefix").inc()
        metrics.MATCHED_BLOCKS.inc(chosen.pool_blocks)
        metrics.MATCHED_DISK_BLOCKS.inc(chosen.disk_blocks)
        return [[best], [r for r in candidate_replicas if r is not best]]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        affinity = _affinity(pending_request)
        if affinity is not None and affinity.chains:
            recent = self._recent[replica_id.unique_id]
            for chain in affinity.chains:
                recent[chain] = None
                recent.move_to_end(chain)
            while len(recent) > _RECENT_CHAINS:
                recent.popitem(last=False)

    def _held(self, replica: RunningReplica, block_size: int, queue: int | None) -> Held:
        """The blocks `replica` holds as far as this router knows, in its pool (its last digest, and
        what was sent to it lately) and on its disk (its last digest)."""
        stats = replica.routing_stats or {}
        ours = stats.get("block_size") == block_size
        pool = set(stats.get("chains", ()) if ours else ()) | self._recent[replica.replica_id.unique_id].keys()
        return Held(pool, stats.get("disk_chains", set()) if ours else set(), queue)  # (a set: the engine's)

    def _imbalanced(self, queue: int | None, queues: Iterable[int | None]) -> bool:
        """Whether a replica with `queue` requests in flight has more than the least loaded one by more
        than the threshold (queue lengths as Ray's cache of them has them; unknown ones are not compared)."""
        known = [q for q in queues if q is not None]
        return queue is not None and queue - min(known) > self.imbalanced_threshold


def _fewest_sessions_first(candidates: list[RunningReplica]) -> list[list[RunningReplica]]:
    """The replicas with the fewest open protocol sessions (by their last digests), then the others: a
    session stays on the replica that creates it, so new ones spread."""
    open_sessions = {r.replica_id: (r.routing_stats or {}).get("sessions", 0) for r in candidates}
    fewest = min(open_sessions.values())
    return [[r for r in candidates if open_sessions[r.replica_id] == fewest],
            [r for r in candidates if open_sessions[r.replica_id] != fewest]]


def _affinity(pending_request: PendingRequest | None) -> Affinity | None:
    args = pending_request.args if pending_request is not None else ()
    request = args[0] if args else None
    return request.affinity if isinstance(request, ForwardedRequest) else None
