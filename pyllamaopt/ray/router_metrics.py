"""The router's counters, in the process of the handle that routes (the gateway's; its /metrics/router).
A module of their own: Ray Serve ships the router's module by value (cloudpickle), and a counter (it
holds a lock) cannot be pickled; the router reaches them through this module, which goes by name."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

REGISTRY = CollectorRegistry()
ROUTED = Counter("pyllamaopt_router_requests", "Requests the router placed, by why it chose the replica",
                 ["reason"], registry=REGISTRY)
MATCHED_BLOCKS = Counter("pyllamaopt_router_matched_blocks", "Prompt blocks the chosen replica held, as far as the "
                         "router knew", registry=REGISTRY)
MATCHED_DISK_BLOCKS = Counter("pyllamaopt_router_matched_disk_blocks", "Prompt blocks beyond its pool's that the "
                              "chosen replica's disk tier held (it restores them), as far as the router knew",
                              registry=REGISTRY)
REASONS = ("session", "session_unknown", "session_new", "prefix", "prefix_imbalanced", "no_prefix", "other")
for _reason in REASONS:
    ROUTED.labels(reason=_reason)
