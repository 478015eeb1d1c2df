"""
pyllamaopt engine (C++). Use the classes of the pyllamaopt package instead.
"""
from __future__ import annotations
import collections.abc
import numpy
import numpy.typing
import typing
__all__: list[str] = ['Context', 'DiffEngine', 'Hasher', 'Model', 'PersistStore', 'Sampling', 'Session', 'Settings', 'Stats', 'Step', 'build_info', 'default_persist_dir', 'features', 'fields', 'hash_block', 'hash_block_pos', 'hash_chain', 'segment', 'set_verbose']
class Settings:
    """
    Effective configuration and the source of each value.
    """
    @staticmethod
    def from_env(env: collections.abc.Mapping[str, str], other_names: collections.abc.Sequence[str] = []) -> Settings:
        """
        Defaults, then every LLAMA_OPT_* variable of `env` (unknown names are errors).
        """
    def __init__(self) -> None:
        """
        Compile-time defaults only.
        """
    def get(self, name: str) -> str:
        """
        The value as text.
        """
    def set(self, name: str, text: str, source: str = 'argument') -> None:
        ...
    def source_of(self, name: str) -> str:
        ...
    def values(self) -> dict:
        """
        Every field's value, typed.
        """
class Stats:
    """
    Counters of the optimization layer and of the engine's work.
    
        stats = session.stats
        stats.tokens_prefilled, stats.forward_passes
        stats.as_dict()
    """
    __hash__: typing.ClassVar[None] = None
    def __add__(self, arg0: Stats) -> Stats:
        ...
    def __eq__(self, arg0: Stats) -> bool:
        ...
    def __init__(self) -> None:
        ...
    def __repr__(self) -> str:
        ...
    def __str__(self) -> str:
        ...
    def __sub__(self, arg0: Stats) -> Stats:
        """
        Counters of an interval: later - earlier.
        """
    def as_dict(self) -> dict:
        """
        Every counter by name.
        """
    def reset(self) -> None:
        """
        Set every counter to zero (of this copy).
        """
    @property
    def act_hits(self) -> int:
        ...
    @property
    def act_lookups(self) -> int:
        ...
    @property
    def attn_blocks_pruned(self) -> int:
        ...
    @property
    def attn_tokens_pruned(self) -> int:
        ...
    @property
    def canon_bytes_saved(self) -> int:
        ...
    @property
    def canon_entries_deduped(self) -> int:
        ...
    @property
    def canon_entries_total(self) -> int:
        ...
    @property
    def dedup_blocks_hit(self) -> int:
        ...
    @property
    def dedup_blocks_total(self) -> int:
        ...
    @property
    def dedup_sequences_evicted(self) -> int:
        ...
    @property
    def dedup_tokens_saved(self) -> int:
        ...
    @property
    def diff_tokens_recomputed(self) -> int:
        ...
    @property
    def diff_tokens_shifted(self) -> int:
        ...
    @property
    def diff_tokens_total(self) -> int:
        ...
    @property
    def diff_tokens_unchanged(self) -> int:
        ...
    @property
    def forward_passes(self) -> int:
        ...
    @property
    def memo_hits(self) -> int:
        ...
    @property
    def memo_lookups(self) -> int:
        ...
    @property
    def memo_tokens_skipped(self) -> int:
        ...
    @property
    def noop_ops_elided(self) -> int:
        ...
    @property
    def persist_errors(self) -> int:
        ...
    @property
    def persist_loads(self) -> int:
        ...
    @property
    def persist_misses(self) -> int:
        ...
    @property
    def persist_misses_corrupt(self) -> int:
        ...
    @property
    def persist_misses_incompatible(self) -> int:
        ...
    @property
    def persist_saves(self) -> int:
        ...
    @property
    def persist_tokens_restored(self) -> int:
        ...
    @property
    def precompute_mask_hits(self) -> int:
        ...
    @property
    def precompute_norm_hits(self) -> int:
        ...
    @property
    def precompute_rope_hits(self) -> int:
        ...
    @property
    def schema_check_us(self) -> int:
        ...
    @property
    def schema_tokens_inferred(self) -> int:
        ...
    @property
    def schema_tokens_skipped(self) -> int:
        ...
    @property
    def schema_tokens_total(self) -> int:
        ...
    @property
    def sessions_evicted(self) -> int:
        ...
    @property
    def tokens_decoded(self) -> int:
        ...
    @property
    def tokens_generated(self) -> int:
        ...
    @property
    def tokens_prefilled(self) -> int:
        ...
