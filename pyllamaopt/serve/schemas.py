"""Request bodies, one pydantic model per route body (validation and OpenAPI for free).

One policy for every route (docs/serve.md, "Request fields"): a request's fields are honoured, or
refused with a 400 naming them; a field this server does not know is refused too (it could change
the answer: a llama-server sampler, a typo of one we take), except the few that cannot change an
answer (``user``, ``metadata``, ...), which are accepted and ignored. Inside messages and tools,
keys we do not use are ignored: clients send back the assistant messages they received (with
``refusal``, ``annotations``, ...). A field of the wrong type is a 400 naming it.
"""
from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..logprobs import TOP_LOGPROBS_MAX
from .choices import MAX_CHOICES
from .errors import BadRequest
from .params import GenerateParams


class _Body(BaseModel):
    """A part of a request (a message, a tool): keys we do not use are ignored."""

    model_config = ConfigDict(extra="allow")


class _Request(BaseModel):
    """A request body: a field not declared is refused (a 400 naming it)."""

    model_config = ConfigDict(extra="forbid")


class _Untracked(_Request):
    """Fields that change nothing in an answer, accepted and ignored (OpenAI's and Anthropic's
    both): tags, and the capacity tier."""

    metadata: dict[str, Any] | None = None
    service_tier: str | None = None


class _Choices(_Request):
    """OpenAI's n: that many choices of one prompt (choices.py: the prompt computed once, choice i
    sampled with seed + i)."""

    n: int = Field(1, ge=1, le=MAX_CHOICES, description=f"choices of the prompt, 1..{MAX_CHOICES}")


class _OpenAIUntracked(_Untracked):
    """OpenAI's others: who asked, whether OpenAI keeps the completion, its prompt cache's routing
    and lifetime (this server's cache is content-addressed and automatic), a predicted output
    (which OpenAI uses for speed only)."""

    user: str | None = None
    safety_identifier: str | None = None
    store: bool | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    prediction: dict[str, Any] | None = None


class Sampling(_Request):
    temperature: float | None = Field(None, ge=0, description="default 0: greedy (reproducible answers)")
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0, le=1)
    seed: int | None = Field(None, ge=0, lt=2**32 - 1)
    stop: str | list[str] | None = None
    logit_bias: dict[str, float] | None = Field(
        None, description="token id (as a string, /v1/tokenize gives them) -> bias in [-100, 100], added to its logit")
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    repeat_penalty: float | None = Field(None, gt=0, description="llama.cpp's (1: off)")
    repeat_last_n: int | None = Field(None, ge=0, lt=2**31, description="the tokens the penalties look back over (default 64)")
    grammar: str | None = Field(None, description="GBNF with a root rule (not with response_format or tools)")

    @field_validator("logit_bias")
    @classmethod
    def _token_ids(cls, bias: dict[str, float] | None) -> dict[str, float] | None:
        for key, value in (bias or {}).items():
            if not key.isdecimal():
                raise ValueError(f"the key {key!r} is not a token id: logit_bias maps token ids, as strings, to biases "
                                 "(POST /v1/tokenize gives a text's ids)")
            if not -100 <= value <= 100:
                raise ValueError(f"the bias of token {key} is {value}: biases are in [-100, 100]")
        return bias

    def params(self, max_tokens: int | None, n_ctx: int, response_format: dict[str, Any] | None = None) -> GenerateParams:
        """The generation these fields ask for. A max_tokens beyond the context is clamped to it
        (OpenAI clients send large values): the answer then ends with finish reason 'length'. A
        logit_bias token outside the vocabulary is refused by the engine (a 400 naming it)."""
        p = GenerateParams(max_tokens=None if max_tokens is None else min(max_tokens, n_ctx))
        for name in ("temperature", "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty",
                     "repeat_penalty", "repeat_last_n"):
            if getattr(self, name) is not None:
                setattr(p, name, getattr(self, name))
        p.logit_bias = {int(token): bias for token, bias in (self.logit_bias or {}).items()}
        p.seed = self.seed
        p.stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        p.json_schema, p.schema_strict = _json_schema(response_format)
        if self.grammar is not None and p.json_schema is not None:
            raise BadRequest("give grammar or response_format, not both")
        p.grammar = self.grammar
        return p


