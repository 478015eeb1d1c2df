"""The application on Ray Serve (N engine replicas, the gateway in front, our router between them),
what it needs from the cluster, and `pyllamaopt serve --ray`'s run: start or join the cluster, deploy,
wait; a cluster that goes away ends the server with a message, not a hang (cluster_watch)."""
from __future__ import annotations

import dataclasses
import os
import signal
import sys
from dataclasses import dataclass
from typing import Any

from ..config import opt_variables
from ..serve import ServeSettings

APP_NAME = "pyllamaopt"
ROUTERS = ("affinity", "default")  # ours (router.py), or Ray Serve's default (power of two choices)
# requests one replica takes at once: its scheduler batches and queues them itself
ENGINE_MAX_ONGOING = 64
GATEWAY_MAX_ONGOING = 1024


@dataclass(frozen=True)
class RayOptions:
    replicas: int = 2
    router: str = "affinity"
    imbalanced_threshold: int = 4   # requests in flight beyond the least loaded replica's before affinity yields
    stats_period: float = 1.0       # seconds between two digests of a replica's pool

    def check(self) -> None:
        if self.replicas < 1:
            raise SystemExit(f"pyllamaopt serve: --replicas must be at least 1 (got {self.replicas})")
        if self.router not in ROUTERS:
            raise SystemExit(f"pyllamaopt serve: --ray-router must be one of {', '.join(ROUTERS)} (got {self.router!r})")


def require_ray() -> None:
    """A one-line message if Ray Serve is not installed."""
    try:
        from ray import serve  # noqa: F401
    except ImportError as exc:
        raise SystemExit(f'pyllamaopt serve --ray: Ray Serve is not installed ({exc}); pip install "pyllamaopt[ray]"') \
            from None


def replica_cpus(settings: ServeSettings) -> int:
    """CPUs a replica reserves: its threads (--threads, default 1)."""
    return settings.threads or 1


def build_app(settings: ServeSettings, options: RayOptions) -> Any:
    """The Ray Serve application: `serve.run(build_app(...))`, or Ray's own CLI through `app` (__init__)."""
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    from .engine import Engine
    from .gateway import Gateway

    cpus = replica_cpus(settings)
    settings = dataclasses.replace(settings, threads=cpus)
    ours: dict[str, Any] = {"request_router_class": "pyllamaopt.ray.router:AffinityRouter",
                            "request_router_kwargs": {"imbalanced_threshold": options.imbalanced_threshold},
                            "request_routing_stats_period_s": options.stats_period}
    routing = RequestRouterConfig(**(ours if options.router == "affinity" else {}))
    # the engine's settings (LLAMA_OPT_*: the disk tier, the block size...) as this process has them: a
    # replica on a cluster started elsewhere does not inherit this environment
    environment = {"env_vars": opt_variables(os.environ)}
    engine = serve.deployment(name="engine", num_replicas=options.replicas,
                              ray_actor_options={"num_cpus": cpus, "runtime_env": environment},
                              max_ongoing_requests=ENGINE_MAX_ONGOING, request_router_config=routing)(Engine)
    gateway = serve.deployment(name="gateway", ray_actor_options={"num_cpus": 0, "runtime_env": environment},
                               max_ongoing_requests=GATEWAY_MAX_ONGOING)(Gateway)
    return gateway.bind(engine.bind(settings), settings)


def check_placement(settings: ServeSettings, options: RayOptions, cluster_cpus: float) -> None:
    """A one-line message if the cluster cannot place the replicas (Ray would wait for them forever)."""
    cpus = replica_cpus(settings)
    if options.replicas * cpus > cluster_cpus:
        raise SystemExit(f"pyllamaopt serve --ray: {options.replicas} replicas x {cpus} CPU (--threads) need "
                         f"{options.replicas * cpus} CPUs, and the Ray cluster has {cluster_cpus:g}: lower --replicas "
                         "or --threads, or add nodes (docs/scale-out.md)")


def refuse_single_server_options(settings: ServeSettings) -> None:
    if settings.grpc_port is not None:
        raise SystemExit("pyllamaopt serve --ray: --grpc-port is single-server only (Ray Serve's gRPC proxy serves "
                         "its own protobuf services, not the session protocol's; docs/scale-out.md)")
    if settings.tls_cert or settings.tls_key:
        raise SystemExit("pyllamaopt serve --ray: --tls-cert/--tls-key are single-server only: terminate TLS in front "
                         "of Ray Serve's HTTP proxy (docs/scale-out.md)")


def serve_on_ray(settings: ServeSettings, options: RayOptions) -> None:
    """`pyllamaopt serve --ray`: joins the cluster RAY_ADDRESS names (else starts one on this machine),
    deploys, and serves until Ctrl-C (or SIGTERM) or until the cluster goes away: then it says so and
    exits with status 1 within seconds (cluster_watch)."""
    require_ray()
    options.check()
    settings.check()
    refuse_single_server_options(settings)
    import ray
    from ray import serve

    from .cluster_watch import ClusterWatch

    # no RAY_ADDRESS: a cluster of our own ("local"; ray.init() alone would join the one started last on
    # this machine, which may be someone else's, or gone: it then retries for minutes)
    ray.init(address=None if os.environ.get("RAY_ADDRESS") else "local", namespace=APP_NAME,
             log_to_driver=settings.verbose)
    signal.signal(signal.SIGTERM, _interrupt)  # stops as Ctrl-C does: Serve's replicas close their sessions
    lost = ""
    try:
        check_placement(settings, options, ray.cluster_resources().get("CPU", 0.0))
        serve.start(http_options={"host": settings.host, "port": settings.port})
        serve.run(build_app(settings, options), name=APP_NAME, route_prefix="/")
        watch = ClusterWatch.of_this_driver()
        export_ports = sorted({str(node["MetricsExportPort"]) for node in ray.nodes() if node.get("Alive")})
        print(f"pyllamaopt serve: {options.replicas} replicas ({options.router} routing) on Ray Serve, "
              f"http://{settings.host}:{settings.port}; the replicas' metrics in Ray's export (/metrics on port "
              f"{', '.join(export_ports)} of the nodes); Ctrl-C stops it", file=sys.stderr, flush=True)
        lost = watch.wait_until_lost()
    except KeyboardInterrupt:
        serve.shutdown()
        print("pyllamaopt serve --ray: stopped", file=sys.stderr, flush=True)
    finally:
        if not lost:
            ray.shutdown()
    if lost:  # not ray.shutdown() nor Ray's exit handlers: they would wait on the lost cluster
        watch.end()
        print(f"pyllamaopt serve --ray: {lost}", file=sys.stderr, flush=True)
        os._exit(1)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt
