"""The session protocol's sessions (specification 003 §2.2): server-issued ids, one operation at a
time per session, idle sessions closed after a TTL or, at --max-sessions, the least recently used
first; "not found" afterwards, never a silent reset. Touched on the scheduler thread only."""
from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..session import Session
from ..stats import Stats
from .errors import Busy, NotFound, SessionsFull
from .metrics import Metrics


@dataclass
class ProtocolSession:
    session: Session
    last_used: float = field(default_factory=time.monotonic)
    busy: str | None = None  # "generating" or "prefilling": one operation at a time
    # the session's counters when its next generation's prompt began: at its creation (or fork), then
    # at the end of each generation; that generation's usage counts the prompt's work since
    prompt_from: Stats = field(init=False)

    def __post_init__(self) -> None:
        self.prompt_from = self.session.stats


class SessionRegistry:
    """The open protocol sessions by id; `changed` runs after each change (the service's gauges)."""

    def __init__(self, metrics: Metrics, *, max_sessions: int, session_ttl: float,
                 changed: Callable[[], None], id_prefix: str = "") -> None:
        self.metrics = metrics
        self.id_prefix = id_prefix  # leads every id issued (a Ray replica's: its router sends the id back to it)
        self.max_sessions = max_sessions
        self.session_ttl = session_ttl
        self._changed = changed
        self._entries: dict[str, ProtocolSession] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __getitem__(self, session_id: str) -> ProtocolSession:
        return self._entries[session_id]

    def add(self, session: Session, busy: str | None = None) -> tuple[str, ProtocolSession]:
        """Registers `session` under a new id (counted as created once `created` says so)."""
        session_id = self.id_prefix + secrets.token_urlsafe(18)
        entry = self._entries[session_id] = ProtocolSession(session, busy=busy)
        return session_id, entry

    def created(self) -> None:
        self.metrics.session_total.labels(outcome="created").inc()
        self._changed()

    def forget(self, session_id: str) -> None:
        """Unregisters a session whose creation failed (not counted: it never was)."""
        del self._entries[session_id]

    def get(self, session_id: str, idle: bool = False) -> ProtocolSession:
        """The session's entry, touched now; NotFound if it is gone, Busy if `idle` and it is not."""
        entry = self._entries.get(session_id)
        if entry is not None and entry.session.closed:  # evicted by the KV cache for room
            self.drop(session_id, entry, outcome="evicted", evicted_reason="kv_full")
            entry = None
        if entry is None:
            # ids live in this process: after a restart every one is unknown (their KV, saved to the
            # disk tier, comes back for a new session with the same tokens)
            raise NotFound(f"session {session_id!r} does not exist: it was never created, or it was closed, "
                           "expired or evicted, or the server restarted since; create a new one and send its tokens "
                           "again (with the disk tier on, LLAMA_OPT_PERSIST_ENABLED=1, their KV is restored from disk "
                           "rather than computed)")
        if idle and entry.busy:
            raise Busy(f"session {session_id!r} is {entry.busy}; wait until that ends")
        entry.last_used = time.monotonic()
        return entry

    def id_of(self, entry: ProtocolSession) -> str | None:
        return next((sid for sid, e in self._entries.items() if e is entry), None)

    def drop(self, session_id: str, entry: ProtocolSession, *, outcome: str,
             evicted_reason: str | None = None) -> None:
        del self._entries[session_id]
        entry.session.close()
        self.metrics.session_total.labels(outcome=outcome).inc()
        if evicted_reason:
            self.metrics.session_evicted_total.labels(reason=evicted_reason).inc()
        self._changed()

    def make_room(self, keep: str | None = None) -> None:
        """At max_sessions, closes the least recently used idle session."""
        if len(self._entries) < self.max_sessions:
            return
        idle = [(e.last_used, sid) for sid, e in self._entries.items() if not e.busy and sid != keep]
        if not idle:
            raise SessionsFull(f"all {self.max_sessions} sessions are busy; retry later or start the server "
                               "with a larger --max-sessions")
        _, sid = min(idle)
        self.drop(sid, self._entries[sid], outcome="evicted", evicted_reason="lru")

    def expire_idle(self) -> int:
        """Closes sessions idle for longer than the TTL; returns how many."""
        now = time.monotonic()
        old = [(sid, e) for sid, e in self._entries.items() if not e.busy and now - e.last_used > self.session_ttl]
        for sid, e in old:
            self.drop(sid, e, outcome="expired", evicted_reason="ttl")
        return len(old)

    def close_all(self) -> int:
        """Closes every session (with persistence on they are saved); returns how many there were."""
        open_sessions = list(self._entries.items())
        for sid, e in open_sessions:
            self.drop(sid, e, outcome="closed")
        return len(open_sessions)

    @staticmethod
    def info(session_id: str, entry: ProtocolSession, kv_bytes_per_token: int) -> dict[str, Any]:
        s = entry.session
        return {"session_id": session_id, "n_tokens": s.n_tokens, "tokens": s.tokens,
                "kv_bytes": s.n_tokens * kv_bytes_per_token, "approx_from": s.approx_from,
                "generating": entry.busy == "generating", "busy": entry.busy, "stats": s.stats.as_dict()}
