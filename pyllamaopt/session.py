"""Session: one conversation's token history in a context, and generation from it."""
from __future__ import annotations

import codecs
import contextlib
import weakref
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

import numpy as np

from . import _core
from .config import OptConfig
from .errors import ContextOverflowError, InvalidArgumentError, SessionClosedError, SessionEvictedError
from .logprobs import check_top, from_core, score_prompt
from .model import Model, check_token_ids
from .sampling import (budget, check_grammar_prefill, check_max_tokens, output_grammar, sampling_settings,
                       trigger_settings)
from .stats import Stats
from .stop_strings import find_stop, held_back, stop_list
from .tokens import Token, TokenLogprob

if TYPE_CHECKING:
    from .grammar import SchemaCheck, SchemaGrammar


class SessionContext(Protocol):
    """What a session uses of the context it is a sequence of (``Context`` is one). Named here
    instead of ``Context``, which creates sessions: the two modules then depend one way."""

    @property
    def model(self) -> Model: ...

    @property
    def config(self) -> OptConfig: ...

    @property
    def n_ctx(self) -> int: ...


class Generation(Iterator[Token]):
    """A streaming generation: iterate for tokens; afterwards ``text``, ``tokens``,
    ``finish_reason`` ('eos', 'length', 'stop', 'context_full', 'grammar' or 'interrupted') and,
    with a JSON Schema, ``schema_valid``."""

    def __init__(self, session: Session, max_tokens: int | None, stop: Sequence[str],
                 sampling: _core.Sampling, on_finish: Callable[[Generation], None] | None = None, grammar: str = "",
                 schema: SchemaGrammar | None = None, triggers: Sequence[_core.GrammarTrigger] = (),
                 grammar_prefill: str = "") -> None:
        self.session = session
        self._grammar = grammar
        self._triggers = list(triggers)
        self._grammar_prefill = grammar_prefill
        self.schema = schema
        self._check: SchemaCheck | None = None
        self._on_finish = on_finish
        self.tokens: list[int] = []
        self.text = ""
        self.finish_reason: str | None = None
        self.stop_string: str | None = None  # which of the stop strings ended it (finish_reason 'stop')
        self._tag = object()  # tells the session which generation it is configured for
        self._ref = weakref.ref(self)  # tells it which one is under way (the steps see a proxy, see below)
        # the steps see this generation through a weak proxy: no reference cycle, so a generation
        # its caller drops unfinished is freed at once, and freeing its steps ends the session's
        # turn (with a cycle the session stayed generating, never evictable, until a gc run)
        self._steps = Generation._run(cast(Generation, weakref.proxy(self)), max_tokens, list(stop), sampling)

    def __next__(self) -> Token:
        return next(self._steps)

    @property
    def schema_valid(self) -> bool | None:
        """With ``json_schema``: whether the finished text is an instance of the *whole* schema,
        checked with jsonschema (what a strict=False grammar left out included). None while
        generating, without a schema, or if the check could not run (``schema_error`` says why);
        False for an output cut short (finish_reason 'length', ...) that is not a valid instance."""
        check = self._schema_check()
        return None if check is None else check.valid

    @property
    def schema_error(self) -> str | None:
        """Why ``schema_valid`` is False or None (the first violation, with its JSON path)."""
        check = self._schema_check()
        return None if check is None else check.error

    def _schema_check(self) -> SchemaCheck | None:
        if self.schema is None or self.finish_reason is None:
            return None
        if self._check is None:
            self._check = self.schema.check(self.text)
        return self._check

    def close(self) -> None:
        """Stops the generation where it is (``finish_reason`` 'interrupted' unless it was over)
        and ends the turn, as exhausting it would."""
        self._steps.close()

    def _run(self, max_tokens: int | None, stop: list[str], sampling: _core.Sampling) -> Generator[Token, None, None]:
        session = self.session
        core = session._core
        session.end_generation_in_progress()
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        full = ""  # all text decoded so far; self.text is the part released
        start = len(core.tokens)
        try:
            session._running = self._ref  # (the finally clears it, whatever fails from here)
            if session._configured_for is not self._tag:  # another generation of the session came between
                core.set_sampling(sampling)
                core.set_grammar(self._grammar, budget(max_tokens, core.room), self._triggers, self._grammar_prefill)
                session._configured_for = self._tag
            if max_tokens == 0:
                self.finish_reason = "length"
            elif core.room == 0:
                self.finish_reason = "context_full"
            while self.finish_reason is None:
                try:
                    step = core.step()  # the one call into the engine per token
                except ContextOverflowError:  # the KV cache is full, even after evictions
                    self.finish_reason = "context_full"
                    break
                token = step.token
                if token < 0:
                    self.finish_reason = "grammar"  # the grammar allows no token here
                    break
                self.tokens.append(token)
                if step.eog:
                    self.finish_reason = "eos"
                else:
                    full += decoder.decode(step.piece)
                    cut = find_stop(full, stop, len(self.text))
                    if cut is not None:
                        full, self.stop_string, self.finish_reason = full[:cut[0]], cut[1], "stop"
                    elif max_tokens is not None and len(self.tokens) >= max_tokens:
                        self.finish_reason = "length"
                    elif step.room == 0:
                        self.finish_reason = "context_full"
                if self.finish_reason is None:
                    release = len(full) - held_back(full, stop)
                else:
                    if self.finish_reason != "stop":
                        full += decoder.decode(b"", final=True)
                    release = len(full)
                piece, self.text = full[len(self.text):release], full[:release]
                yield Token(token, piece, None if step.logprob is None else from_core(step.logprob))
        except KeyboardInterrupt:
            self.finish_reason = "interrupted"
            # Ctrl-C lands inside core.step() (it runs without the GIL) after the step committed its
            # token to the history: the generation keeps what the history has
            missing = core.tokens[start + len(self.tokens):]
            if missing:
                model = session.context.model._core
                self.tokens.extend(missing)
                full += decoder.decode(b"".join(model.token_piece(t, False) for t in missing), final=True)
                self.text = full
            raise
        finally:
            with contextlib.suppress(ReferenceError):  # (the caller dropped the generation: only end the turn)
                if self.finish_reason is None:  # abandoned by the caller
                    self.finish_reason = "interrupted"
            core.end_turn()
            session._configured_for = None  # the turn's end dropped its grammar and budget
            session._running = None
            with contextlib.suppress(ReferenceError):
                if self._on_finish:
                    self._on_finish(self)


