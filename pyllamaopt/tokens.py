"""Token: one generated token, as the in-process Session and pyllamaopt.client stream it (pure
Python, so that the client needs no compiled engine)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Token:
    """One generated token: its id and the text it releases (may be '' while text is held
    back, e.g. an unfinished UTF-8 character or a possible stop string)."""

    id: int
    text: str
