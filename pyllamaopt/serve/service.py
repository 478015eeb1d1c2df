"""The session service: everything the transports (HTTP routes, gRPC) share.

It knows nothing of HTTP. Each operation validates its input, runs on the scheduler thread,
and raises a ``ServiceError`` with a status a transport maps to its own (HTTP 4xx, gRPC codes).

Two ways in:
- ``complete``: a stateless prompt (the OpenAI and Anthropic routes). It runs on the session a
  recent request left whose history shares the longest prefix with the prompt (a conversation
  re-sent with one more turn finds its previous turn, partial last block included), or on a
  fresh one, and syncs it to the prompt's tokens: the common prefix is kept, the context's
  content-addressed blocks give it every other prefix any request (or a closed session, or the
  disk tier) computed before, exactly, with no session id; the rest is computed. A few such
  sessions stay open afterwards (IDLE_REQUEST_SESSIONS), the least recently used closes (its
  blocks stay cached). With the Tier-2 shifted reuse on (``--approximate-reuse``), a prompt that
  shares no block with any of them still resumes the most recent one, whose unchanged spans after
  the change are then reused at their new positions (approximately; the answer says so). With
  sparse attention over tool results on (``--sparse-tool-results``), the chat routes mark the
  tool results in the prompt (``tool_spans``) and their irrelevant spans leave attention before
  what follows them is computed (approximately; the answer says so when something was dropped).
- the session protocol (specification 003 §2.2): server-issued ids, raw tokens appended, one
  generation at a time per session, idle sessions closed after a TTL or when over capacity
  (least recently used first), and "not found" afterwards, never a silent reset.

A long prompt is computed in pieces while other work waits (``_prefill``), so that it does not
freeze the token streams of other clients.
"""
from __future__ import annotations

import collections
import contextlib
import json
import os
import secrets
import time
from collections.abc import AsyncGenerator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..context import Context
from ..grammar import SchemaCheck, SchemaGrammar, compile_json_schema
from ..errors import (
    ContextOverflowError,
    GrammarError,
    InvalidArgumentError,
    InvalidTokenError,
    InvariantViolationError,
    PyllamaoptError,
    ServerError,
    ServerOverloadedError,
    SessionBusyError,
    SessionClosedError,
    SessionEvictedError,
    UnenforceableSchemaError,
)
from ..session import Session
from ..stats import Stats
from .metrics import Metrics
from .scheduler import PENDING, Scheduler


# Request sessions kept open after their answer, for the next request that continues one: one
# per agent of a typical team (with 4, half of 8 agents lost their session every turn and
# resumed from the pool, each computing a chunk more). An idle one is closed first when its
# sequence or its room in the KV cache is needed.
IDLE_REQUEST_SESSIONS = 8
# Compiled JSON Schemas kept for the next request with the same schema (a large one takes seconds)
SCHEMA_CACHE_SIZE = 32
# While other work waits, a prompt's new tokens are computed in pieces of about this many, the
# others' steps between them. Exact: pieces start at multiples of the block size and hold at
# least 64 tokens, which the canonical schedule computes bit for bit as one chunk would
# (docs/exactness.md); the price is one more row of logits per piece.
PREFILL_PIECE = 256


class ServiceError(Exception):
    """An error a client caused or must handle; ``status`` is its HTTP-style status, ``error`` the
    pyllamaopt exception class a client library raises for it (the engine's own, when it raised one)."""

    status = 400
    kind = "invalid_request_error"
    error: type[PyllamaoptError] = InvalidArgumentError

    def __init__(self, message: str, error: type[PyllamaoptError] | None = None) -> None:
        super().__init__(message)
        self.message = message
        if error is not None:
            self.error = error


class BadRequest(ServiceError):
    pass


class ContextFull(BadRequest):
    """More tokens than the context holds (a 400 unless the prompt itself fits: see _prefill)."""

    error = ContextOverflowError


class NotFound(ServiceError):
    status = 404
    kind = "not_found_error"
    error = SessionClosedError


class Busy(ServiceError):
    status = 409
    kind = "conflict_error"
    error: type[PyllamaoptError] = SessionBusyError


