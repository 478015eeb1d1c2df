"""Prompts computed while other work waits: in pieces, the others' steps between them, so that a long
prompt does not freeze the token streams of other clients; and concurrent prompts that share a
prefix (agents with one system prompt) computing it once. Scheduler thread only."""
from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..context import Context
from ..session import Session
from .errors import ContextFull, Overloaded, typed_errors
from .metrics import Metrics
from .pinning import pinned
from .scheduler import PENDING, Scheduler

# While other work waits, a prompt's new tokens are computed in pieces of about this many, the
# others' steps between them. Exact: pieces start at multiples of the block size and hold at
# least 64 tokens, which the canonical schedule computes bit for bit as one chunk would
# (docs/exactness.md); the price is one more row of logits per piece.
PREFILL_PIECE = 256


@dataclass(eq=False)
class PromptInProgress:
    """A prompt being computed, for the prompts that start after it."""
    target: list[int]
    done: int  # how many of its tokens the session holds
    # the earlier prompts computing a prefix it shares, each with that prefix's length
    leaders: list[tuple[PromptInProgress, int]] = field(default_factory=list)


class PrefillCoordinator:
    def __init__(self, context: Context, scheduler: Scheduler, metrics: Metrics) -> None:
        self.context = context
        self.scheduler = scheduler
        self.metrics = metrics
        self._in_progress: list[PromptInProgress] = []  # in the order they started

    def prefill(self, session: Session, tokens: list[int], *, sync: bool, kept: int | None = None,
                tool_spans: Sequence[tuple[int, int]] = ()) -> Iterator[Any]:
        """Brings the session's history to `tokens` (sync; `kept`: how many of them it holds, if the
        caller knows) or extends it by them (append), timed and counted. While other work waits, the
        new tokens are computed in pieces (PREFILL_PIECE), PENDING yielded between them. An append is
        all or nothing: failed or cancelled, the session has its old history; a failed or cancelled
        sync leaves a prefix of `tokens` (as its info says). The Tier-2 methods see the whole prompt:
        with the shifted reuse on, or tool results marked for sparse attention after the kept prefix,
        a sync is one piece."""
        before = session.stats
        old = [] if sync else session.tokens
        target = tokens if sync else old + tokens
        if sync:
            done = kept if kept is not None else len(os.path.commonprefix([session.tokens, tokens]))
        else:
            done = len(old)
        marked = [span for span in tool_spans if span[1] > done]
        whole = sync and (bool(self.context.config.diff_reuse_shifted) or bool(marked))
        spent, first = 0.0, True
        me = self._start(target, done)
        with pinned(session):
            try:
                while True:
                    while self._led(me):
                        yield PENDING
                    # what the leaders computed comes from the pool in this piece (at its end a chunk is computed again)
                    start = max(done, self._covered(me) // self.context.block_size * self.context.block_size)
                    end = self._next_end(me, start, whole)
                    started = time.perf_counter()
                    try:
                        if sync and first:  # drops what differs
                            typed_errors(lambda: session.sync(target[:end], tool_spans=tool_spans if marked else ()))
                        else:
                            typed_errors(lambda: session.append(target[done:end]))
                    except ContextFull:
                        if len(target) > self.context.n_ctx:
                            raise
                        # it fits the context: the cells are held by prompts and generations in progress (pinned)
                        raise Overloaded("the KV cache is full with the KV of prompts and generations in progress; retry when "
                                         "they end, or start the server with a larger --n-ctx") from None
                    spent += time.perf_counter() - started
                    done, first = end, False
                    me.done = done
                    if done == len(target):
                        break
                    yield PENDING
            except BaseException:
                if not sync and not session.closed and session.n_tokens != len(old):
                    with contextlib.suppress(Exception):
                        session.sync(old)
                raise
            finally:
                self._in_progress.remove(me)
                self.metrics.generate_prefill_tokens.observe(len(tokens))
                self.metrics.generate_prefill_duration_seconds.observe(spent)
                self.metrics.count_shift_fallbacks(session.stats - before)

    def _start(self, target: list[int], done: int) -> PromptInProgress:
        """Registers a prompt being computed, with the earlier ones that compute a prefix of it it
        does not hold yet (at least a block more than it holds)."""
        me = PromptInProgress(target, done)
        for other in self._in_progress:
            shared = len(os.path.commonprefix([other.target, target]))
            if shared >= done + self.context.block_size:
                me.leaders.append((other, shared))
        self._in_progress.append(me)
        return me

    def _led(self, me: PromptInProgress) -> bool:
        """Concurrent prompts that share a prefix (agents with one system prompt) compute it once:
        while an earlier prompt, at or ahead of where `me` stands, is computing a shared prefix
        that no earlier prompt has computed yet, `me` waits; then it takes those blocks from the
        pool (exact: content-addressed, bitwise what it would compute). Only earlier prompts lead,
        so no two wait for each other."""
        covered = self._covered(me)
        return any(leader in self._in_progress and me.done <= leader.done and covered < shared
                   for leader, shared in me.leaders)

    @staticmethod
    def _covered(me: PromptInProgress) -> int:
        """How much of `me`'s prompt the earlier prompts sharing a prefix with it have computed."""
        return max((min(leader.done, shared) for leader, shared in me.leaders), default=0)

    def _next_end(self, me: PromptInProgress, start: int, whole: bool) -> int:
        """Where the next piece of `me`'s prefill ends: the whole prompt when nothing else needs the
        scheduler; pieces while other work waits. Prompts waiting for the prefix `me` computes
        are not such work: they need it soonest, so it goes in one piece (up to the last block
        they share), and pieces of the rest alternate with them."""
        end = len(me.target)
        if whole:
            return end
        waiting = [other for other in self._in_progress if other is not me and self._led(other)]
        if self.scheduler.contended(idle_streams=len(waiting)):
            return self._piece_end(start, end)
        block = self.context.block_size
        shared = max((n for other in waiting for leader, n in other.leaders if leader is me), default=0) // block * block
        return shared if start < shared < end else end

    def _piece_end(self, start: int, end: int) -> int:
        """Where a piece of a prompt's prefill that starts at `start` ends: a multiple of the block
        size about PREFILL_PIECE further, or `end` if what would be left is small."""
        block = self.context.block_size
        stop = (start + PREFILL_PIECE) // block * block
        return end if end - stop < PREFILL_PIECE // 2 else stop
