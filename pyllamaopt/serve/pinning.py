"""A session in use is pinned: its KV is not evicted for another prompt's room meanwhile."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ..session import Session


@contextlib.contextmanager
def pinned(session: Session) -> Iterator[None]:
    """The session's KV is not evicted for room meanwhile (Session.pinned), as it is not idle: a
    prompt that needs the room gets 503 (Overloaded), not this session its 404 or 500."""
    was = session.pinned
    session.pinned = True
    try:
        yield
    finally:
        if not session.closed:
            session.pinned = was
