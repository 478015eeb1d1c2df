"""One engine replica on Ray Serve: the single server's FastAPI app (one Model, one Context, its
scheduler thread), called in-process with each request the gateway forwards. Protocol session ids
carry the replica's id, so that the router brings every later call on a session back here; an id
another replica (or none) issued is unknown here: 404, as after a restart. Every answer names the
replica in a header (REPLICA_HEADER), and the app's metrics go to Ray's metrics export."""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from typing import Any, cast

from ray import serve

from ..serve import ServeSettings, create_app
from .affinity import session_id_prefix
from .forwarding import ForwardedRequest, ResponseStart, call_app
from .metrics_export import RayExport

# the replica that answered (its Ray Serve replica id, the tag of its metrics and its sessions' ids')
REPLICA_HEADER = b"x-pyllamaopt-replica"


class Engine:
    def __init__(self, settings: ServeSettings) -> None:
        self.replica = serve.get_replica_context().replica_id.unique_id
        self.app = create_app(dataclasses.replace(settings, session_id_prefix=session_id_prefix(self.replica)))
        self.export = RayExport(self.app.state.service.metrics.registry)
        self._lifespan = contextlib.AsyncExitStack()
        self._started: asyncio.Task[None] | None = None

    async def handle(self, request: ForwardedRequest) -> AsyncIterator[ResponseStart | bytes]:
        """The app's answer to `request`: a ResponseStart, then the body's chunks as they stream."""
        if self._started is None:  # on the replica's event loop: the app's start (its idle-session sweeper)
            lifespan = cast(contextlib.AbstractAsyncContextManager[None], self.app.router.lifespan_context(self.app))
            self._started = asyncio.ensure_future(self._lifespan.enter_async_context(lifespan))
        await asyncio.shield(self._started)
        try:
            async for item in call_app(self.app, request):
                if isinstance(item, ResponseStart):
                    item = dataclasses.replace(item, headers=(*item.headers, (REPLICA_HEADER, self.replica.encode())))
                yield item
        finally:
            self.export.update()

    async def record_routing_stats(self) -> dict[str, Any]:
        """The replica's digest for the router (Ray calls this every request_routing_stats_period_s):
        the chained hash of every block its pool holds and of every block its disk tier restores, and
        how many protocol sessions it has open. (Its metrics' export follows too: an idle replica's
        gauges move, sessions expire.)"""
        service = self.app.state.service
        context = service.context
        health = service.health()  # (and the queue's depth in the metrics, as the app's /metrics takes it)
        self.export.update()
        # (the pool's waits for the context's lock; the disk tier's reads the entries' headers)
        pool, disk = await asyncio.to_thread(lambda: (context.pool_chains, context.persist_chains))
        return {"replica": self.replica, "block_size": context.block_size, "chains": pool, "disk_chains": disk,
                "sessions": health.get("sessions", 0)}

    async def __del__(self) -> None:
        """Ray Serve calls this as the replica stops: the app's stop (sessions closed, and saved to the
        disk tier when it is on)."""
        await self._lifespan.aclose()
