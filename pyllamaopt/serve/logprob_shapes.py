"""OpenAI's shapes of log-probabilities (docs/serve.md, "Log-probabilities"): a chat completion's
``logprobs.content`` entries, and a completion's ``logprobs`` lists with their text offsets."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..tokens import TokenLogprob

TokenBytes = Callable[[int], bytes]  # a token's bytes (Model.token_bytes)


def _text(raw: bytes) -> str:
    """A token's text; the bytes of a character cut between tokens read as U+FFFD (as vLLM's)."""
    return raw.decode("utf-8", errors="replace")


def chat_content(logprobs: Sequence[TokenLogprob], token_bytes: TokenBytes) -> list[dict[str, Any]]:
    """``choices[].logprobs.content``: per token, its text, log-probability and bytes, and the most
    likely tokens at its position in the same form."""
    def entry(token: int, logprob: float) -> dict[str, Any]:
        raw = token_bytes(token)
        return {"token": _text(raw), "logprob": logprob, "bytes": list(raw)}

    return [{**entry(lp.token, lp.logprob), "top_logprobs": [entry(t, v) for t, v in lp.top]} for lp in logprobs]


class CompletionLogprobs:
    """A completion's ``logprobs`` (``tokens``, ``token_logprobs``, ``top_logprobs``,
    ``text_offset``), built in the order the tokens come; the offsets count the characters of the
    tokens before, from the start of the choice's text (the prompt's first token, with echo)."""

    def __init__(self, token_bytes: TokenBytes) -> None:
        self._token_bytes = token_bytes
        self._offset = 0

    def lists(self, tokens: Sequence[int], logprobs: Sequence[TokenLogprob | None]) -> dict[str, Any]:
        """The lists of `tokens`, each with its log-probabilities (None: the prompt's first token,
        which nothing predicts: null, as OpenAI's). ``top_logprobs`` maps the text of the most likely
        tokens and of the chosen one to their log-probabilities."""
        out: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for token, lp in zip(tokens, logprobs, strict=True):
            text = _text(self._token_bytes(token))
            out["tokens"].append(text)
            out["text_offset"].append(self._offset)
            self._offset += len(text)
            if lp is None:
                out["token_logprobs"].append(None)
                out["top_logprobs"].append(None)
                continue
            out["token_logprobs"].append(lp.logprob)
            top = {_text(self._token_bytes(t)): v for t, v in lp.top}
            top.setdefault(text, lp.logprob)
            out["top_logprobs"].append(top)
        return out
