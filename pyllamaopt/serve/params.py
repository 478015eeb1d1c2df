"""What a generation is asked: sampling, budget, stop strings and constraints (GenerateParams), and
for a chat reply, how the service parses it as it streams (ReplyFormat)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ReplyFormat:
    """A chat reply, parsed once as it streams (ReplyParser, on the scheduler thread)."""

    generic: bool  # the tool-calling format's JSON (chat_prompt.py), else plain text or native
    call_id_prefix: str  # of the ids given to its calls ("call_", "toolu_")
    native: Any = None  # the model's own format, read by llama.cpp's parser (_core.ChatReplyParser)
    tool_format: str = "none"  # what the answer's pyllamaopt field names: "generic", a native format's name, "none"


@dataclass
class GenerateParams:
    max_tokens: int | None = 256
    temperature: float = 0.0
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    seed: int | None = None
    logit_bias: dict[int, float] = field(default_factory=dict)
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    # the request's stop strings: the engine matches them in the generated text, except in a generic
    # reply, whose parser matches them in the answer's decoded text (in the JSON they would match a
    # call's text, or escapes)
    stop: list[str] = field(default_factory=list)
    grammar: str | None = None
    # make `grammar` lazy (Session.generate's grammar_triggers): a native format's calls, tool_choice "auto"
    grammar_triggers: tuple[tuple[str, str | int], ...] = ()
    # text `grammar` takes first (Session.generate's grammar_prefill): a native format's generation prompt
    grammar_prefill: str = ""
    json_schema: dict[str, Any] | bool | None = None
    # OpenAI's meaning: True, every constraint enforced by the grammar or a 400 naming the keyword;
    # False, what a grammar can enforce is, and the answer says whether the output is valid
    schema_strict: bool = False
    reply: ReplyFormat | None = None  # a chat reply: parsed as it streams (the events carry the parse)
    # each generated token's log-probability and this many alternatives (pyllamaopt.logprobs); None: off
    logprobs: int | None = None

    @property
    def generic_reply(self) -> bool:
        return self.reply is not None and self.reply.generic

    def engine_kwargs(self) -> dict[str, Any]:
        """Session.generate's sampling arguments."""
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k, "min_p": self.min_p,
                "seed": self.seed, "logit_bias": self.logit_bias, "frequency_penalty": self.frequency_penalty,
                "presence_penalty": self.presence_penalty, "repeat_penalty": self.repeat_penalty,
                "repeat_last_n": self.repeat_last_n, "stop": [] if self.generic_reply else self.stop,
                "grammar": self.grammar, "grammar_triggers": self.grammar_triggers,
                "grammar_prefill": self.grammar_prefill, "logprobs": self.logprobs}
