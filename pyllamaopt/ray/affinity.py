"""What the router places a request by: a protocol session's replica (its id names it), or the chain of
a prompt's 64-token block hashes, compared with what each replica reports its block pool holds."""
from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from .. import _core

_SESSIONS = "/v1/sessions/"
# a session id is "<replica>.<token>": secrets.token_urlsafe never writes a dot
_SEPARATOR = "."


def session_id_prefix(replica: str) -> str:
    """What leads every protocol session id a replica issues (ServeSettings.session_id_prefix)."""
    return replica + _SEPARATOR


def session_replica(path: str) -> str | None:
    """The replica a /v1/sessions/{id}... path's id names; "" for an id no replica issued; None for
    another path."""
    if not path.startswith(_SESSIONS):
        return None
    replica, separator, _ = path[len(_SESSIONS):].partition("/")[0].partition(_SEPARATOR)
    return replica if separator else ""


def prompt_chains(tokens: Sequence[int], block_size: int) -> tuple[int, ...]:
    """The chained hashes of the prompt's complete blocks, as the engine's pool names them (the last,
    partial block is never pooled)."""
    return tuple(chain for _, n, _, chain in _core.segment(list(tokens), block_size) if n == block_size)


@dataclass(frozen=True)
class Affinity:
    session_replica: str | None = None  # a protocol session's replica ("" : an id no replica issued)
    new_session: bool = False           # a protocol session to create: it stays where it is made
    chains: tuple[int, ...] = ()        # a prompt's block chain (prompt_chains)
    block_size: int = 0                 # of `chains`: a replica pooling other blocks matches none

    def matched_blocks(self, held: Collection[int]) -> int:
        """How many leading blocks of the prompt `held` has: a chained hash names its whole prefix,
        so the last one held tells."""
        return next((k for k in range(len(self.chains), 0, -1) if self.chains[k - 1] in held), 0)
