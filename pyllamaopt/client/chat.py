"""Chat messages as tokens, rendered with a model's own template: a reference helper, opt-in (the
server never applies a template to a session: specification 003 §2.2, §3.4)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..chat import Message
    from ..model import Model


def chat_tokens(tokenizer: Model | str | Any, messages: Sequence[Message], *,
                add_generation_prompt: bool = True) -> list[int]:
    """The token ids of ``messages`` rendered with a chat template. ``tokenizer``: a pyllamaopt Model
    or a model path or name (loaded here, with the compiled engine: its GGUF template and vocabulary,
    as the server's chat routes use them), or any object with a Hugging Face ``apply_chat_template``
    (a transformers tokenizer: no engine needed).

    For a session: render the whole conversation again each turn and ``sync`` to it, or ``append``
    what follows the tokens the session has (check that they are a prefix: some templates render
    earlier turns differently once a later one exists)."""
    if hasattr(tokenizer, "apply_chat_template"):
        return list(tokenizer.apply_chat_template(list(messages), tokenize=True,
                                                  add_generation_prompt=add_generation_prompt))
    from ..chat import ChatTemplate, prompt_tokens
    from ..model import Model

    model = tokenizer if isinstance(tokenizer, Model) else Model(tokenizer)
    template = ChatTemplate.for_model(model)
    text = template.render(messages, add_generation_prompt=add_generation_prompt)
    return prompt_tokens(model, template, messages, text, add_generation_prompt=add_generation_prompt)
