"""The request sessions kept open after their answer, for the next stateless prompt that continues
one (a conversation re-sent with one more turn finds its previous turn, partial last block
included); and the context's sequences, which closing idle ones frees. Scheduler thread only."""
from __future__ import annotations

import os
from collections.abc import Callable

from ..context import Context
from ..errors import ContextOverflowError
from ..session import Session
from .errors import Overloaded

# Request sessions kept open after their answer, for the next request that continues one: one
# per agent of a typical team (with 4, half of 8 agents lost their session every turn and
# resumed from the pool, each computing a chunk more). An idle one is closed first when its
# sequence or its room in the KV cache is needed.
IDLE_REQUEST_SESSIONS = 8


class IdleRequestPool:
    def __init__(self, context: Context) -> None:
        self.context = context
        self._idle: list[Session] = []  # most recently used last

    def take(self, tokens: list[int]) -> tuple[Session, int]:
        """The idle request session sharing the longest prefix with `tokens` (at least a block), else
        a new one (closing idle ones if every sequence is taken); and how many tokens it shares."""
        self._idle = [s for s in self._idle if not s.closed]  # the KV cache may have evicted some for room
        shared = [(len(os.path.commonprefix([s.tokens, tokens])), i) for i, s in enumerate(self._idle)]
        n, i = max(shared, default=(0, -1))
        if n >= self.context.block_size:
            return self._idle.pop(i), n
        if self._idle and self.context.config.diff_reuse_shifted:  # Tier 2: changed near the start
            return self._idle.pop(), shared[-1][0]
        return self.open(self.context.session), 0

    def open(self, new_session: Callable[[], Session]) -> Session:
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

    def keep(self, session: Session) -> None:
        """`session` idle after its answer, for the next request; the least recently used beyond
        IDLE_REQUEST_SESSIONS closes (its blocks stay cached)."""
        if session.closed:
            return
        self._idle.append(session)
        while len(self._idle) > IDLE_REQUEST_SESSIONS:
            self._idle.pop(0).close()

    def close_all(self) -> None:
        for session in self._idle:
            session.close()
        self._idle.clear()