class Hasher:
    """
    Incremental FNV-1a: feed tokens, finalize.
    """
    def __init__(self) -> None:
        ...
    def feed(self, tokens: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> None:
        ...
    def finalize(self) -> int:
        ...
    def reset(self) -> None:
        ...
class DiffEngine:
    """
    The structural diff of two token histories.
    
        spans = DiffEngine(block_size=64).compute(prev, curr)
        # [("keep", prev_start, prev_length, curr_start, curr_length), ("insert", ...), ...]
    """
    def __init__(self, block_size: typing.SupportsInt | typing.SupportsIndex = 64, min_unchanged: typing.SupportsInt | typing.SupportsIndex = 1) -> None:
        ...
    def compute(self, prev: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], curr: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> list:
        ...
    @property
    def last_work(self) -> int:
        """
        Tokens compared or hashed by the last compute().
        """
class Model:
    """
    A loaded GGUF model (see pyllamaopt.Model).
    """
    def __init__(self, path: str, use_mmap: bool = True, on_progress: typing.Any = None) -> None:
        ...
    def detokenize(self, tokens: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], remove_special: bool = False, unparse_special: bool = True) -> str:
        ...
    def is_eog(self, token: typing.SupportsInt | typing.SupportsIndex) -> bool:
        ...
    def meta(self, key: str) -> str:
        ...
    def metadata(self) -> dict:
        ...
    def token_piece(self, token: typing.SupportsInt | typing.SupportsIndex, special: bool = True) -> bytes:
        """
        The token's bytes (may be part of a UTF-8 character).
        """
    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        ...
    @property
    def add_bos(self) -> bool:
        ...
    @property
    def bos(self) -> int:
        ...
    @property
    def chat_template(self) -> str:
        ...
    @property
    def description(self) -> str:
        ...
    @property
    def eos(self) -> int:
        ...
    @property
    def kv_bytes_per_token(self) -> int:
        ...
    @property
    def n_ctx_train(self) -> int:
        ...
    @property
    def n_embd(self) -> int:
        ...
    @property
    def n_head(self) -> int:
        ...
    @property
    def n_head_kv(self) -> int:
        ...
    @property
    def n_layer(self) -> int:
        ...
    @property
    def n_params(self) -> int:
        ...
    @property
    def n_swa(self) -> int:
        ...
    @property
    def n_vocab(self) -> int:
        ...
    @property
    def path(self) -> str:
        ...
    @property
    def size_bytes(self) -> int:
        ...
class Context:
    """
    A llama context with sessions (see pyllamaopt.Context).
    """
    def __init__(self, model: Model, settings: Settings, n_ctx: typing.SupportsInt | typing.SupportsIndex, n_batch: typing.SupportsInt | typing.SupportsIndex, n_seq_max: typing.SupportsInt | typing.SupportsIndex, n_threads: typing.SupportsInt | typing.SupportsIndex, n_threads_batch: typing.SupportsInt | typing.SupportsIndex, flash_attn: bool, swa_full: bool, canonical: bool) -> None:
        ...
    def _set_test_hash_mask(self, mask: typing.SupportsInt | typing.SupportsIndex) -> None:
        """
        Test hook: keep only these bits of block hashes, forcing collisions.
        """
    def close(self) -> None:
        ...
    def open_session(self) -> Session:
        ...
    def reset_stats(self) -> None:
        ...
    def stats(self) -> Stats:
        ...
    @property
    def block_size(self) -> int:
        ...
    @property
    def canonical(self) -> bool:
        ...
    @property
    def closed(self) -> bool:
        ...
    @property
    def kv_cells_used(self) -> int:
        ...
    @property
    def min_chunk(self) -> int:
        ...
    @property
    def n_cached(self) -> int:
        ...
    @property
    def n_ctx(self) -> int:
        ...
    @property
    def n_sessions(self) -> int:
        ...
    @property
    def persist(self) -> PersistStore | None:
        ...
    @property
    def settings(self) -> Settings:
        ...
