"""The persistent KV cache on disk (kv-cache-persist): inspect, verify and clean a directory.

Entries are written by sessions of a Context created with ``OptConfig(persist_enabled=True)``
(``session.save()``, and whenever a session or its context closes) and read back when a new
prompt starts with a stored prefix. The file format is in docs/persist-format.md.

    >>> store = PersistStore()                    # LLAMA_OPT_PERSIST_DIR or the default
    >>> for entry in store.entries(): print(entry.n_tokens, entry.size)
    >>> store.clean(max_age=7 * 86400, max_mb=4096)
"""
from __future__ import annotations

import math
import numbers
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from . import _core
from .config import OptConfig
from .errors import InvalidArgumentError, PersistError

__all__ = ["PersistEntry", "PersistStore", "default_persist_dir"]


def default_persist_dir(config: OptConfig | None = None) -> Path:
    """The directory a Context with `config` (default: ``OptConfig()``, so ``LLAMA_OPT_PERSIST_DIR``)
    persists to: its ``persist_dir`` if set, else ``$XDG_CACHE_HOME/pyllamaopt/kv`` (``~/.cache/...``),
    the engine's default."""
    return Path((config or OptConfig()).persist_dir or _core.default_persist_dir())


@dataclass(frozen=True)
class PersistEntry:
    """One stored context, as its header says (``problem`` is set if it is unreadable)."""
    path: Path
    n_tokens: int
    size: int
    mtime: float
    model_hash: int
    problem: str
    # what model, build and KV shape it is for (Context.persist_layout is a context's)
    layout: Mapping[str, object] = field(default_factory=dict, compare=False)
    # an extension's first tokens, whose KV its parent entry holds (its file holds the rest): 0 if none
    base_tokens: int = 0
    # the chained hash of each of its blocks (an extension's parents' blocks too)
    chain: tuple[int, ...] = field(default=(), compare=False)

    @property
    def age(self) -> float:
        """Seconds since it was last written or used."""
        return time.time() - self.mtime

    def unusable_by(self, layout: Mapping[str, object]) -> str:
        """Why a context whose ``persist_layout`` is `layout` never restores this entry: '' if it
        does; "another model" (the model file's content differs), "another KV type (q8_0; this
        context: f16)" (the same model's, stored in other KV cache types: kv_type), "another build"
        (the engine's build, its CPU features or the context's other KV settings differ), or the
        entry's problem."""
        if self.problem:
            return self.problem
        if dict(self.layout) == dict(layout):
            return ""
        if self.layout.get("model_hash") != layout.get("model_hash"):
            return "another model"
        if self.layout.get("kv_type") != layout.get("kv_type"):
            return f"another KV type ({self.layout.get('kv_type')}; this context: {layout.get('kv_type')})"
        return "another build"


_TMP_PREFIX = ".tmp-"   # kv-cache-persist's temporary files
_MEMO = "file-hashes"  # kv-cache-persist's memo of model files' checksums


def _whole_lineages(entries: list[PersistEntry], block_size: int) -> list[PersistEntry]:
    """The entries whose parents (an extension's, its parent's...) are all among `entries`, each
    agreeing with its child: exactly its base blocks, the same chained hashes (a parent is named by
    its last block's)."""
    by_last_block = {e.chain[-1]: e for e in entries if e.chain}
    whole: dict[Path, bool] = {}
    for entry in entries:
        line: list[PersistEntry] = []
        known: bool | None = None
        node: PersistEntry | None = entry
        while node is not None and known is None:
            known = whole.get(node.path)
            if known is None:
                line.append(node)
                base = node.base_tokens // block_size
                if base == 0:
                    known = True
                else:
                    parent = by_last_block.get(node.chain[base - 1])
                    node = parent if parent is not None and parent.chain == node.chain[:base] else None
        for member in line:
            whole[member.path] = bool(known)
    return [e for e in entries if whole[e.path]]


def _unlink(path: Path) -> str:
    """'' once removed (or already gone), else why not, as ' (could not remove: ...)'."""
    try:
        path.unlink(missing_ok=True)
        return ""
    except OSError as exc:
        return f" (could not remove: {exc.strerror or exc})"


def _number(value: object) -> float | None:
    """A real number (numpy's too) as a float, else None (a bool is not a number here)."""
    return None if isinstance(value, bool) or not isinstance(value, numbers.Real) else float(cast(Any, value))


def _positive(value: object) -> bool:
    """A finite number > 0."""
    x = _number(value)
    return x is not None and math.isfinite(x) and x > 0