_TIER2_PREFIXES = ("attn_prune_", "sparse_", "spec_prefill_")
_CONTEXT_ONLY = ("spec_prefill_draft_model",)  # a model loaded with the context
_SPAN_KINDS = {"text": _core.SpanKind.text, "system": _core.SpanKind.system, "tool": _core.SpanKind.tool}


class Session:
    """One sequence of a context: an append-only token history.

    >>> session = ctx.session()
    >>> session.append_text("The capital of France is")
    >>> print(session.generate_text(max_tokens=16))

    Raw token ids are the contract (``append``, ``tokens``); text and chat are conveniences.
    """

    def __init__(self, context: SessionContext, core: _core.Session) -> None:
        self.context = context
        self._core = core
        # the tag of the generation whose sampling and grammar the engine holds (not the generation:
        # that would be a cycle, see Generation.__init__)
        self._configured_for: object | None = None
        self._running: weakref.ref[Generation] | None = None  # the generation started and not ended

    def end_generation_in_progress(self) -> None:
        """Closes a generation of this session that started and did not end (finish_reason
        'interrupted'), as a new one begins: one turn at a time (it went on with the new one's
        grammar and budget, and the new one's end ended its turn)."""
        running = self._running() if self._running is not None else None
        if running is not None:
            running.close()

    # history

    @property
    def tokens(self) -> list[int]:
        """The history: appended and generated tokens."""
        return self._core.tokens

    @property
    def n_tokens(self) -> int:
        return len(self._core.tokens)

    @property
    def text(self) -> str:
        return self.context.model.detokenize(self.tokens)

    def save(self) -> int:
        """Store the KV of the history's complete blocks in the persistent KV cache (the context
        needs ``persist_enabled``); a later session or process whose prompt starts with them
        restores them instead of computing them. Returns the tokens stored (or already stored);
        0 if writing failed (counted in ``stats.persist_errors``). Synchronous: with
        ``persist_write_behind`` (on by default) it first waits for the blocks the session queued
        for the background writer, which already writes each prompt's blocks as they are computed
        (``Context.flush_persist`` waits for every session's). Sessions are also saved (queued)
        when they close."""
        return self._core.save()

    @property
    def invariant_violation(self) -> str | None:
        """None if the session's KV is what its history says (the specification's INV-1, checked
        against the KV memory itself), else what differs: a bug, never a state to go on from."""
        return self._core.invariant_violation

    @property
    def approx_from(self) -> int | None:
        """Tier 2: the position from which this session's KV is approximate (``diff_reuse_shifted``:
        reused at a shifted position after an edit; ``diff_reuse_generated``: generated tokens'
        KV kept from their one-token steps), or None when all of it is exact."""
        return self._core.approx_from

    def append(self, tokens: Iterable[int], kind: str = "text") -> None:
        """Add tokens to the history and compute their KV. On error the session is unchanged.

        ``kind`` says what the tokens are, for the Tier-2 methods (off by default; nothing
        changes without them): ``"system"`` is never pruned (``attn_prune_enabled``);
        ``"tool"`` marks a tool result, whose spans irrelevant to the next non-tool append are
        dropped from attention before that is computed (``sparse_attn_enabled``)."""
        if kind not in _SPAN_KINDS:
            raise InvalidArgumentError(f"kind must be one of {', '.join(map(repr, _SPAN_KINDS))}, got {kind!r}")
        self._core.append(check_token_ids(tokens), _SPAN_KINDS[kind])

    def configure_tier2(self, **values: Any) -> None:
        """This session's settings of the Tier-2 methods that take KV out of attention
        (``attn_prune_*``, ``sparse_attn_*``, ``sparse_relevance_threshold``) and of speculative
        prefill (``spec_prefill_*`` but the draft model, which the context loads), instead of the
        context's; forks keep them. ``attn_prune_enabled=True`` and ``spec_prefill_enabled=True``
        need a context made with them. Raises ConfigError for a bad value, InvalidArgumentError for
        another option."""
        other = [name for name in values if not name.startswith(_TIER2_PREFIXES) or name in _CONTEXT_ONLY]
        if other:
            raise InvalidArgumentError("configure_tier2 takes attn_prune_*, sparse_* and spec_prefill_* options "
                                       f"(not spec_prefill_draft_model) only, got {other}")
        config = OptConfig(env={})
        for name, value in {**self.context.config.as_dict(), **values}.items():
            if name.startswith(_TIER2_PREFIXES):
                config.set(name, value)
        self._core.set_tier2(config._core)

    def drop_span(self, start: int, end: int) -> None:
        """Tier 2: take the KV of positions [start, end) out of attention (its cells are freed;
        the positions of the rest do not change). The last evaluated token always keeps its KV.
        The session is approximate from ``start`` on (``approx_from``): its KV is never shared
        with other sessions, forks or the disk cache beyond that point."""
        for name, value in (("start", start), ("end", end)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidArgumentError(f"{name} must be a position (an integer >= 0), got {value!r}")
        self._core.drop_span(start, end)

    @property
    def holes(self) -> list[tuple[int, int]]:
        """Tier 2: the spans [start, end) of the history whose KV left attention (dropped, or
        pruned to cold storage by ``attn_prune_enabled``)."""
        return self._core.holes

    @property
    def n_cold(self) -> int:
        """Tier 2 (``attn_prune_enabled``): tokens whose KV was pruned to cold storage in RAM,
        from where it comes back when a turn attends to it again."""
        return self._core.n_cold

    def attention_probe(self) -> dict[str, Any]:
        """The attention of the last append's final queries over the session's keys, as the
        model computed them (needs a context with ``attn_prune_enabled``): ``q`` (layers ×
        queries × heads × head_dim, before the attention scale), ``k`` (layers × keys × KV heads
        × head_dim), ``q_pos``, ``k_pos``, ``scale``, ``layers`` (the full-attention layers) and
        ``scores`` (per key: softmax over keys, max over heads, mean over queries and layers)."""
        return self._core.attention_probe()

    def sync(self, tokens: Sequence[int], *, tool_spans: Sequence[tuple[int, int]] = ()) -> None:
        """Set the history to `tokens` (what chat clients re-send every turn): the KV of the
        common prefix with the current history is kept, the rest is computed. A bad token or
        a history longer than the context leaves the session unchanged; if the KV cache runs
        out of room while computing, the history is cut back to the tokens whose KV exists.

        ``tool_spans``: the tool results among `tokens` ([start, end) ranges, sorted, disjoint;
        ``pyllamaopt.chat.token_spans`` finds them in a rendered chat). With ``sparse_attn_enabled``
        (Tier 2, off by default) the new ones are marked as ``append(kind="tool")`` marks them
        and scored once, against the text after the last of them; off, they are ignored."""
        spans = list(tool_spans)
        for span in spans:
            if (not isinstance(span, (tuple, list)) or len(span) != 2
                    or any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in span)):
                raise InvalidArgumentError(f"tool_spans must hold (start, end) pairs of positions, got {span!r}")
        self._core.sync(check_token_ids(tokens), [(span[0], span[1]) for span in spans])

    def score(self, tokens: Sequence[int], *, top_logprobs: int = 0) -> list[TokenLogprob | None]:
        """Set the history to `tokens`, computing every one afresh (no KV reused: the logits of every
        position are computed, which reuse would skip), and return each token's log-probability given
        the tokens before it, with the ``top_logprobs`` (0..20) most likely tokens there; None for the
        first token. Bit for bit what a fresh context computes for the same tokens, whatever this
        session or the cache held (docs/exactness.md, "Echo"). Costs a prefill of all of them with
        every row's logits; their blocks join the pool, and the next generation computes the last
        chunk again (the logits after the last token come from the usual prefill)."""
        return score_prompt(self, tokens, top_logprobs)

    def fork(self) -> Session:
        """A new session with the same history, sharing this one's KV (no recomputation of
        complete blocks)."""
        return Session(self.context, self._core.fork())

    def append_text(self, text: str, *, add_bos: bool | None = None, special: bool = False) -> list[int]:
        """Tokenize and append `text`; returns its tokens. ``add_bos`` defaults to: only at
        the start of an empty session, if the model uses BOS."""
        if add_bos is None:
            add_bos = self.n_tokens == 0
        tokens = self.context.model.tokenize(text, add_bos=add_bos, special=special)
        self.append(tokens)
        return tokens

    # generation

    def generate(self, max_tokens: int | None = 256, *, temperature: float = 0.0, top_k: int = 40,
                 top_p: float = 0.95, min_p: float = 0.05, seed: int | None = None,
                 logit_bias: Mapping[int, float] | None = None, frequency_penalty: float = 0.0,
                 presence_penalty: float = 0.0, repeat_penalty: float = 1.0, repeat_last_n: int = 64,
                 stop: str | Sequence[str] | None = (), grammar: str | None = None,
                 grammar_triggers: Sequence[tuple[str, str | int]] | None = None, grammar_prefill: str = "",
                 json_schema: dict | bool | SchemaGrammar | None = None, strict: bool = True,
                 logprobs: int | None = None, on_finish: Callable[[Generation], None] | None = None) -> Generation:
        """Stream generated tokens (greedy unless ``temperature`` > 0).

        max_tokens  at most this many tokens (None: until end of generation or a full context)
        seed        makes sampling reproducible (default: random)
        logit_bias  {token id: bias} added to those tokens' logits before anything else (OpenAI
                    uses -100..100: -100 bans a token in practice, except one the grammar forces)
        frequency_penalty, presence_penalty, repeat_penalty, repeat_last_n
                    llama.cpp's repetition penalties, after the biases, over the last
                    ``repeat_last_n`` tokens of the history (the prompt's included): a token's
                    logit less ``frequency_penalty`` per occurrence and ``presence_penalty`` once,
                    divided by ``repeat_penalty`` (multiplied, if negative); 0, 0 and 1: off
        stop        strings that end generation; they are not part of the returned text
        grammar     a GBNF grammar (llama.cpp's format, a ``root`` rule) the output must match
        grammar_triggers
                    make ``grammar`` lazy, as llama.cpp applies a chat format's tool-call grammar:
                    the output is free (the tokens and logits of no grammar) until one of these
                    fires, then the grammar takes the output from the trigger's match on and
                    constrains the rest. (kind, value) pairs: ("word", text) or ("pattern", regex)
                    found anywhere in the output, ("pattern_full", regex) matching all of it (the
                    grammar starts at its first capturing group that matched), ("token", token id)
        grammar_prefill
                    text ``grammar`` takes before the output, as though generated (it is not added to
                    the session): a chat template's generation prompt, which llama.cpp's sampler
                    feeds a chat format's grammar whose root starts with it (common_sampler_init);
                    not with grammar_triggers (llama.cpp prefills no lazy grammar)
        json_schema a JSON Schema the output must be an instance of (True: any JSON value), or
                    one compiled with ``pyllamaopt.grammar.compile_json_schema`` (reused as is);
                    the supported keywords: docs/structured-output.md
        strict      with json_schema: True refuses (UnenforceableSchemaError) a schema with a
                    constraint a grammar cannot enforce; False enforces the rest and reports
                    in ``Generation.schema_valid`` whether the output is valid against all of it
        logprobs    each Token's ``logprob``: its log-probability under the model's raw logits (before
                    logit_bias, penalties, grammar and temperature) and this many (0..20) most likely
                    tokens there; None: off. With a grammar, forced tokens are then picked from logits
                    too (the same tokens, computed rather than skipped)
        on_finish   called with the Generation when it ends

        With a grammar, tokens the grammar forces are taken without computing logits
        (``schema_skip_enabled``, exact); ``finish_reason`` is 'grammar' if the grammar allows no
        token at some point, and 'length' means the output was cut off before it was complete —
        unless ``schema_fit_max_tokens`` is on (OptConfig, off by default): then the output ends
        within max_tokens (and the context's room): a pick changes only when after the model's
        choice the grammar's shortest completion would have more characters than tokens are left
        (``Stats.schema_budget_picks`` counts those picks).
        An invalid grammar or schema raises GrammarError before any token is generated. A session
        has one turn at a time: a generation that begins (here, or at the first token of one made
        earlier) ends the one in progress, which stops with finish_reason 'interrupted'.
        """
        check_max_tokens(max_tokens, self.context.n_ctx)
        settings = sampling_settings(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed,
                                     logit_bias=logit_bias, frequency_penalty=frequency_penalty,
                                     presence_penalty=presence_penalty, repeat_penalty=repeat_penalty,
                                     repeat_last_n=repeat_last_n, n_vocab=self.context.model.n_vocab)
        settings.logprobs = -1 if logprobs is None else check_top(logprobs)
        if self.evicted:  # said now, not at the first token
            raise SessionEvictedError("the session was idle when the KV cache ran out of room and its KV was "
                                      "evicted: open a new session and append its history again")
        if self.closed:
            raise SessionClosedError("the session is closed (or its context is): open a new one")
        stops = stop_list(stop)
        gbnf, schema = output_grammar(grammar, json_schema, strict)
        if grammar_triggers and schema is not None:
            raise InvalidArgumentError("grammar_triggers make a grammar= lazy, not a json_schema (whose check is "
                                       "of the whole output)")
        triggers = trigger_settings(grammar_triggers, gbnf, self.context.model.n_vocab)
        check_grammar_prefill(grammar_prefill, gbnf, triggers)
        self.end_generation_in_progress()
        # parsed now, once: a bad grammar fails before generating
        self._core.set_grammar(gbnf, budget(max_tokens, self._core.room), triggers, grammar_prefill)
        self._core.set_sampling(settings)
        generation = Generation(self, max_tokens, stops, settings, on_finish, gbnf, schema, triggers, grammar_prefill)
        self._configured_for = generation._tag
        return generation

    def generate_text(self, max_tokens: int | None = 256, **kwargs: Any) -> str:
        """Generate and return the text (see generate)."""
        generation = self.generate(max_tokens, **kwargs)
        for _ in generation:
            pass
        return generation.text

    @staticmethod
    def prefetch_steps(sessions: Sequence[Session]) -> None:
        """Computes the next decode step of several generating sessions in shared batches, bit for
        bit what each would compute alone; their generations' next tokens then only sample. A
        session whose next step is something else (a memo draft to check, tokens the grammar
        already decided) is left to it. For servers that advance many generations in turn."""
        _core.prefetch_steps([s._core for s in sessions])

    def logits(self) -> np.ndarray:
        """Logits after the last evaluated token (a copy; empty before the first append)."""
        return self._core.logits()

    # lifecycle

    @property
    def stats(self) -> Stats:
        return self._core.stats()

    @property
    def closed(self) -> bool:
        """Closed, evicted, or its context was closed."""
        return self._core.closed

    @property
    def evicted(self) -> bool:
        """The KV cache needed room while this session was idle, and its KV was dropped."""
        return self._core.evicted

    @property
    def pinned(self) -> bool:
        """While True, the KV cache never evicts this session for room (as during a generation);
        another session that needs room then gets ContextOverflowError instead."""
        return self._core.pinned

    @pinned.setter
    def pinned(self, value: bool) -> None:
        self._core.pinned = bool(value)

    def close(self) -> None:
        """Free the session's KV cells. Using it afterwards raises SessionClosedError."""
        self._core.close()

    def discard(self) -> None:
        """Close the session and drop its KV: nothing of it is saved to disk or kept for other
        sessions to reuse (for a session whose KV is not to be trusted, see invariant_violation)."""
        self._core.discard()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self.n_tokens} tokens"
        return f"<Session {state}>"
