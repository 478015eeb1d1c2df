"""Token: one generated token, as the in-process Session and pyllamaopt.client stream it, and
TokenLogprob, what the model's distribution said of a token (pure Python, so that the client needs
no compiled engine)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TokenLogprob:
    """A token's log-probability under the model's raw logits at its position (log-softmax, before
    logit biases, penalties, a grammar and temperature), and the ``top`` most likely tokens there as
    (token id, log-probability) pairs, most likely first."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class Token:
    """One generated token: its id and the text it releases (may be '' while text is held
    back, e.g. an unfinished UTF-8 character or a possible stop string); with
    ``generate(logprobs=k)``, its log-probabilities."""

    id: int
    text: str
    logprob: TokenLogprob | None = None