class FunctionCall(_Body):
    name: str
    arguments: str | dict[str, Any] = Field(description="JSON text of an object (a dict is taken too)")


class ToolCallBody(_Body):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Body):
    role: str
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[ToolCallBody] | None = None  # assistant
    reasoning_content: str | None = None           # assistant: its reasoning, as llama-server and vLLM return it
    tool_call_id: str | None = None               # tool


class FunctionDefinition(_Body):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None  # JSON Schema of the arguments; none: no arguments


class ChatTool(_Body):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class FunctionName(_Body):
    name: str


class NamedToolChoice(_Body):
    type: Literal["function"] = "function"
    function: FunctionName


class StreamOptions(_Body):
    include_usage: bool = False


class ChatLogprobs(_Request):
    """OpenAI's chat log-probabilities: each generated token's under the model's raw logits, with
    the ``top_logprobs`` most likely tokens at its position (docs/serve.md, "Log-probabilities")."""

    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=TOP_LOGPROBS_MAX)

    def alternatives(self) -> int | None:
        """The alternatives per token asked for (GenerateParams.logprobs); None: no log-probabilities."""
        if not self.logprobs:
            if self.top_logprobs:  # (0 asks for nothing: some clients send it by default)
                raise BadRequest("top_logprobs needs logprobs: true (log-probabilities are off without it)")
            return None
        return self.top_logprobs or 0


class _TemplateArguments(_Request):
    """llama-server's chat_template_kwargs, on both chat routes."""

    chat_template_kwargs: dict[str, Any] | None = Field(
        None, description="llama-server's: the chat template's own arguments (enable_thinking, ...)")


