"""The scheduler: one thread owns the Context and does all of its work.

Request handlers never compute: they hand the scheduler a function (``call``) or a generation
(``stream``) and await the result, so the event loop stays free. The thread runs queued calls in
order and, between them, one step of every running generation in turn, so concurrent streams
advance together and a new request waits at most one step per stream. Before each round, a
`prefetch` function given the streams' keys may compute their next steps together (the service
decodes the pending tokens of all running generations in shared batches). A stream runs at most
STREAM_AHEAD items ahead of its reader: a reader that stops reading (a stalled client) pauses
its generation instead of letting it run to the end unread. A stream may yield PENDING: work
done (a piece of a long prefill), nothing for the reader; the others get their turn before its
next item, so a long prompt does not freeze their streams.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
from collections.abc import AsyncGenerator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")

_DONE = object()  # end of a stream, put after its last item
PENDING = object()  # yielded by a stream between pieces of its work: not an item, a turn given up
STREAM_AHEAD = 16


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue[Any]
    steps: Iterator[Any] = iter(())
    key: Any = None  # handed to prefetch (None: not batched)
    cancelled: threading.Event = field(default_factory=threading.Event)
    room: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(STREAM_AHEAD))
    waiting: bool = False  # the scheduler found no room: the reader wakes it when it takes an item


class Scheduler:
    def __init__(self, prefetch: Callable[[list[Any]], None] | None = None) -> None:
        self._prefetch = prefetch
        self._calls: queue.SimpleQueue[tuple[Callable[[], Any], concurrent.futures.Future[Any]] | None] = queue.SimpleQueue()
        self._streams: list[_Stream] = []
        self._thread = threading.Thread(target=self._run, name="pyllamaopt-scheduler", daemon=True)
        self._stopped = False
        self._thread.start()

    def call(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Runs `fn` on the scheduler thread; its result (or exception) arrives in the future."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._calls.put((fn, future))
        return future

    async def run(self, fn: Callable[[], T]) -> T:
        return await asyncio.wrap_future(self.call(fn))

    async def stream(self, start: Callable[[], tuple[Iterator[Any], Any]]) -> AsyncGenerator[Any, None]:
        """Items of the iterator `start()` returns (with its prefetch key), created and advanced on
        the scheduler thread. Leaving the loop early (a client gone, even while `start` runs)
        closes the iterator there, between two steps: one whose cleanup matters must have started
        (a generator that has yielded once) by the time `start` returns."""
        s = _Stream(asyncio.get_running_loop(), asyncio.Queue())

        def begin() -> None:
            s.steps, s.key = start()
            self._streams.append(s)

        try:
            await self.run(begin)
            while True:
                item = await s.out.get()
                s.room.release()
                if s.waiting:
                    s.waiting = False
                    self._calls.put(None)  # wake the thread: this stream has room again
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            s.cancelled.set()
            self._calls.put(None)  # wake the thread if it sleeps

    def queue_depth(self) -> int:
        return self._calls.qsize() + len(self._streams)

    def contended(self, idle_streams: int = 0) -> bool:
        """On the scheduler thread, inside a stream's step: whether other work waits for this one.
        `idle_streams` other streams are known to have nothing to do but wait (they do not count)."""
        return len(self._streams) - 1 - idle_streams > 0 or not self._calls.empty()

    def stop(self, timeout: float | None = None) -> None:
        """Finishes queued calls, closes running streams, and ends the thread."""
        self._stopped = True
        self._calls.put(None)
        self._thread.join(timeout)

    # the thread

    def _run(self) -> None:
        progressed = False
        while True:
            self._run_calls(block=not progressed and not self._stopped)  # nothing to step: sleep
            if self._stopped:
                for s in list(self._streams):
                    self._finish(s, close=True)
                if self._calls.empty():
                    return
                continue
            progressed = False
            keys = [s.key for s in self._streams if s.key is not None]
            if self._prefetch and len(keys) > 1:
                try:
                    self._prefetch(keys)
                except Exception:  # the same failure, if it is one, reaches each stream from its own step
                    pass
            for s in list(self._streams):
                progressed |= self._step(s)

    def _run_calls(self, block: bool) -> None:
        while True:
            try:
                item = self._calls.get(block=block)
            except queue.Empty:
                return
            block = False
            if item is None:
                continue
            fn, future = item
            self._finish_cancelled()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as exc:  # handed to the caller, never lost
                    future.set_exception(exc)

    def _finish_cancelled(self) -> None:
        """Closes the streams whose readers have left: before a call, so that a call sent after a
        cancel (a generation right after one was cancelled) finds its session idle, not busy until
        the thread's next round of steps."""
        for s in [s for s in self._streams if s.cancelled.is_set()]:
            self._finish(s, close=True)

    def _step(self, s: _Stream) -> bool:
        """One item of the stream, if its reader has room for it; False if it had none."""
        if s.cancelled.is_set():
            self._finish(s, close=True)
            return True
        s.waiting = True  # before trying: a reader that takes an item after a failed try wakes us
        if not s.room.acquire(blocking=False):
            return False
        s.waiting = False
        try:
            item = next(s.steps)
        except StopIteration:
            self._finish(s)
            return True
        except Exception as exc:
            self._put(s, exc)
            self._finish(s)
            return True
        if item is PENDING:
            s.room.release()
        else:
            self._put(s, item)
        return True

    def _finish(self, s: _Stream, close: bool = False) -> None:
        if close and hasattr(s.steps, "close"):
            s.steps.close()
        if s in self._streams:
            self._streams.remove(s)
        self._put(s, _DONE)

    @staticmethod
    def _put(s: _Stream, item: Any) -> None:
        try:
            s.loop.call_soon_threadsafe(s.out.put_nowait, item)
        except RuntimeError:  # the event loop is closed: nobody is listening
            pass


def primed(steps: Iterator[Any]) -> Iterator[Any]:
    """A stream's generator whose first item is PENDING, advanced past it: closing it from now on
    runs its cleanup (a generator never started runs none), even if a client that left at once
    means the scheduler never steps it."""
    next(steps)
    return steps
