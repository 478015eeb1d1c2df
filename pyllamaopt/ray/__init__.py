"""`pyllamaopt serve --ray`: engine replicas on Ray Serve, behind a router with prefix and session
affinity (docs/scale-out.md).

    pip install "pyllamaopt[ray]"
    pyllamaopt serve --ray --replicas 2 --threads 1
    serve run pyllamaopt.ray:app model=gemma3-270m replicas=2 threads=1     # Ray's own CLI

One concern a file: `affinity` (what a request is placed by), `forwarding` (a request as a value, the
replica's in-process call of the app), `engine` (the replica), `gateway` (the ingress), `router` (the
RequestRouter), `deploy` (the application, what it needs, the CLI's run). Ray is imported by those
that need it only: the package imports without the extra.
"""
from __future__ import annotations

from typing import Any


def app(args: dict[str, str]) -> Any:
    """The application for Ray's CLI (`serve run pyllamaopt.ray:app key=value...`): model, n_ctx,
    threads, max_sessions (ServeSettings), replicas, router (RayOptions)."""
    from ..serve import ServeSettings
    from .deploy import RayOptions, build_app

    unknown = set(args) - {"model", "n_ctx", "threads", "max_sessions", "replicas", "router"}
    if unknown:
        raise ValueError(f"pyllamaopt.ray:app takes model, n_ctx, threads, max_sessions, replicas, router; "
                         f"not {', '.join(sorted(unknown))}")
    settings = ServeSettings(model=args.get("model", ServeSettings.model), n_ctx=int(args.get("n_ctx", 4096)),
                             threads=int(args["threads"]) if "threads" in args else None,
                             max_sessions=int(args.get("max_sessions", 16)))
    options = RayOptions(replicas=int(args.get("replicas", 2)), router=args.get("router", "affinity"))
    options.check()
    return build_app(settings, options)
