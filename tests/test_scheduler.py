"""The scheduler's ordering (pyllamaopt/serve/scheduler.py), without a model: what a call sees of
the streams whose readers left before it was sent."""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

from pyllamaopt.serve.scheduler import PENDING, Scheduler, primed


def test_a_call_sent_after_a_reader_left_finds_its_stream_closed():
    """A client that cancels a generation and at once sends the next request on its session: the
    request must find the cancelled generation's cleanup done (the session idle), not run first
    and answer "busy". The thread is held in a call while the reader leaves and the next call is
    queued, so the call comes before the thread's next round of steps, deterministically."""
    closed = threading.Event()

    def steps() -> Iterator[object]:
        try:
            yield PENDING
            while True:
                yield "token"
        finally:
            closed.set()

    async def scenario() -> bool:
        scheduler = Scheduler()
        try:
            stream = scheduler.stream(lambda: (primed(steps()), None))
            assert await stream.__anext__() == "token"
            running, release = threading.Event(), threading.Event()
            held = scheduler.call(lambda: (running.set(), release.wait()))
            await asyncio.to_thread(running.wait)
            await stream.aclose()  # the reader leaves
            after = scheduler.call(closed.is_set)
            release.set()
            held.result(timeout=10)
            return after.result(timeout=10)
        finally:
            scheduler.stop(timeout=10)

    assert asyncio.run(scenario()), "the call ran before the stream its reader had left was closed"
