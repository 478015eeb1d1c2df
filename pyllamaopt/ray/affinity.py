"""What the router places a request by: a protocol session's replica (its id names it), or the chain of
a prompt's 64-token block hashes, compared with what each replica reports its block pool and its disk
tier hold."""
from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from .. import _core

_SESSIONS = "/v1/sessions/"
# a session id is "<replica>.<token>": secrets.token_urlsafe never writes a dot
_SEPARATOR = "."
# what a prompt block that a replica's disk tier holds (and its pool does not) is worth to the router,
# beside a pooled block's 1 (reused as it is) and a block to compute's 0: restoring reads the block's
# rows, about a tenth of the cost of computing them or less (a cold restore of 2k-16k tokens took 1/8.6
# to 1/160 of their prefill's time, docs/benchmarks.md "Persistent KV cache"). So a replica that
# restores a conversation wins over one that computes it, and loses to one that holds as much in RAM.
DISK_BLOCK_WORTH = 0.9


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
class Reuse:
    """What a replica would reuse of a prompt."""
    pool_blocks: int  # the leading blocks its pool holds
    disk_blocks: int  # the blocks after those that its disk tier holds: restored, not computed

    @property
    def worth(self) -> float:
        """Blocks of computing saved (DISK_BLOCK_WORTH)."""
        return self.pool_blocks + DISK_BLOCK_WORTH * self.disk_blocks


@dataclass(frozen=True)
class Held:
    """What a replica holds as far as the router knows (chained hashes), and its queue."""
    pool: Collection[int]
    disk: Collection[int] = ()
    queue: int | None = None  # requests in flight (None: not known)


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

    def reuse(self, pool: Collection[int], disk: Collection[int]) -> Reuse:
        """What a replica whose pool holds `pool` and disk tier `disk` reuses: a session takes the
        pool's blocks, then restores what an entry holds beyond them (docs/persist-format.md)."""
        in_pool = self.matched_blocks(pool)
        return Reuse(in_pool, max(0, self.matched_blocks(disk) - in_pool))

    def choose(self, replicas: Sequence[Held]) -> tuple[int, Reuse]:
        """The replica (its index) that reuses the most of the prompt, and what it reuses; of equal
        ones (a system prompt every replica holds, a disk tier they share), the shortest queue."""
        reuse = [self.reuse(held.pool, held.disk) for held in replicas]
        best = max(range(len(replicas)), key=lambda i: (reuse[i].worth, -(replicas[i].queue or 0)))
        return best, reuse[best]
