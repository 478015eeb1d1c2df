"""A prometheus_client registry mirrored into Ray's metrics export: each engine replica's (the single
server's /metrics) and the gateway's router counters. Ray Serve's gauges add the deployment, replica
and application tags, and every node's metrics agent serves them beside Ray's own metrics, `ray_`
before each name (`ray start --metrics-export-port`; docs/scale-out.md), where Ray's Prometheus and
Grafana setup (or KubeRay's) scrapes them."""
from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry
from ray.serve import metrics as serve_metrics


class RayExport:
    """Call `update` after what may have changed the registry, and now and then (the engine does with
    each digest, every second): every sample is set on a Ray gauge of its name (a counter's value as it
    is: Prometheus' rate() reads it the same). All of them each time: Ray's agent evicts a gauge's value
    it has not been sent again within two of its report intervals (with a 2 s interval, values set
    only when they changed were gone from the export)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._gauges: dict[str, serve_metrics.Gauge] = {}

    def update(self) -> None:
        for family in self.registry.collect():
            for sample in family.samples:
                if sample.name.endswith("_created"):  # (a counter's creation time: nothing to follow)
                    continue
                gauge = self._gauges.get(sample.name)
                if gauge is None:
                    tag_keys: Any = tuple(sorted(sample.labels))  # (Ray types it Tuple[str]: it takes any length)
                    gauge = self._gauges[sample.name] = serve_metrics.Gauge(
                        sample.name, description=family.documentation, tag_keys=tag_keys)
                gauge.set(sample.value, tags=dict(sample.labels))
