"""The session service: everything the transports (HTTP routes, gRPC) share.

It knows nothing of HTTP. Each operation validates its input, runs on the scheduler thread,
and raises a ``ServiceError`` (errors.py) with a status a transport maps to its own (HTTP 4xx,
gRPC codes). It is a facade over the parts that hold the state: the protocol sessions
(session_registry.py), the idle request sessions (request_pool.py), the prompts being computed
(prefill_coordinator.py) and the generations (generation.py).

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
  A chat reply (``GenerateParams.reply``) is parsed here, once, as it streams: the events carry
  the parse to the routes.
- the session protocol (specification 003 §2.2): server-issued ids, raw tokens appended, one
  generation at a time per session, idle sessions closed after a TTL or when over capacity
  (least recently used first), and "not found" afterwards, never a silent reset.
"""
from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Callable, Iterator, Sequence
from typing import Any

from ..context import Context
from ..session import Session
from ..stats import Stats
from ..tokens import TokenLogprob
from .choices import choice_params, interleaved
from .errors import BadRequest, ContextFull, InvariantViolation, typed_errors
from .events import Event, done_last
from .generation import GenerationRunner
from .metrics import Metrics
from .params import GenerateParams
from .pinning import pinned
from .prefill_coordinator import PrefillCoordinator
from .request_pool import IdleRequestPool
from .scheduler import PENDING, Scheduler, primed
from .schema_cache import DEFAULT_JSON_WHITESPACE
from .session_registry import ProtocolSession, SessionRegistry


