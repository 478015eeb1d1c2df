"""What a generation gives, event by event: each token (TokenEvent), then its end with what it cost
(DoneEvent, Usage). A chat reply's events also carry its parse: the pieces each token added, and
the reply as a whole at the end."""
from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from ..grammar import SchemaCheck
from ..tokens import TokenLogprob
from .reply_parser import Piece, Reply


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
        """Prompt tokens whose KV was reused, not computed: from RAM or restored from the disk tier
        (``restored`` is the part that came from disk)."""
        return max(0, self.prompt_tokens - self.computed)

    def as_dict(self) -> dict[str, Any]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "cached_tokens": self.cached_tokens, "computed_tokens": self.computed,
                "restored_tokens": self.restored, "drafted_tokens": self.drafted,
                "grammar_forced_tokens": self.forced, "approximate": self.approximate}


@dataclass(frozen=True)
class TokenEvent:
    id: int
    text: str
    pieces: tuple[Piece, ...] = ()  # a chat reply: what this token's text added to the parsed reply
    # the first token's: the usage so far, which says how the prompt's KV was obtained (a stream's
    # opening event reports it, as Anthropic's message_start does)
    usage: Usage | None = None
    index: int = 0  # of the choice it belongs to (OpenAI's n: choices.py)
    logprob: TokenLogprob | None = None  # with GenerateParams.logprobs


@dataclass(frozen=True)
class DoneEvent:
    finish_reason: str
    usage: Usage
    stop_string: str | None = None  # the stop string that ended the generation, if one did
    schema: SchemaCheck | None = None  # with a JSON Schema: the output checked against all of it
    reply: Reply | None = None  # a chat reply: as parsed to its end
    pieces: tuple[Piece, ...] = ()  # a chat reply: what its parser held back until the end (ReplyParser.finish)
    index: int = 0  # of the choice it ends
    logprobs: tuple[TokenLogprob, ...] = ()  # with GenerateParams.logprobs: every generated token's, in order

    def schema_fields(self) -> dict[str, Any]:
        """With a JSON Schema: whether the output is valid against all of it (``schema_valid``;
        ``schema_error`` says why not); else nothing."""
        return {} if self.schema is None else {"schema_valid": self.schema.valid, "schema_error": self.schema.error}

    def reply_fields(self) -> dict[str, Any]:
        """A chat reply's format (``tool_format``: "generic", the native format's name: "hermes", "mistral", ..., or
        "none"), and why a call it began could not be read (``malformed_call``), if so."""
        if self.reply is None:
            return {}
        malformed = {"malformed_call": self.reply.malformed} if self.reply.malformed else {}
        return {"tool_format": self.reply.tool_format, **malformed}

    def session_fields(self) -> dict[str, Any]:
        """The end of a session's generation over HTTP: as the gRPC ``Done`` message, with the schema fields."""
        return {"finish_reason": self.finish_reason, "usage": self.usage.as_dict(), "stop_string": self.stop_string,
                **self.schema_fields()}

    def answer_fields(self) -> dict[str, Any]:
        """What a choice's end says beside its text: the schema fields and the reply's format."""
        return {**self.schema_fields(), **self.reply_fields()}

    def extension(self) -> dict[str, Any]:
        """What a one-choice answer's ``pyllamaopt`` field says: the usage and the answer's fields."""
        return {**self.usage.as_dict(), **self.answer_fields()}


Event = TokenEvent | DoneEvent


async def done_last(events: AsyncGenerator[Event, None]) -> AsyncGenerator[Event, None]:
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
