"""Model: a loaded GGUF model, its tokenizer and metadata."""
from __future__ import annotations

import functools
import os
import re
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from . import _core, models
from .errors import InvalidTokenError

_INT32_MAX = 2**31 - 1
# How many texts `Model.has_special_text` remembers its answer for: the messages of several agents'
# conversations, each re-sent every turn (a memo holds its texts: at most this many).
SPECIAL_TEXT_MEMO = 1024


def check_token_ids(tokens: Iterable[Any]) -> list[int]:
    """Token ids as a list of ints; anything else is an InvalidTokenError, not a crash."""
    out = []
    for i, t in enumerate(tokens):
        if isinstance(t, bool) or not hasattr(t, "__index__"):
            raise InvalidTokenError(f"token at index {i} is {t!r}, not an integer token id")
        t = t.__index__()
        if not -_INT32_MAX <= t <= _INT32_MAX:
            raise InvalidTokenError(f"token id {t} at index {i} is outside the vocabulary")
        out.append(t)
    return out


def _unicode_scalars(text: str) -> str:
    """`text` with each lone surrogate (bytes that were not UTF-8, decoded with surrogateescape, or a
    JSON "\\ud800") replaced by U+FFFD, as a UTF-8 decoder with errors="replace" would have."""
    return _LONE_SURROGATE.sub("\ufffd", text)


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


class _ProgressBar:
    """tqdm bar for model loading, shown only on a terminal."""

    def __init__(self, label: str) -> None:
        from tqdm import tqdm

        self._bar = tqdm(total=100, desc=label, unit="%", leave=False, file=sys.stderr)

    def __call__(self, fraction: float) -> bool:
        self._bar.update(round(fraction * 100) - self._bar.n)
        return True

    def close(self) -> None:
        self._bar.close()


class Model:
    """A GGUF model.

    >>> model = Model("gemma3-270m")            # a known name, or a path to a .gguf file
    >>> model = Model("model.delta.gguf")       # a delta file: rebuilt once, then cached
    >>> model.tokenize("Hello")
    [2, 9259]

    ``progress`` shows a loading bar (default: when stderr is a terminal); ``verbose`` prints
    llama.cpp's log.
    """

    def __init__(self, path_or_name: str | os.PathLike[str] = models.DEFAULT_MODEL, *,
                 use_mmap: bool = True, progress: bool | None = None, verbose: bool = False) -> None:
        path = models.resolve(path_or_name)
        _core.set_verbose(bool(verbose))
        if progress is None:
            progress = sys.stderr.isatty()
        path = models.rebuilt_if_delta(path, progress=progress)
        bar = _ProgressBar(f"loading {path.name}") if progress else None
        try:
            self._core = _core.Model(os.fspath(path), use_mmap, bar)
        finally:
            if bar:
                bar.close()
        core = self._core  # (the memo refers to the engine's model, not to self: no cycle)

        @functools.lru_cache(SPECIAL_TEXT_MEMO)
        def has_special_text(text: str) -> bool:
            scalars = _unicode_scalars(text)
            return core.tokenize(scalars, False, True) != core.tokenize(scalars, False, False)

        self._special_text_memo = has_special_text

    @classmethod
    def from_pretrained(cls, repo_id: str, filename: str, *, revision: str | None = None,
                        cache_dir: str | os.PathLike[str] | None = None, local_files_only: bool = False,
                        **kwargs: Any) -> Model:
        """Load a GGUF file from a Hugging Face Hub repository (downloaded once, then cached)."""
        path = models.from_hub(repo_id, filename, revision=revision, cache_dir=cache_dir,
                               local_files_only=local_files_only)
        return cls(path, **kwargs)

    # tokenizer

    def tokenize(self, text: str, *, add_bos: bool = True, special: bool = False) -> list[int]:
        """Token ids of `text`. ``add_bos`` adds the model's BOS token if the model uses one;
        ``special`` parses special-token text such as ``<start_of_turn>``."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, not {type(text).__name__}")
        return self._core.tokenize(_unicode_scalars(text), add_bos, special)

    def detokenize(self, tokens: Sequence[int], *, special: bool = False) -> str:
        """Text of `tokens`; ``special`` renders special tokens as text."""
        return self._core.detokenize(check_token_ids(tokens), not special, special)

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        """The bytes of one token (a token may hold part of a UTF-8 character)."""
        return self._core.token_piece(check_token_ids([token])[0], special)

    def has_special_text(self, text: str) -> bool:
        """Whether `text` tokenizes differently when special-token text is parsed (``special=True``):
        it holds such text, e.g. ``<|im_end|>``. Remembered for the last SPECIAL_TEXT_MEMO texts
        asked about: a chat re-sends its earlier messages every turn, and tokenizing each of them
        twice per turn was most of a long conversation's tokenizing."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, not {type(text).__name__}")
        return self._special_text_memo(text)

    def is_eog(self, token: int) -> bool:
        """Whether `token` ends generation (EOS, end-of-turn...)."""
        return self._core.is_eog(check_token_ids([token])[0])

    # metadata

    @property
    def path(self) -> str:
        return self._core.path

    @property
    def architecture(self) -> str:
        return self._core.meta("general.architecture")

    @property
    def description(self) -> str:
        return self._core.description

    @property
    def chat_template(self) -> str | None:
        """The chat template stored in the GGUF file, or None."""
        return self._core.chat_template or None

    @property
    def metadata(self) -> dict[str, str]:
        return self._core.metadata()

    n_vocab = property(lambda self: self._core.n_vocab, doc="vocabulary size")
    n_ctx_train = property(lambda self: self._core.n_ctx_train, doc="context length the model was trained for")
    n_layer = property(lambda self: self._core.n_layer)
    n_embd = property(lambda self: self._core.n_embd)
    n_head = property(lambda self: self._core.n_head)
    n_head_kv = property(lambda self: self._core.n_head_kv)
    n_swa = property(lambda self: self._core.n_swa, doc="sliding-window size, 0 if none")
    n_params = property(lambda self: self._core.n_params)
    kv_bytes_per_token = property(lambda self: self._core.kv_bytes_per_token, doc="KV cache bytes of one token (F16 K and V, all layers; Context.kv_bytes_per_token: in its kv_type)")
    size_bytes = property(lambda self: self._core.size_bytes)
    bos_token = property(lambda self: self._core.bos)
    eos_token = property(lambda self: self._core.eos)
    add_bos = property(lambda self: self._core.add_bos, doc="whether tokenize() prepends BOS")

    def __repr__(self) -> str:
        return f"Model({self.path!r}, {self.description!r})"
