"""Log-probabilities (docs/serve.md, "Log-probabilities"): what the engine's logits say of tokens,
for ``Session.generate(logprobs=k)`` and ``Session.score`` (a prompt's own, as OpenAI's ``echo``
gives them). The values are computed by the engine (cpp/session/logprobs): the log-softmax of the
model's raw logits, summed in one fixed order, so the same logits always give the same bits."""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from . import _core
from .errors import InvalidArgumentError
from .model import check_token_ids
from .tokens import TokenLogprob

if TYPE_CHECKING:
    from .session import Session

TOP_LOGPROBS_MAX = 20  # as the engine's LLAMA_OPT_TOP_LOGPROBS_MAX (OpenAI's limit for chat)


def check_top(value: object, name: str = "logprobs") -> int:
    """`value` as a count of alternatives per token; InvalidArgumentError naming `name` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= TOP_LOGPROBS_MAX:
        raise InvalidArgumentError(f"{name} must be an integer between 0 and {TOP_LOGPROBS_MAX} (the alternatives "
                                   f"reported per token), got {value!r}")
    return value


def from_core(value: _core.TokenLogprob) -> TokenLogprob:
    return TokenLogprob(value.token, value.logprob, tuple(value.top))


def score_prompt(session: Session, tokens: Sequence[int], top: int) -> list[TokenLogprob | None]:
    """Session.score: the history set to `tokens`, all computed afresh; each token's log-probability
    given those before it (None for the first, which nothing predicts)."""
    top = check_top(top, "top_logprobs")
    ids = check_token_ids(tokens)
    if not ids:
        raise InvalidArgumentError("score needs at least one token")
    session.end_generation_in_progress()
    rows = session._core.score(ids, top)
    return [None, *map(from_core, rows)]