class ChatCompletionRequest(Sampling, _Choices, ChatLogprobs, _OpenAIUntracked, _TemplateArguments):
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=0)
    max_completion_tokens: int | None = Field(None, ge=0)
    stream: bool = False
    stream_options: StreamOptions | None = None
    response_format: dict[str, Any] | None = None
    tools: list[ChatTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    modalities: list[Literal["text"]] | None = None  # text is what this server answers


class CompletionRequest(Sampling, _Choices, _OpenAIUntracked):
    model: str | None = None
    # a text or token ids, or OpenAI's batch form holding one of them (lm-eval sends [[ids]]); a batch
    # of several prompts is refused
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(16, ge=0)
    best_of: Literal[1] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    # the prompt before the completion, in the text and (with logprobs) the log-probabilities: the
    # prompt's own computation, every position computed afresh (docs/exactness.md, "Echo")
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=TOP_LOGPROBS_MAX, description="alternatives per token (and the chosen one's)")

    def one_prompt(self) -> str | list[int]:
        """The prompt, out of a batch of one."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return prompt
        first = prompt[0] if prompt else None
        if isinstance(first, (str, list)):
            if len(prompt) != 1:
                raise BadRequest(f"prompt: a batch of {len(prompt)} prompts is not served: send one prompt per request")
            return first
        return cast(list[int], prompt)

    def generate_params(self, n_ctx: int) -> GenerateParams:
        if self.logprobs is not None and self.max_tokens == 0 and not self.echo:
            raise BadRequest("logprobs with max_tokens=0 and no echo: no token would have log-probabilities; set "
                             "echo=true for the prompt's (lm-eval's loglikelihood request), or max_tokens >= 1")
        return replace(self.params(self.max_tokens, n_ctx), logprobs=self.logprobs)


class AnthropicMessage(_Body):
    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]


class AnthropicTool(_Body):
    type: str | None = None  # "custom" or absent; Anthropic's server tools are not served
    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: dict[str, Any] | None = None


class AnthropicToolChoice(_Body):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


_THINKING_SHAPES = ('send thinking as {"type": "enabled", "budget_tokens": N} (N a positive integer) or '
                    '{"type": "disabled"}')


class CountTokensRequest(_Untracked, _TemplateArguments):
    """Anthropic's prompt: what /v1/messages/count_tokens counts, and /v1/messages answers."""

    model: str | None = None
    # accepted and ignored, as they change nothing in an answer: for whom, where it runs, a cache
    # breakpoint (this server's cache is automatic)
    user_profile_id: str | None = None
    workspace_id: str | None = None
    inference_geo: str | None = None
    cache_control: dict[str, Any] | None = None
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: AnthropicToolChoice | None = None
    # the template's enable_thinking (template_kwargs); budget_tokens is checked, not enforced (docs/serve.md)
    thinking: dict[str, Any] | None = Field(None, description=_THINKING_SHAPES.removeprefix("send thinking as "))

    @field_validator("thinking", mode="before")
    @classmethod
    def _thinking_shape(cls, thinking: Any) -> Any:
        if thinking is None:
            return None
        if not isinstance(thinking, dict):
            raise ValueError(f"{thinking!r} is not an object: {_THINKING_SHAPES}")
        kind, budget = thinking.get("type"), thinking.get("budget_tokens")
        if kind not in ("enabled", "disabled"):
            raise ValueError(f"type {kind!r} is not taken: {_THINKING_SHAPES}")
        if kind == "enabled" and (type(budget) is not int or budget < 1):
            raise ValueError(f"budget_tokens {budget!r} is not a positive integer: {_THINKING_SHAPES}")
        others = sorted(set(thinking) - ({"type", "budget_tokens"} if kind == "enabled" else {"type"}))
        if others:
            raise ValueError(f"{', '.join(others)} not taken: {_THINKING_SHAPES}")
        return thinking

    def template_kwargs(self) -> dict[str, Any] | None:
        """chat_template_kwargs, with thinking as the template's enable_thinking (enabled: true,
        disabled: false); both given, they must agree."""
        if self.thinking is None:
            return self.chat_template_kwargs
        enable = self.thinking["type"] == "enabled"
        kwargs = dict(self.chat_template_kwargs or {})
        if kwargs.get("enable_thinking", enable) != enable:
            raise BadRequest(f"thinking.type {self.thinking['type']!r} and chat_template_kwargs.enable_thinking "
                             f"{json.dumps(kwargs['enable_thinking'])} disagree: send one of them (or the same choice)")
        return {**kwargs, "enable_thinking": enable}


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=0)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    stop_sequences: list[str] | None = None
    stream: bool = False

    def params(self, n_ctx: int) -> GenerateParams:
        return Sampling.model_validate({"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
                                        "stop": self.stop_sequences}).params(self.max_tokens, n_ctx)


class Tokens(_Request):
    tokens: list[int] = Field(default_factory=list)


class TokenizeRequest(_Request):
    text: str
    add_bos: bool = False   # the model's BOS token first, if the model uses one
    special: bool = False   # special-token text such as "<start_of_turn>" parsed as those tokens


class SessionGenerateRequest(Sampling):
    """A generation of the session protocol, over HTTP (this body) and gRPC (its fields, copied)."""

    max_tokens: int | None = Field(256, ge=0)
    stream: bool = False
    response_format: dict[str, Any] | None = None

    def generate_params(self, n_ctx: int) -> GenerateParams:
        return self.params(self.max_tokens, n_ctx, self.response_format)


def _json_schema(response_format: dict[str, Any] | None) -> tuple[dict[str, Any] | bool | None, bool]:
    """OpenAI's response_format as a JSON Schema for the grammar engine, and whether it is strict
    (OpenAI's ``json_schema.strict``, false when absent)."""
    if response_format is None or response_format.get("type") == "text":
        return None, False
    kind = response_format.get("type")
    if kind == "json_object":
        return {"type": "object"}, True
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, (dict, bool)):
            raise BadRequest("response_format.json_schema.schema must be a JSON Schema object")
        strict = spec.get("strict") if isinstance(spec, dict) else None
        if strict is not None and not isinstance(strict, bool):
            raise BadRequest(f"response_format.json_schema.strict must be true or false, got {strict!r}")
        return schema, bool(strict)
    raise BadRequest(f"response_format.type must be 'text', 'json_object' or 'json_schema', got {kind!r}")