class Service:
    def __init__(self, context: Context, scheduler: Scheduler, metrics: Metrics, *,
                 max_sessions: int, session_ttl: float, json_whitespace: str = DEFAULT_JSON_WHITESPACE,
                 session_id_prefix: str = "") -> None:
        self.context = context
        self.model = context.model
        self.scheduler = scheduler
        self.metrics = metrics
        self._sessions = SessionRegistry(metrics, max_sessions=max_sessions, session_ttl=session_ttl,
                                         changed=self._update_gauges, id_prefix=session_id_prefix)
        self._idle = IdleRequestPool(context)
        self._prefills = PrefillCoordinator(context, scheduler, metrics)
        self._generations = GenerationRunner(metrics, json_whitespace)
        self._health: dict[str, Any] = {}
        self._update_gauges()

    @property
    def sparse_tool_results(self) -> bool:
        """Tier 2 (``--sparse-tool-results``): the chat routes mark tool results for sparse attention."""
        return bool(self.context.config.sparse_attn_enabled)

    # stateless prompts

    def complete(self, tokens: list[int], params: GenerateParams, *, tool_spans: Sequence[tuple[int, int]] = (),
                 n: int = 1) -> AsyncGenerator[Event, None]:
        """Generates after `tokens` (see the module's docstring); `tool_spans`: the tool results
        among them, for sparse attention (``Session.sync``); `n` choices, the prompt computed once
        (choices.py: the events carry their choice's index)."""
        accepted = time.perf_counter()  # time to first token counts the prompt's wait and computation

        def answer(session: Session, kept: int) -> Iterator[Any]:
            before = session.stats
            with pinned(session):  # from the prompt to the answer: another prompt's room is a 503, not this
                try:
                    yield PENDING  # see scheduler.primed
                    yield from self._prefills.prefill(session, tokens, sync=True, kept=kept, tool_spans=tool_spans)
                except GeneratorExit:  # the client left: what was computed stays usable
                    self._idle.keep(session)
                    raise
                except BaseException:
                    session.close()
                    raise
                self._verify(session)
                if n == 1:
                    yield from self._generation(session, len(tokens), params, before, done=self._idle.keep,
                                                started=accepted)
                else:
                    yield from self._choices(session, len(tokens), params, n, before, accepted)

        def start() -> tuple[Iterator[Any], Any]:
            self._check_prompt(tokens)
            session, kept = self._idle.take(tokens)
            return primed(answer(session, kept)), session

        return self.scheduler.stream(start)

    async def score(self, tokens: list[int], top: int) -> tuple[list[TokenLogprob | None], int]:
        """A prompt's own log-probabilities (OpenAI's echo), with `top` alternatives per token, and
        the tokens computed for them: every position computed afresh, on a request session that then
        stays idle with the prompt (a completion after it finds it: Session.score). In one piece."""
        def score() -> tuple[list[TokenLogprob | None], int]:
            self._check_prompt(tokens)
            session, _ = self._idle.take(tokens)
            before = session.stats
            with pinned(session):
                try:
                    logprobs = session.score(tokens, top_logprobs=top)
                except BaseException:
                    session.close()
                    raise
                self._verify(session)
            self._idle.keep(session)
            self._update_gauges()
            return logprobs, (session.stats - before).tokens_prefilled

        return await self._run(score)

    def _check_prompt(self, tokens: list[int]) -> None:
        """A prompt that cannot be answered: empty, or no room left for an answer."""
        if not tokens:
            raise BadRequest("the prompt is empty: give at least one token (or a message with text)")
        if len(tokens) >= self.context.n_ctx:  # (all of it: no room for an answer)
            raise ContextFull(f"the prompt has {len(tokens)} tokens, and the server's context holds "
                              f"{self.context.n_ctx} with the answer: shorten it, or restart the server with a "
                              "larger --n-ctx")

    # the session protocol

    async def create_session(self, tokens: list[int]) -> str:
        def create() -> Iterator[Any]:
            self._sessions.make_room()
            session = self._idle.open(self.context.session)
            session_id, entry = self._sessions.add(session, busy="prefilling")
            try:
                yield from self._prefills.prefill(session, tokens, sync=False)
            except BaseException:
                self._sessions.forget(session_id)
                session.close()
                raise
            entry.busy = None
            entry.last_used = time.monotonic()  # idle from now: a long prefill does not count against the TTL
            self._verify(session, entry, grew_from=0)
            self._sessions.created()
            yield session_id

        return await self._run_pieces(create)

    async def append(self, session_id: str, tokens: list[int]) -> dict[str, Any]:
        return await self._change_history(session_id, tokens, sync=False)

    async def sync(self, session_id: str, tokens: list[int]) -> dict[str, Any]:
        return await self._change_history(session_id, tokens, sync=True)

    async def fork(self, session_id: str) -> str:
        def fork() -> str:
            entry = self._sessions.get(session_id, idle=True)
            self._sessions.make_room(keep=session_id)
            new_id, _ = self._sessions.add(self._idle.open(entry.session.fork))
            self._sessions.created()
            return new_id

        return await self._run(fork)

    async def info(self, session_id: str) -> dict[str, Any]:
        return await self._run(lambda: self._info(session_id, self._sessions.get(session_id)))

    async def close(self, session_id: str) -> None:
        def close() -> None:
            entry = self._sessions.get(session_id, idle=True)
            self._sessions.drop(session_id, entry, outcome="closed")

        await self._run(close)

    def generate(self, session_id: str, params: GenerateParams) -> AsyncGenerator[Event, None]:
        """One generation at a time per session: a second one is refused (Busy) until it ends."""
        def start() -> tuple[Iterator[Event], Any]:
            entry = self._sessions.get(session_id, idle=True)
            if entry.session.n_tokens == 0:
                raise BadRequest(f"session {session_id!r} has no history to generate after: append tokens first")
            entry.busy = "generating"
            # its prompt is the whole history, computed by the calls since the previous generation (the
            # creation's restore included): the usage OpenAI's route gives for the same prompt
            session = entry.session
            return primed(self._generation(session, session.n_tokens, params, entry.prompt_from, entry=entry)), session

        return done_last(self.scheduler.stream(start))

    async def tokenize(self, text: str, *, add_bos: bool, special: bool) -> list[int]:
        """The model's token ids of `text` (no template): for clients without a tokenizer of their own."""
        return await self._run(lambda: self.model.tokenize(text, add_bos=add_bos, special=special))

    async def expire_idle(self) -> int:
        """Closes sessions idle for longer than the TTL; returns how many."""
        return await self._run(self._sessions.expire_idle)

    def health(self) -> dict[str, Any]:
        """At once, from the figures of the scheduler's last change (not behind a long prompt in
        progress: a liveness probe waited for all of it)."""
        self.metrics.queue_depth.set(self.scheduler.queue_depth())
        return dict(self._health)

    def close_all(self) -> int:
        """Closes every session (on the scheduler thread; with persistence on they are saved);
        returns how many there were."""
        def close_all() -> int:
            closed = self._sessions.close_all()
            self._idle.close_all()
            return closed

        return self.scheduler.call(close_all).result()

    # on the scheduler thread

    async def _change_history(self, session_id: str, tokens: list[int], *, sync: bool) -> dict[str, Any]:
        def change() -> Iterator[Any]:
            entry = self._sessions.get(session_id, idle=True)
            entry.busy = "prefilling"
            before = entry.session.n_tokens
            try:
                yield from self._prefills.prefill(entry.session, tokens, sync=sync)
            finally:
                entry.busy = None
                entry.last_used = time.monotonic()
                self._update_gauges()
            self._verify(entry.session, entry, grew_from=None if sync else before)
            yield self._info(session_id, entry)

        return await self._run_pieces(change)

    async def _run(self, fn: Callable[[], Any]) -> Any:
        return await self.scheduler.run(lambda: typed_errors(fn))

    async def _run_pieces(self, work: Callable[[], Iterator[Any]]) -> Any:
        """Runs the generator `work()` on the scheduler thread, other work taking its turn at each
        PENDING it yields; returns the last item it yields. A client that leaves closes it there."""
        result = None
        async for item in self.scheduler.stream(lambda: (work(), None)):
            result = item
        return result

    def _info(self, session_id: str, entry: ProtocolSession) -> dict[str, Any]:
        return SessionRegistry.info(session_id, entry, self.context.kv_bytes_per_token)

    def _verify(self, session: Session, entry: ProtocolSession | None = None, *, grew_from: int | None = None) -> None:
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
        session_id = None if entry is None else self._sessions.id_of(entry)
        if session_id is not None and entry is not None:
            self._sessions.drop(session_id, entry, outcome="failed")
        raise InvariantViolation(f"internal error: the session's KV cache was found inconsistent ({what}); the session "
                                 "was closed: create a new one and send its tokens again (and please report this)")

    def _generation(self, session: Session, prompt_tokens: int, params: GenerateParams, before: Stats, *,
                    entry: ProtocolSession | None = None, done: Callable[[Session], None] | None = None,
                    started: float | None = None) -> Iterator[Any]:
        """The events of one generation (GenerationRunner.events; `started`: when the request came,
        else now), then the bookkeeping: a protocol session's `entry` idle again, `done(session)`
        for a request session, the gauges."""
        def finished() -> None:
            if entry is not None:
                entry.busy = None
                entry.last_used = time.monotonic()
                entry.prompt_from = session.stats
            if done is not None:
                done(session)
            self._update_gauges()

        return self._generations.events(session, prompt_tokens, params, before,
                                        started=time.perf_counter() if started is None else started,
                                        verify=lambda history: self._verify(session, entry, grew_from=history),
                                        finished=finished)

    def _choices(self, session: Session, prompt_tokens: int, params: GenerateParams, n: int, before: Stats,
                 started: float) -> Iterator[Any]:
        """`n` choices after the prompt `session` holds (choices.py): its own generation, kept for reuse
        afterwards, and n - 1 on forks of it, closed afterwards (their blocks stay cached)."""
        forks: list[Session] = []
        try:
            for _ in range(n - 1):
                forks.append(self._idle.open(session.fork))
        except BaseException:
            for fork in forks:
                fork.close()
            self._idle.keep(session)
            raise
        runs = [primed(self._generation(session, prompt_tokens, params, before, done=self._idle.keep, started=started))]
        runs += [primed(self._generation(fork, 0, choice_params(params, i), fork.stats, done=Session.close,
                                         started=started)) for i, fork in enumerate(forks, 1)]
        return interleaved(runs, [session, *forks])

    def _update_gauges(self) -> None:
        """On the scheduler thread, after each change: the gauges, and what /health says."""
        cells = self.context.kv_cells_used
        self.metrics.session_active.set(len(self._sessions))
        self.metrics.session_kv_live_bytes.set(cells * self.context.kv_bytes_per_token)
        self.metrics.queue_depth.set(self.scheduler.queue_depth())
        self.metrics.follow_persist(self.context.stats)
        self._health = {"status": "ok", "sessions": len(self._sessions), "kv_cells_used": cells,
                        "n_ctx": self.context.n_ctx, "kv_type": self.context.kv_type}
