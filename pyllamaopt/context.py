"""Context: one llama.cpp context whose unified KV cache is shared by many sessions."""
from __future__ import annotations

import math
import os
import warnings
from typing import Any

from . import _core
from .config import OptConfig, switches_without_effect
from .errors import InvalidArgumentError
from .model import Model
from .persist import PersistStore
from .session import Session
from .stats import Stats


def _check_int(name: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidArgumentError(f"{name} must be an integer between {low} and {high}, got {value!r}")
    return value


class Context:
    """A llama context with sessions.

    >>> ctx = Context(model, n_ctx=8192)
    >>> session = ctx.session()

    n_ctx       KV cells shared by all sessions of the context
    n_batch     tokens per forward pass when prefilling
    n_seq_max   sessions open at once
    n_threads   compute threads; None or 0: all hardware threads (the default)
    flash_attn  flash attention on/off; fixed per context, since numerics depend on it
    swa_full    keep all tokens of sliding-window layers (needed to reuse long prefixes)
    config      OptConfig (default: defaults + LLAMA_OPT_* environment)
    schedule    "canonical" (default): KV computed on the canonical block schedule, which makes
                reuse bitwise exact (docs/exactness.md); "llama": llama.cpp's own schedule and
                cell placement, with every reuse optimization off
    profile     a diagnostic, off by default: "time" times every node of ggml's graph (each
                computed alone), "facts" examines every node's output (duplicate, zero,
                identity, one-hot rows); read with op_profile(). benchmarks/profile_ops.py
    """

    def __init__(self, model: Model | str | os.PathLike[str], *, n_ctx: int = 4096, n_batch: int = 512,
                 n_seq_max: int = 8, n_threads: int | None = None, n_threads_batch: int | None = None,
                 flash_attn: bool = True, swa_full: bool = True, config: OptConfig | None = None,
                 schedule: str = "canonical", profile: str | None = None) -> None:
        if schedule not in ("canonical", "llama"):
            raise InvalidArgumentError(f"schedule must be 'canonical' or 'llama', got {schedule!r}")
        if profile not in (None, "time", "facts"):
            raise InvalidArgumentError(f"profile must be None, 'time' or 'facts', got {profile!r}")
        self.model = model if isinstance(model, Model) else Model(model)
        if config is not None and not isinstance(config, OptConfig):
            raise InvalidArgumentError(f"config must be an OptConfig (OptConfig(**options) for a dict), "
                                       f"not {type(config).__name__}")
        self.config = config if config is not None else OptConfig()
        for feature in switches_without_effect(self.config):
            warnings.warn(f"{feature.enabled_field}=1 {feature.no_effect}", stacklevel=2)
        self._core = _core.Context(
            self.model._core, self.config._core,
            _check_int("n_ctx", n_ctx, 16, 2**24),
            _check_int("n_batch", n_batch, 1, 2**16),
            _check_int("n_seq_max", n_seq_max, 1, 255),
            _check_int("n_threads", n_threads or 0, 0, 1024),
            _check_int("n_threads_batch", n_threads_batch or 0, 0, 1024),
            bool(flash_attn), bool(swa_full), schedule == "canonical", profile or "none")

    def session(self) -> Session:
        """Open a new, empty session (one sequence of this context)."""
        return Session(self, self._core.open_session())

    @property
    def n_ctx(self) -> int:
        return self._core.n_ctx

    @property
    def n_sessions(self) -> int:
        """Sessions currently open."""
        return self._core.n_sessions

    @property
    def n_cached(self) -> int:
        """Closed sessions whose KV blocks are kept for reuse (dropped first when room is needed)."""
        return self._core.n_cached

    @property
    def block_size(self) -> int:
        return self._core.block_size

    @property
    def schedule(self) -> str:
        return "canonical" if self._core.canonical else "llama"

    @property
    def kv_type(self) -> str:
        """How the KV cache stores K and V: "f16", "q8_0" or "q4_0" when they share a type (OptConfig's
        kv_type), "K/V" when kv_type_k / kv_type_v made them differ ("q8_0/q4_0", as llama-server's
        --cache-type-k q8_0 --cache-type-v q4_0)."""
        return self._core.kv_type

    @property
    def kv_type_k(self) -> str:
        """K's type ("f16", "q8_0" or "q4_0")."""
        return self._core.kv_type_k

    @property
    def kv_type_v(self) -> str:
        """V's type ("f16", "q8_0" or "q4_0")."""
        return self._core.kv_type_v

    @property
    def kv_bytes_per_token(self) -> int:
        """KV cache bytes of one token in this context (K and V of all layers, each in its type)."""
        return self._core.kv_bytes_per_token

    @property
    def kv_cells_used(self) -> int:
        """KV cells in use; a cell shared by several sessions counts once."""
        return self._core.kv_cells_used

    @property
    def pool_blocks(self) -> int:
        """Blocks in the dedup pool, the index of reusable KV (0 without dedup)."""
        return self._core.pool_blocks

    @property
    def pool_chains(self) -> list[int]:
        """The chained hash (``segment(tokens, block_size)``'s) of every block in the dedup pool: the
        prefixes whose KV this context holds now (what a router sends a prompt's next turn after)."""
        return self._core.pool_chains

    @property
    def stats(self) -> Stats:
        """Counters summed over every session of this context."""
        return self._core.stats()

    def reset_stats(self) -> None:
        self._core.reset_stats()

    def op_profile(self) -> list[dict[str, Any]]:
        """The operation profile of a context made with ``profile``: one dict per group of graph
        nodes (operation, node name without its layer, weight), with calls, output elements,
        nanoseconds ("time") or row facts ("facts"); empty without a profile."""
        return list(self._core.op_profile())

    def reset_op_profile(self) -> None:
        self._core.reset_op_profile()

    def row_kernels(self) -> list[dict[str, Any]]:
        """What ``row_kernels=2`` (the default) measured for small batches' matrix products: per weight
        type and row count, the path the next decode takes (``multi``: the multi-row kernels, else row
        by row; the same bits) and each path's nanoseconds per weight element and samples."""
        return list(self._core.row_kernels())

    @property
    def closed(self) -> bool:
        return self._core.closed

    @property
    def persist(self) -> PersistStore | None:
        """The persistent KV cache directory of this context (``persist_enabled``), else None."""
        store = self._core.persist
        return None if store is None else PersistStore(_core_store=store)

    @property
    def persist_layout(self) -> dict[str, object] | None:
        """What model, build and KV shape the disk tier entries of this context are for (None
        without persistence): it restores only entries whose ``PersistEntry.layout`` equals it."""
        layout = self._core.persist_layout
        return None if layout is None else dict(layout)

    @property
    def persist_chains(self) -> set[int]:
        """The chained hash of every block this context restores from its disk tier (its entries for
        this model and build: ``PersistStore.restorable_chains``); empty without persistence. Reads
        the entries' headers, not their rows."""
        store, layout = self.persist, self.persist_layout
        return set() if store is None or layout is None else store.restorable_chains(layout)

    def flush_persist(self, timeout: float | None = None) -> bool:
        """Wait until the KV queued for the persistent cache's background writer is on disk
        (``persist_write_behind``, on by default with ``persist_enabled``): each prompt's new
        blocks are queued as soon as they are computed and written in the background. Returns
        False if some were still queued after ``timeout`` seconds (None: no limit); True at once
        without write-behind. Closing the context flushes too (up to a minute)::

            session.append(prompt)
            ctx.flush_persist()   # another process now restores the prompt's KV
        """
        return self._core.flush_persist(math.inf if timeout is None else timeout)

    def close(self) -> None:
        """Free the context's memory; its sessions become closed (their KV saved, or written
        behind and flushed, with persistence on)."""
        self._core.close()

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Context n_ctx={self.n_ctx} sessions={self.n_sessions} model={self.model.description!r}>"