class SessionsFull(Busy):
    """Every session slot (--max-sessions) is taken by a busy session: a 409 like Busy, but over gRPC
    a RESOURCE_EXHAUSTED (it is the server that is full, not this session that is busy)."""

    error = ServerOverloadedError


class Overloaded(ServiceError):
    status = 503
    kind = "overloaded_error"
    error = ServerOverloadedError


class InternalError(ServiceError):
    """A failure no request should cause (a bug): reported as a 500, with the traceback on stderr."""

    status = 500
    kind = "api_error"
    error = ServerError


class InvariantViolation(ServiceError):
    """The specification's FAILED_PRECONDITION (003 §2.8): a bug surfaced, never papered over."""

    status = 500
    kind = "invariant_violation"
    error = InvariantViolationError


class Watch(Protocol):
    """Watches a generation's text (GenerateParams.until)."""

    @property
    def stop_string(self) -> str | None: ...  # the stop string it found, if that is why it ended the generation

    def __call__(self, text: str) -> str | None: ...  # the next token's text -> a finish reason, or None


@dataclass
class GenerateParams:
    max_tokens: int | None = 256
    temperature: float = 0.0
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    grammar: str | None = None
    json_schema: dict[str, Any] | bool | None = None
    # OpenAI's meaning: True, every constraint enforced by the grammar or a 400 naming the keyword;
    # False, what a grammar can enforce is, and the answer says whether the output is valid
    schema_strict: bool = False
    # fed each generated token's text (on the scheduler thread): a finish reason ends the generation
    # after that token (tools.ReplyWatch: a repeated call, a stop string in a tool reply's answer)
    until: Watch | None = None

    def kwargs(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k, "min_p": self.min_p,
                "seed": self.seed, "stop": self.stop, "grammar": self.grammar}


@dataclass(frozen=True)
class TokenEvent:
    id: int
    text: str


@dataclass(frozen=True)
class Usage:
    """What one request cost: prompt tokens and how their KV was obtained, generated tokens."""

    prompt_tokens: int
    completion_tokens: int
    computed: int          # prompt tokens whose KV was computed
    restored: int          # prompt tokens whose KV was read from the disk tier
    drafted: int           # generated tokens confirmed from memo drafts (no pass of their own)
    forced: int            # generated tokens the grammar forced (no logits)
    approximate: bool      # Tier 2 reuse made this answer approximate
    sparse_dropped: int = 0  # Tier 2: tool result tokens whose KV left attention (in the metrics only)

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens whose KV was reused (in RAM or from disk), not computed."""
        return max(0, self.prompt_tokens - self.computed)

    def as_dict(self) -> dict[str, Any]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "cached_tokens": self.cached_tokens, "computed_tokens": self.computed,
                "restored_tokens": self.restored, "drafted_tokens": self.drafted,
                "grammar_forced_tokens": self.forced, "approximate": self.approximate}


@dataclass(frozen=True)
class DoneEvent:
    finish_reason: str
    usage: Usage
    stop_string: str | None = None  # the stop string that ended the generation, if one did
    schema: SchemaCheck | None = None  # with a JSON Schema: the output checked against all of it

    def schema_fields(self) -> dict[str, Any]:
        """With a JSON Schema: whether the output is valid against all of it (``schema_valid``;
        ``schema_error`` says why not); else nothing."""
        return {} if self.schema is None else {"schema_valid": self.schema.valid, "schema_error": self.schema.error}

    def session_fields(self) -> dict[str, Any]:
        """The end of a session's generation over HTTP: as the gRPC ``Done`` message, with the schema fields."""
        return {"finish_reason": self.finish_reason, "usage": self.usage.as_dict(), "stop_string": self.stop_string,
                **self.schema_fields()}

    def extension(self) -> dict[str, Any]:
        """What an answer's ``pyllamaopt`` field says: the usage and the schema fields."""
        return {**self.usage.as_dict(), **self.schema_fields()}


Event = TokenEvent | DoneEvent


@dataclass(eq=False)
class _Prefill:
    """A prompt being computed, for the prompts that start after it (``_prefill``)."""
    target: list[int]
    done: int  # how many of its tokens the session holds
    # the earlier prefills computing a prefix it shares, each with that prefix's length
    leaders: list[tuple[_Prefill, int]] = field(default_factory=list)