class Sampling:
    """
    How a generation picks tokens (greedy when temperature <= 0).
    """
    def __init__(self) -> None:
        ...
    @property
    def min_p(self) -> float:
        ...
    @min_p.setter
    def min_p(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def seed(self) -> int | None:
        ...
    @seed.setter
    def seed(self, arg1: typing.SupportsInt | typing.SupportsIndex | None) -> None:
        ...
    @property
    def temperature(self) -> float:
        ...
    @temperature.setter
    def temperature(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def top_k(self) -> int:
        ...
    @top_k.setter
    def top_k(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def top_p(self) -> float:
        ...
    @top_p.setter
    def top_p(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
class Step:
    """
    One generated token (token -1: the grammar allows none).
    """
    @property
    def eog(self) -> bool:
        ...
    @property
    def piece(self) -> bytes:
        ...
    @property
    def room(self) -> int:
        ...
    @property
    def token(self) -> int:
        ...
class Session:
    """
    One sequence of a context (see pyllamaopt.Session).
    """
    def append(self, tokens: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> None:
        ...
    def close(self) -> None:
        ...
    def end_turn(self) -> None:
        ...
    def fork(self) -> Session:
        ...
    def logits(self) -> numpy.typing.NDArray[numpy.float32]:
        ...
    def next_token(self) -> int:
        ...
    def save(self) -> int:
        ...
    def set_grammar(self, gbnf: str) -> None:
        ...
    def set_sampling(self, sampling: Sampling) -> None:
        ...
    def stats(self) -> Stats:
        ...
    def step(self) -> Step:
        ...
    def sync(self, tokens: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> None:
        ...
    @property
    def approx_from(self) -> typing.Any:
        ...
    @property
    def closed(self) -> bool:
        ...
    @property
    def evicted(self) -> bool:
        ...
    @property
    def n_canonical(self) -> int:
        ...
    @property
    def n_evaluated(self) -> int:
        ...
    @property
    def room(self) -> int:
        ...
    @property
    def seq(self) -> int:
        ...
    @property
    def tokens(self) -> list[int]:
        ...
class PersistStore:
    def __init__(self, dir: str) -> None:
        ...
    def _fail_after_bytes(self, n: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    def cleanup(self, max_age_s: typing.SupportsInt | typing.SupportsIndex, max_bytes: typing.SupportsInt | typing.SupportsIndex) -> int:
        ...
    def list(self) -> list:
        ...
    def remove(self, path: str) -> bool:
        ...
    def verify(self, path: str) -> str:
        ...
    @property
    def dir(self) -> str:
        ...
def build_info() -> dict:
    """
    What this build is made of: versions, the pinned llama.cpp, CPU features in use.
    """
def default_persist_dir() -> str:
    ...
def features() -> list:
    """
    The optimizations: compiled into this build? implemented in this version?
    """
def fields() -> list:
    """
    The configurable values: name, variable, type, limits, help, compile-time default.
    """
def hash_block(tokens: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> int:
    """
    FNV-1a 64-bit over the tokens as 32-bit little-endian values.
    """
def hash_block_pos(tokens: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], pos_start: typing.SupportsInt | typing.SupportsIndex) -> int:
    """
    Position-dependent block hash.
    """
def hash_chain(parent: typing.SupportsInt | typing.SupportsIndex, tokens: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> int:
    """
    Chained hash: parent's chained hash, then the tokens.
    """
def segment(tokens: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], block_size: typing.SupportsInt | typing.SupportsIndex) -> list:
    """
    Blocks as (start, n_tokens, hash, chain_hash).
    """
def set_verbose(verbose: bool) -> None:
    """
    Print llama.cpp's log to stderr (default: silent; warnings are kept for error messages).
    """
