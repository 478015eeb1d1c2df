"""One generation's events, on the scheduler thread: its tokens (a chat reply parsed as they come,
its stop strings and a repeated call ending it), then its end with what it cost; timed and counted."""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from ..grammar import SchemaCheck
from ..session import Session
from ..stats import Stats
from ..tokens import TokenLogprob
from .errors import typed_errors
from .events import DoneEvent, TokenEvent, Usage
from .metrics import Metrics
from .native_reply import NativeReplyParser
from .params import GenerateParams
from .pinning import pinned
from .reply_parser import ReplyParser
from .scheduler import PENDING
from .schema_cache import SchemaCache


class GenerationRunner:
    def __init__(self, metrics: Metrics, json_whitespace: str) -> None:
        self.metrics = metrics
        self._schemas = SchemaCache(json_whitespace)

    def events(self, session: Session, prompt_tokens: int, params: GenerateParams, before: Stats, *,
               started: float, verify: Callable[[int], None], finished: Callable[[], None]) -> Iterator[Any]:
        """The events of one generation (after a first PENDING: see scheduler.primed); `before`: the
        session's counters before this request; `started`: when the request came (time to first
        token); `verify(history)`: the invariants checked after it, given the history's length before
        it; `finished()`: run at its end, however it ends."""
        history = session.n_tokens
        self.metrics.session_history_tokens.observe(history)
        generation = None
        reply = _reply_parser(params)
        with pinned(session):
            try:
                yield PENDING
                schema = None
                if params.json_schema is not None:
                    wanted = params.json_schema
                    schema = typed_errors(lambda: self._schemas.compiled(wanted, params.schema_strict))
                generation = typed_errors(lambda: session.generate(params.max_tokens, json_schema=schema,
                                                                   **params.engine_kwargs()))
                last = None
                logprobs: list[TokenLogprob] = []  # (with params.logprobs)
                ended_by = None  # the reply's end reason, if the reply ended the generation
                steps = iter(generation)
                while (token := typed_errors(lambda: next(steps, None))) is not None:
                    now = time.perf_counter()
                    prompt_usage = None
                    if last is None:
                        self.metrics.time_to_first_token_seconds.observe(now - started)
                        prompt_usage = _usage(session, before, prompt_tokens, 0)
                    else:
                        self.metrics.inter_token_latency_seconds.observe(now - last)
                    last = now
                    pieces = () if reply is None else tuple(reply.feed(token.text))
                    if token.logprob is not None:
                        logprobs.append(token.logprob)
                    yield TokenEvent(token.id, token.text, pieces, prompt_usage, logprob=token.logprob)
                    if reply is not None and (ended_by := reply.end_reason):
                        generation.close()
                        break
                verify(history)
                usage = _usage(session, before, prompt_tokens, len(generation.tokens))
                self.metrics.count_usage(usage)
                check = None if schema is None else SchemaCheck(generation.schema_valid, generation.schema_error)
                stop_string = reply.stop_string if ended_by and reply is not None else generation.stop_string
                held = () if reply is None else tuple(reply.finish())
                parsed = None if reply is None else reply.result()
                finish = ended_by or generation.finish_reason or "stop"
                if parsed is not None and parsed.malformed and finish in ("eos", "stop"):
                    finish = "malformed_call"  # the model ended a reply whose call does not parse
                yield DoneEvent(finish, usage, stop_string, check, parsed, held, logprobs=tuple(logprobs))
            finally:
                if generation is not None:
                    # a request cancelled mid-stream: the turn ends now (the session becomes evictable
                    # again), not when the garbage collector finds the generation (it is a cycle)
                    generation.close()
                finished()


def _reply_parser(params: GenerateParams) -> ReplyParser | NativeReplyParser | None:
    """The parser of a chat reply: llama.cpp's for a native format, else ours (generic or text)."""
    reply = params.reply
    if reply is None:
        return None
    if reply.native is not None:
        return NativeReplyParser(reply.native, reply.call_id_prefix, reply.tool_format)
    return ReplyParser(reply.generic, reply.call_id_prefix, params.stop, reply.tool_format)


def _usage(session: Session, before: Stats, prompt_tokens: int, completion_tokens: int) -> Usage:
    """What the session's work since `before` cost, `completion_tokens` generated."""
    stats = session.stats - before
    return Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, computed=stats.tokens_prefilled,
                 restored=stats.persist_tokens_restored, drafted=stats.memo_tokens_skipped,
                 forced=stats.schema_tokens_inferred, approximate=session.approx_from is not None,
                 sparse_dropped=stats.sparse_tokens_dropped)
