"""The name of a chat template's tool-call format, as users know it (``ChatTemplate.tool_format``).

llama.cpp's chat layer reads ~40 formats but names them coarsely (``peg-native`` covers Hermes'
``<tool_call>`` as well as Mistral's ``[TOOL_CALLS]``). The name here comes from what the template
itself writes for an assistant's call — the markup the model was trained to produce, found as
llama.cpp's analyzer finds it: a conversation rendered with a call and with a plain answer, the call's
markup being where the two differ — matched against the syntaxes below. The names are those of the
tool-call parsers people pass to servers (vLLM's ``--tool-call-parser``: ``hermes``, ``llama3_json``,
``mistral``, ...), or the model family's where there is none. A syntax not listed keeps llama.cpp's name.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING

from .errors import ChatTemplateError

if TYPE_CHECKING:
    from .chat import ChatTemplate

# (name, the call's markup as the template writes it), first match wins: a specific syntax before a general one
SYNTAXES: tuple[tuple[str, str], ...] = (
    ("gpt-oss", r"<\|channel\|>"),                                   # OpenAI's harmony: to=functions.NAME
    ("qwen3_coder", r"<tool_call>\s*<function=PROBE>\s*<parameter="),  # Qwen3-Coder, Qwen3.5, Nemotron 3 Nano, Step 3.5
    ("glm45", r"<tool_call>\s*PROBE\s*<arg_key>"),                   # GLM 4.5-4.7, Ling 3.0, Laguna, Spark 2.5
    ("minimax_m3", r"\]<\]minimax\[>\["),
    ("minimax_m2", r"<minimax:tool_call>"),
    ("seed_oss", r"<seed:tool_call>"),
    ("hermes", r"<tool_call>\s*\{"),                                 # Hermes 2 Pro/3, Qwen2.5, Qwen3, QwQ, Granite 4
    ("mistral", r"\[TOOL_CALLS\]"),                                  # Mistral Nemo, Small 3.2, Devstral, Ministral 3
    ("llama3_json", r"<\|python_tag\|>|\{\"name\": \"PROBE\", \"parameters\""),  # Llama 3.1-3.3
    ("functionary_v3.1", r"<function=PROBE>\s*\{"),
    ("functionary_v3.2", r">>>PROBE\n"),
    ("deepseek_v32", r"<｜DSML｜"),                                   # DeepSeek V3.2, V4
    ("deepseek_v3", r"<｜tool▁calls▁begin｜>"),                      # DeepSeek R1 (llama.cpp's template of it)
    ("kimi_k2", r"<\|tool_calls_section_begin\|>"),
    ("kimi_k3", r"<\|open\|>tools"),
    ("command_r7b", r"<\|START_ACTION\|>"),                          # Command R7B, Cohere2 MoE
    ("command_r", r"Action:\s*```json"),                             # Command R+
    ("apertus", r"<\|tools_prefix\|>"),
    ("gemma4", r"<\|tool_call>call:"),
    ("lfm2", r"<\|tool_call_start\|>\["),                             # LFM2.5: Python-style calls
    ("apriel", r"<tool_calls>\s*\["),
    ("minimax_m1", r"<tool_calls>\s*\{"),
    ("minicpm5", r"<function name=\"PROBE\""),
    ("muse_glimmer", r"<atem:function_calls>"),
    ("gigachat3", r"<\|function_call\|>|function call<\|role_sep\|>"),
    ("nemotron_nano_v2", r"<TOOLCALL>\["),
    ("hy3", r"<tool_calls:opensource>"),                              # Tencent Hunyuan 3
    ("solar_open", r"<\|tool_call:begin\|>"),
)


PROBE = "probe_tool"
_TOOL = {"type": "function", "function": {"name": PROBE, "description": "A probe.", "parameters": {
    "type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}
_ASK = {"role": "user", "content": "Probe, please."}
_CALL = {"role": "assistant", "content": None, "tool_calls": [{
    "id": "abc123DEF", "type": "function", "function": {"name": PROBE, "arguments": '{"query": "x"}'}}]}
_ANSWER = {"role": "assistant", "content": "Plain answer."}


def call_markup(template: ChatTemplate) -> str | None:
    """What `template` writes for an assistant's call, from where a plain answer's rendering differs
    (None if it renders no call, or refuses the probe)."""
    try:
        with_call = template.render([_ASK, _CALL], add_generation_prompt=False, tools=[_TOOL])
        with_answer = template.render([_ASK, _ANSWER], add_generation_prompt=False, tools=[_TOOL])
    except ChatTemplateError:
        return None
    common = 0
    while common < min(len(with_call), len(with_answer)) and with_call[common] == with_answer[common]:
        common += 1
    # from the start of its line: a marker may begin as the answer's does ("<|START_" ACTION / TEXT)
    start = max(with_call.rfind("\n", 0, common) + 1, common - 64)
    return with_call[start:] if PROBE in with_call[common:] else None


def tool_format_name(template: ChatTemplate) -> str:
    """The name of the format of `template`'s native tool calls (see the module's docstring); llama.cpp's
    name of it where the syntax is none of SYNTAXES."""
    markup = call_markup(template)
    if markup is not None:
        for name, syntax in SYNTAXES:
            if re.search(syntax.replace("PROBE", PROBE), markup):
                return name
    return template.apply({"messages": [_ASK], "tools": [_TOOL]}).format
