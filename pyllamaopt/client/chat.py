"""Chat messages as tokens, rendered with a model's own template (opt-in: it loads the model here)."""
from __future__ import annotations

from collections.abc import Sequence

from ..chat import ChatTemplate, Message
from ..model import Model


def chat_tokens(model: Model | str, messages: Sequence[Message], *, add_generation_prompt: bool = True) -> list[int]:
    """The tokens the server's chat routes would compute for ``messages``: the model's chat template
    rendered, tokenized with special tokens (the template writes BOS itself). For a session's
    history: render the whole conversation again each turn and ``sync`` (or ``append`` the tokens
    past the previous ones: templates keep earlier turns' text unchanged)."""
    model = model if isinstance(model, Model) else Model(model)
    text = ChatTemplate.for_model(model).render(messages, add_generation_prompt=add_generation_prompt)
    return model.tokenize(text, add_bos=False, special=True)