@dataclass
class _Entry:
    session: Session
    last_used: float = field(default_factory=time.monotonic)
    busy: str | None = None  # "generating" or "prefilling": one operation at a time


class Service:
    def __init__(self, context: Context, scheduler: Scheduler, metrics: Metrics, *,
                 max_sessions: int, session_ttl: float) -> None:
        self.context = context
        self.model = context.model
        self.scheduler = scheduler
        self.metrics = metrics
        self.max_sessions = max_sessions
        self.session_ttl = session_ttl
        self._sessions: dict[str, _Entry] = {}  # touched on the scheduler thread only
        self._idle: list[Session] = []  # request sessions kept after their answer, most recent last
        self._schemas: collections.OrderedDict[tuple[str, bool], SchemaGrammar] = collections.OrderedDict()
        self._prefilling: list[_Prefill] = []  # in the order they started
        self._health: dict[str, Any] = {}
        self._update_gauges()

    @property
    def sparse_tool_results(self) -> bool:
        """Tier 2 (``--sparse-tool-results``): the chat routes mark tool results for sparse attention."""
        return bool(self.context.config.sparse_attn_enabled)

    # stateless prompts

    def complete(self, tokens: list[int], params: GenerateParams, *,
                 tool_spans: Sequence[tuple[int, int]] = ()) -> AsyncGenerator[Event, None]:
        """Generates after `tokens` (see the module's docstring); `tool_spans`: the tool results
        among them, for sparse attention (``Session.sync``)."""
        accepted = time.perf_counter()  # time to first token counts the prompt's wait and computation

        def answer(session: Session) -> Iterator[Any]:
            before = session.stats
            with _pinned(session):  # from the prompt to the answer: another prompt's room is a 503, not this
                try:
                    yield PENDING  # see _started
                    yield from self._prefill(session, tokens, sync=True, tool_spans=tool_spans)
                except GeneratorExit:  # the client left: what was computed stays usable
                    self._keep_idle(session)
                    raise
                except BaseException:
                    session.close()
                    raise
                self._verify(session)
                yield from self._generation(session, len(tokens), params, before, done=self._keep_idle,
                                            started=accepted)

        def start() -> tuple[Iterator[Any], Any]:
            if not tokens:
                raise BadRequest("the prompt is empty: give at least one token (or a message with text)")
            if len(tokens) >= self.context.n_ctx:  # (all of it: no room for an answer)
                raise ContextFull(f"the prompt has {len(tokens)} tokens, and the server's context holds "
                                  f"{self.context.n_ctx} with the answer: shorten it, or restart the server with a "
                                  "larger --n-ctx")
            session = self._request_session(tokens)
            return _started(answer(session)), session

        return self.scheduler.stream(start)

    # the session protocol

    async def create_session(self, tokens: list[int]) -> str:
        def create() -> Iterator[Any]:
            self._make_room()
            session = self._free_sequence(self.context.session)
            session_id = secrets.token_urlsafe(18)
            entry = self._sessions[session_id] = _Entry(session, busy="prefilling")
            try:
                yield from self._prefill(session, tokens, sync=False)
            except BaseException:
                del self._sessions[session_id]
                session.close()
                raise
            entry.busy = None
            entry.last_used = time.monotonic()  # idle from now: a long prefill does not count against the TTL
            self._verify(session, entry, grew_from=0)
            self.metrics.session_total.labels(outcome="created").inc()
            self._update_gauges()
            yield session_id

        return await self._run_pieces(create)

    async def append(self, session_id: str, tokens: list[int]) -> dict[str, Any]:
        return await self._change_history(session_id, tokens, sync=False)

    async def sync(self, session_id: str, tokens: list[int]) -> dict[str, Any]:
        return await self._change_history(session_id, tokens, sync=True)

    async def fork(self, session_id: str) -> str:
        def fork() -> str:
            entry = self._entry(session_id, idle=True)
            self._make_room(keep=session_id)
            new_id = secrets.token_urlsafe(18)
            self._sessions[new_id] = _Entry(self._free_sequence(entry.session.fork))
            self.metrics.session_total.labels(outcome="created").inc()
            self._update_gauges()
            return new_id

        return await self._run(fork)

    async def info(self, session_id: str) -> dict[str, Any]:
        return await self._run(lambda: self._info(session_id, self._entry(session_id)))

    async def close(self, session_id: str) -> None:
        def close() -> None:
            entry = self._entry(session_id, idle=True)
            self._drop(session_id, entry, outcome="closed")

        await self._run(close)

    def generate(self, session_id: str, params: GenerateParams) -> AsyncGenerator[Event, None]:
        """One generation at a time per session: a second one is refused (Busy) until it ends."""
        def start() -> tuple[Iterator[Event], Any]:
            entry = self._entry(session_id, idle=True)
            if entry.session.n_tokens == 0:
                raise BadRequest(f"session {session_id!r} has no history to generate after: append tokens first")
            entry.busy = "generating"
            return _started(self._generation(entry.session, 0, params, entry.session.stats, entry=entry)), entry.session

        return _done_last(self.scheduler.stream(start))

    async def tokenize(self, text: str, *, add_bos: bool, special: bool) -> list[int]:
        """The model's token ids of `text` (no template): for clients without a tokenizer of their own."""
        return await self._run(lambda: self.model.tokenize(text, add_bos=add_bos, special=special))

    async def expire_idle(self) -> int:
        """Closes sessions idle for longer than the TTL; returns how many."""
        def expire() -> int:
            now = time.monotonic()
            old = [(sid, e) for sid, e in self._sessions.items()
                   if not e.busy and now - e.last_used > self.session_ttl]
            for sid, e in old:
                self._drop(sid, e, outcome="expired", evicted_reason="ttl")
            return len(old)

        return await self._run(expire)

    def health(self) -> dict[str, Any]:
        """At once, from the figures of the scheduler's last change (not behind a long prompt in
        progress: a liveness probe waited for all of it)."""
        self.metrics.queue_depth.set(self.scheduler.queue_depth())
        return dict(self._health)

    def close_all(self) -> int:
        """Closes every session (on the scheduler thread; with persistence on they are saved);
        returns how many there were."""
        def close_all() -> int:
            open_sessions = list(self._sessions.items())
            for sid, e in open_sessions:
                self._drop(sid, e, outcome="closed")
            for session in self._idle:
                session.close()
            self._idle.clear()
            return len(open_sessions)

        return self.scheduler.call(close_all).result()

    # on the scheduler thread

    async def _change_history(self, session_id: str, tokens: list[int], *, sync: bool) -> dict[str, Any]:
        def change() -> Iterator[Any]:
            entry = self._entry(session_id, idle=True)
            entry.busy = "prefilling"
            before = entry.session.n_tokens
            try:
                yield from self._prefill(entry.session, tokens, sync=sync)
            finally:
                entry.busy = None
                entry.last_used = time.monotonic()
                self._update_gauges()
            self._verify(entry.session, entry, grew_from=None if sync else before)
            yield self._info(session_id, entry)

        return await self._run_pieces(change)

    async def _run(self, fn: Any) -> Any:
        return await self.scheduler.run(lambda: _typed_errors(fn))

    async def _run_pieces(self, work: Callable[[], Iterator[Any]]) -> Any:
        """Runs the generator `work()` on the scheduler thread, other work taking its turn at each
        PENDING it yields; returns the last item it yields. A client that leaves closes it there."""
        result = None
        async for item in self.scheduler.stream(lambda: (work(), None)):
            result = item
        return result

    def _entry(self, session_id: str, idle: bool = False) -> _Entry:
        entry = self._sessions.get(session_id)
        if entry is not None and entry.session.closed:  # evicted by the KV cache for room
            self._drop(session_id, entry, outcome="evicted", evicted_reason="kv_full")
            entry = None
        if entry is None:
            raise NotFound(f"session {session_id!r} does not exist: it was never created, or it was closed, "
                           "expired or evicted; create a new one (and send its tokens again)")
        if idle and entry.busy:
            raise Busy(f"session {session_id!r} is {entry.busy}; wait until that ends")
        entry.last_used = time.monotonic()
        return entry

    def _info(self, session_id: str, entry: _Entry) -> dict[str, Any]:
        s = entry.session
        return {"session_id": session_id, "n_tokens": s.n_tokens, "tokens": s.tokens,
                "kv_bytes": s.n_tokens * self.model.kv_bytes_per_token, "approx_from": s.approx_from,
                "generating": entry.busy == "generating", "busy": entry.busy, "stats": s.stats.as_dict()}

    def _drop(self, session_id: str, entry: _Entry, *, outcome: str, evicted_reason: str | None = None) -> None:
        del self._sessions[session_id]
        entry.session.close()
        self.metrics.session_total.labels(outcome=outcome).inc()
        if evicted_reason:
            self.metrics.session_evicted_total.labels(reason=evicted_reason).inc()
        self._update_gauges()

    def _make_room(self, keep: str | None = None) -> None:
        """At max_sessions, closes the least recently used idle session."""
        if len(self._sessions) < self.max_sessions:
            return
        idle = [(e.last_used, sid) for sid, e in self._sessions.items() if not e.busy and sid != keep]
        if not idle:
            raise SessionsFull(f"all {self.max_sessions} sessions are busy; retry later or start the server "
                               "with a larger --max-sessions")
        _, sid = min(idle)
        self._drop(sid, self._sessions[sid], outcome="evicted", evicted_reason="lru")

    def _prefill(self, session: Session, tokens: list[int], *, sync: bool,
                 tool_spans: Sequence[tuple[int, int]] = ()) -> Iterator[Any]:
        """Brings the session's history to `tokens` (sync) or extends it by them (append), timed and
        counted. While other work waits, the new tokens are computed in pieces (PREFILL_PIECE),
        PENDING yielded between them. An append is all or nothing: failed or cancelled, the session
        has its old history; a failed or cancelled sync leaves a prefix of `tokens` (as its info
        says). The Tier-2 methods see the whole prompt: with the shifted reuse on, or tool results
        marked for sparse attention after the kept prefix, a sync is one piece."""
        old, before = session.tokens, session.stats
        target = tokens if sync else old + tokens
        done = len(os.path.commonprefix([old, target]))
        marked = [span for span in tool_spans if span[1] > done]
        whole = sync and (bool(self.context.config.diff_reuse_shifted) or bool(marked))
        spent, first = 0.0, True
        me = self._start_prefill(target, done)
        with _pinned(session):
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
                            _typed_errors(lambda: session.sync(target[:end], tool_spans=tool_spans if marked else ()))
                        else:
                            _typed_errors(lambda: session.append(target[done:end]))
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
                self._prefilling.remove(me)
                self.metrics.generate_prefill_tokens.observe(len(tokens))
                self.metrics.generate_prefill_duration_seconds.observe(spent)
                self.metrics.count_shift_fallbacks(session.stats - before)

    def _verify(self, session: Session, entry: _Entry | None = None, *, grew_from: int | None = None) -> None:
        """The anomaly invariants (003 §2.8) after an operation: INV-1, the session's KV is what its
        history says; INV-2, an operation that only adds (append, generate) kept the history it
        started from. A violation is counted, closes the session (its entry: outcome "failed") and
        fails the request."""
        what = session.invariant_violation
        if what is None and grew_from is not None and session.n_tokens < grew_from:
            what = f"inv2: the history went from {grew_from} to {session.n_tokens} tokens in an operation that only adds"
        if what is None:
            return
        self.metrics.cache_invariant_violations_total.labels(kind=what.split(":")[0]).inc()
        session.discard()  # neither saved nor kept for reuse
        session_id = next((sid for sid, e in self._sessions.items() if e is entry), None)
        if session_id is not None and entry is not None:
            self._drop(session_id, entry, outcome="failed")
        raise InvariantViolation(f"internal error: the session's KV cache was found inconsistent ({what}); the session "
                                 "was closed: create a new one and send its tokens again (and please report this)")

    def _start_prefill(self, target: list[int], done: int) -> _Prefill:
        """Registers a prompt being computed, with the earlier ones that compute a prefix of it it
        does not hold yet (at least a block more than it holds)."""
        me = _Prefill(target, done)
        for other in self._prefilling:
            shared = len(os.path.commonprefix([other.target, target]))
            if shared >= done + self.context.block_size:
                me.leaders.append((other, shared))
        self._prefilling.append(me)
        return me

    def _led(self, me: _Prefill) -> bool:
        """Concurrent prompts that share a prefix (agents with one system prompt) compute it once:
        while an earlier prompt, at or ahead of where `me` stands, is computing a shared prefix
        that no earlier prompt has computed yet, `me` waits; then it takes those blocks from the
        pool (exact: content-addressed, bitwise what it would compute). Only earlier prompts lead,
        so no two wait for each other."""
        covered = self._covered(me)
        return any(leader in self._prefilling and me.done <= leader.done and covered < shared
                   for leader, shared in me.leaders)

    @staticmethod
    def _covered(me: _Prefill) -> int:
        """How much of `me`'s prompt the earlier prompts sharing a prefix with it have computed."""
        return max((min(leader.done, shared) for leader, shared in me.leaders), default=0)

    def _next_end(self, me: _Prefill, start: int, whole: bool) -> int:
        """Where the next piece of `me`'s prefill ends: the whole prompt when nothing else needs the
        scheduler; pieces while other work waits. Prompts waiting for the prefix `me` computes
        are not such work: they need it soonest, so it goes in one piece (up to the last block
        they share), and pieces of the rest alternate with them."""
        end = len(me.target)
        if whole:
            return end
        waiting = [other for other in self._prefilling if other is not me and self._led(other)]
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

    def _request_session(self, tokens: list[int]) -> Session:
        """The idle request session sharing the longest prefix with `tokens` (at least a block),
        else a new one (closing idle ones if every sequence is taken)."""
        self._idle = [s for s in self._idle if not s.closed]  # the KV cache may have evicted some for room
        shared = [(len(os.path.commonprefix([s.tokens, tokens])), i) for i, s in enumerate(self._idle)]
        n, i = max(shared, default=(0, -1))
        if n >= self.context.block_size:
            return self._idle.pop(i)
        if self._idle and self.context.config.diff_reuse_shifted:  # Tier 2: changed near the start
            return self._idle.pop()
        return self._free_sequence(self.context.session)

    def _free_sequence(self, new_session: Callable[[], Session]) -> Session:
        """A new session from `new_session` (a context's, or a fork), closing idle request sessions
        while every sequence of the context is taken."""
        while True:
            try:
                return new_session()
            except ContextOverflowError:
                if not self._idle:
                    raise Overloaded("every sequence of the context is in use by other requests and sessions; "
                                     "retry shortly, or start the server with fewer --max-sessions") from None
                self._idle.pop(0).close()

    def _keep_idle(self, session: Session) -> None:
        if session.closed:
            return
        self._idle.append(session)
        while len(self._idle) > IDLE_REQUEST_SESSIONS:
            self._idle.pop(0).close()

    def _generation(self, session: Session, prompt_tokens: int, params: GenerateParams, before: Stats, *,
                    entry: _Entry | None = None, done: Callable[[Session], None] | None = None,
                    started: float | None = None) -> Iterator[Any]:
        """The events of one generation (after a first PENDING); `before`: the session's counters before
        this request; `started`: when the request came (time to first token), else now."""
        started = time.perf_counter() if started is None else started
        history = session.n_tokens
        self.metrics.session_history_tokens.observe(history)
        generation = None
        with _pinned(session):
            try:
                yield PENDING  # see _started
                schema = None if params.json_schema is None else _typed_errors(lambda: self._compiled(params))
                generation = _typed_errors(lambda: session.generate(params.max_tokens, json_schema=schema,
                                                                    **params.kwargs()))
                last = None
                finish_reason = None
                steps = iter(generation)
                while (token := _typed_errors(lambda: next(steps, None))) is not None:
                    now = time.perf_counter()
                    if last is None:
                        self.metrics.time_to_first_token_seconds.observe(now - started)
                    else:
                        self.metrics.inter_token_latency_seconds.observe(now - last)
                    last = now
                    yield TokenEvent(token.id, token.text)
                    if params.until is not None and (finish_reason := params.until(token.text)):
                        generation.close()
                        break
                self._verify(session, entry, grew_from=history)
                stats = session.stats - before
                usage = Usage(prompt_tokens=prompt_tokens, completion_tokens=len(generation.tokens),
                              computed=stats.tokens_prefilled,
                              restored=stats.persist_tokens_restored, drafted=stats.memo_tokens_skipped,
                              forced=stats.schema_tokens_inferred, approximate=session.approx_from is not None,
                              sparse_dropped=stats.sparse_tokens_dropped)
                self.metrics.count_usage(usage)
                check = None if schema is None else SchemaCheck(generation.schema_valid, generation.schema_error)
                stop_string = params.until.stop_string if finish_reason and params.until else generation.stop_string
                yield DoneEvent(finish_reason or generation.finish_reason or "stop", usage, stop_string, check)
            finally:
                if generation is not None:
                    # a request cancelled mid-stream: the turn ends now (the session becomes evictable
                    # again), not when the garbage collector finds the generation (it is a cycle)
                    generation.close()
                if entry is not None:
                    entry.busy = None
                    entry.last_used = time.monotonic()
                if done is not None:
                    done(session)
                self._update_gauges()

    def _compiled(self, params: GenerateParams) -> SchemaGrammar:
        """The request's JSON Schema compiled (strict as the request says), from the cache if an
        earlier request had the same. A strict request whose schema has a constraint no grammar
        enforces is refused with that constraint named."""
        assert params.json_schema is not None
        key = (json.dumps(params.json_schema, sort_keys=True), params.schema_strict)
        compiled = self._schemas.pop(key, None)
        if compiled is None:
            try:
                compiled = compile_json_schema(params.json_schema, strict=params.schema_strict)
            except UnenforceableSchemaError as exc:
                raise BadRequest(f"response_format.json_schema.strict is true, but the schema's '{exc.keyword}' at "
                                 f"{exc.path} cannot be enforced by a grammar: {exc}. Remove that constraint, or "
                                 "set strict to false: what a grammar can enforce is, and the answer's "
                                 "pyllamaopt.schema_valid says whether the output is valid", type(exc)) from None
        self._schemas[key] = compiled
        while len(self._schemas) > SCHEMA_CACHE_SIZE:
            self._schemas.popitem(last=False)
        return compiled

    def _update_gauges(self) -> None:
        """On the scheduler thread, after each change: the gauges, and what /health says."""
        cells = self.context.kv_cells_used
        self.metrics.session_active.set(len(self._sessions))
        self.metrics.session_kv_live_bytes.set(cells * self.model.kv_bytes_per_token)
        self.metrics.queue_depth.set(self.scheduler.queue_depth())
        self._health = {"status": "ok", "sessions": len(self._sessions), "kv_cells_used": cells,
                        "n_ctx": self.context.n_ctx}


