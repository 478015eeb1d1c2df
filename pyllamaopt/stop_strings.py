"""Stop strings in text that arrives piece by piece: where one ends it, and how much of its end to
hold back because it may still become one (Session.generate, and the server's tool-call replies,
whose stop strings apply to the answer's decoded text)."""
from __future__ import annotations

from collections.abc import Sequence

from .errors import InvalidArgumentError


def stop_list(stop: str | Sequence[str] | None) -> list[str]:
    """`stop` as a list; InvalidArgumentError unless each is a non-empty string."""
    stops = [] if stop is None else [stop] if isinstance(stop, str) else list(stop)
    if any(not isinstance(s, str) or not s for s in stops):
        raise InvalidArgumentError("stop must be a non-empty string or a list of them")
    return stops


def find_stop(text: str, stop: Sequence[str], released: int) -> tuple[int, str] | None:
    """Where the earliest stop string starts, and which it is, searching only where a new one can be."""
    hits = [(i, s) for s in stop if (i := text.find(s, max(0, released - len(s) + 1))) >= 0]
    return min(hits) if hits else None


def held_back(text: str, stop: Sequence[str]) -> int:
    """Length of the longest end of `text` that could still grow into a stop string."""
    return max((n for s in stop for n in range(len(s) - 1, 0, -1) if text.endswith(s[:n])), default=0)