class PersistStore:
    """A persistent KV cache directory. Reading it never needs the model."""

    def __init__(self, directory: str | os.PathLike[str] | None = None, *,
                 _core_store: _core.PersistStore | None = None) -> None:
        path = os.fspath(directory or default_persist_dir())
        try:
            path.encode()
        except UnicodeEncodeError:
            raise InvalidArgumentError(f"the persist directory {path!r} is not a valid UTF-8 path: use (or link to) "
                                       "a directory whose name is") from None
        self._core = _core_store or _core.PersistStore(path)

    @property
    def directory(self) -> Path:
        return Path(self._core.dir)

    def entries(self) -> list[PersistEntry]:
        return [PersistEntry(Path(e["path"]), e["n_tokens"], e["size"], float(e["mtime"]), e["model_hash"], e["problem"],
                             e["layout"], e["base_tokens"], tuple(e["chain"])) for e in self._core.list()]

    def foreign(self, layout: Mapping[str, object]) -> list[PersistEntry]:
        """The sound entries a context whose ``persist_layout`` is `layout` never restores: another
        model's, KV type's or build's (a restart on another model, KV type or version finds them,
        and misses)."""
        return [e for e in self.entries() if not e.problem and e.unusable_by(layout)]

    def restorable_chains(self, layout: Mapping[str, object]) -> set[int]:
        """The chained hash of every block a context whose ``persist_layout`` is `layout` restores from
        here (a block names its whole prefix): its sound entries' blocks, an extension's only while its
        parents are all there (the store restores nothing of an orphan)."""
        usable = [e for e in self.entries() if not e.unusable_by(layout)]
        return {chain for e in _whole_lineages(usable, cast(int, layout["block_size"])) for chain in e.chain}

    def refusal(self) -> str:
        """Why a Context with persistence would refuse this directory (another user's, writable by
        group or others, not a directory), with what to do; '' if it would use it or it does not
        exist yet (it is then created 0700). A 0755 directory of ours is tightened to 0700, as such
        a context does. docs/persist-format.md: permissions and threat model."""
        if not os.path.lexists(self.directory):
            return ""
        return self._core.check_dir()

    @property
    def size(self) -> int:
        """Bytes used by the entries."""
        return sum(e.size for e in self.entries())

    def leftovers(self) -> list[tuple[Path, int]]:
        """Files of saves that were interrupted (a killed process), with their sizes: a save removes
        those older than an hour, ``clean`` too, ``clear`` all of them."""
        try:
            with os.scandir(self.directory) as names:
                return [(Path(e.path), e.stat(follow_symlinks=False).st_size) for e in names
                        if e.name.startswith(_TMP_PREFIX) and e.is_file(follow_symlinks=False)]
        except OSError:
            return []

    def verify(self, *, remove: bool = False) -> dict[Path, str]:
        """Reads every entry and checks every checksum: ``{path: problem}`` for the bad ones,
        which are removed with ``remove=True`` (a removal that fails adds why to the problem).
        (Loading checks the blocks it reads anyway.)"""
        problems = {}
        for entry in self.entries():
            problem = entry.problem or self._core.verify(str(entry.path))
            if problem:
                problems[entry.path] = problem + (_unlink(entry.path) if remove else "")
        return problems

    def clean(self, *, max_age: float | None = None, max_mb: float | None = None) -> int:
        """Removes unreadable entries, entries unused for ``max_age`` seconds, then the least
        recently used ones until at most ``max_mb`` MiB remain, and leftovers of interrupted
        saves. Returns the number of files removed."""
        if max_age is not None and not _positive(max_age):
            raise InvalidArgumentError(f"max_age={max_age!r}: give a positive number of seconds, "
                                       "or None to keep entries of any age")
        if max_mb is not None and not (_positive(max_mb) or _number(max_mb) == 0):
            raise InvalidArgumentError(f"max_mb={max_mb!r}: give a size in MiB >= 0 (0 removes every entry), "
                                       "or None for no size limit")
        # whole seconds up (0.5 s is not "no limit"), bytes within what the engine's integers hold
        age = 0 if max_age is None else min(math.ceil(max_age), 2**63 - 1)
        max_bytes = 0 if max_mb is None else max(1, min(int(max_mb * 2**20), 2**64 - 1))
        return self._core.cleanup(age, max_bytes)

    def clear(self) -> int:
        """Removes every entry, every leftover of an interrupted save, and the memo of model files'
        checksums (which the engine trusts: a directory others could write may hold planted lines).
        Returns the number of files removed; raises PersistError naming those it could not remove."""
        paths = [e.path for e in self.entries() if e.problem != "not a regular file"]  # a directory named so: not ours
        paths += [p for p, _ in self.leftovers()]
        memo = self.directory / _MEMO
        if memo.is_file() and not memo.is_symlink():
            paths.append(memo)
        return self._remove(paths)

    def remove_foreign(self, layout: Mapping[str, object]) -> int:
        """Removes the entries a context whose ``persist_layout`` is `layout` never restores
        (``foreign``: another model's, KV type's or build's). Returns how many; raises PersistError
        naming those it could not remove."""
        return self._remove([e.path for e in self.foreign(layout)])

    def _remove(self, paths: list[Path]) -> int:
        failed = {p: why for p in paths if (why := _unlink(p))}
        if failed:
            raise PersistError(f"could not remove {len(failed)} of {len(paths)} files in {self.directory}: " +
                               "; ".join(f"{p.name}{why}" for p, why in failed.items()))
        return len(paths)

    def __repr__(self) -> str:
        return f"PersistStore({str(self.directory)!r})"