async def _done_last(events: AsyncGenerator[Event, None]) -> AsyncGenerator[Event, None]:
    """`events` with the DoneEvent held until the generation's cleanup has run (the session idle
    again): a client that reads it may use the session at once without finding it busy."""
    done = None
    async with contextlib.aclosing(events):  # (closed at once when its reader closes this one)
        async for event in events:
            if isinstance(event, DoneEvent):
                done = event
            else:
                yield event
    if done is not None:
        yield done


@contextlib.contextmanager
def _pinned(session: Session) -> Iterator[None]:
    """The session's KV is not evicted for room meanwhile (Session.pinned), as it is not idle: a
    prompt that needs the room gets 503 (Overloaded), not this session its 404 or 500."""
    was = session.pinned
    session.pinned = True
    try:
        yield
    finally:
        if not session.closed:
            session.pinned = was


def _started(steps: Iterator[Any]) -> Iterator[Any]:
    """A generator whose first item is PENDING, advanced past it: closing it from now on runs its
    cleanup (a generator never started runs none), even if a client that left at once means the
    scheduler never steps it."""
    next(steps)
    return steps


def _typed_errors(fn: Any) -> Any:
    """The engine's errors a client caused, as ServiceErrors."""
    try:
        return fn()
    except (SessionClosedError, SessionEvictedError) as exc:
        raise NotFound(str(exc), type(exc)) from None
    except ContextOverflowError as exc:  # the library's advice ("create the Context with ...") in a server's words
        raise ContextFull(str(exc).replace("create the Context with a larger n_ctx",
                                           "restart the server with a larger --n-ctx")) from None
    except (InvalidTokenError, InvalidArgumentError, GrammarError) as exc:
        raise BadRequest(str(exc), type(exc)) from None
