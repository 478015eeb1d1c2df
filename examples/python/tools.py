"""A tool-calling loop on one session, the model's replies constrained by a JSON Schema (the
grammar engine forces valid JSON: the loop never parses a malformed call).

    pyllamaopt serve --model smollm2-135m --grpc-port 50051
    python examples/python/tools.py "What is the weather in Paris?"

Each round the model replies with a call of one of the tools it has not called yet, or with its
answer: the schema of the round says which (the list shrinks as tools are used, the last round
allows only the answer, and with ``--tool-choice required`` the first one only a call). The application runs the call and appends the result as the next
turn; the session keeps everything before it.
"""
from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Any

from chatformat import client_of, connection_args, detect, tokens


# JSON as JavaScript's JSON.stringify writes it (the TypeScript example's histories are the same tokens)
compact = functools.partial(json.dumps, separators=(",", ":"), ensure_ascii=False)


def get_weather(city: str) -> dict[str, Any]:
    return {"city": city, "sky": "sunny", "celsius": 21}


def add(a: float, b: float) -> float:
    return a + b


TOOLS: dict[str, tuple[str, dict[str, Any], Callable[..., Any]]] = {
    "get_weather": ("The current weather in a city",
                    {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}},
                     "required": ["city"], "additionalProperties": False}, get_weather),
    "add": ("The sum of two numbers",
            {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
             "required": ["a", "b"], "additionalProperties": False}, add),
}
ANSWER = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 300}}, "required": ["answer"],
          "additionalProperties": False}
SYSTEM = ("You can call these tools:\n"
          + "\n".join(compact({"name": name, "description": d, "parameters": p}) for name, (d, p, _) in TOOLS.items())
          + '\nReply with JSON only: {"tool": NAME, "arguments": {...}} to call a tool, or {"answer": "..."} to answer '
            'the user. A tool\'s result comes back as {"result": ...}.')


def reply_schema(tools: list[str], answer: bool) -> dict[str, Any]:
    """A call of one of `tools` (its arguments an instance of its parameters' schema), or an answer."""
    calls = [{"type": "object", "properties": {"tool": {"const": name}, "arguments": TOOLS[name][1]},
              "required": ["tool", "arguments"], "additionalProperties": False} for name in tools]
    return {"anyOf": [*calls, ANSWER] if answer else calls}


def main() -> None:
    parser = connection_args(__doc__.splitlines()[0])
    parser.add_argument("question", nargs="?", default="What is the weather in Paris?")
    parser.add_argument("--max-rounds", type=int, default=4)
    parser.add_argument("--tool-choice", choices=["auto", "required"], default="auto",
                        help="required: the first reply is a call")
    args = parser.parse_args()

    with client_of(args) as client:
        fmt = detect(client)
        prompt = fmt.opening(SYSTEM) + fmt.user_turn(args.question, system=SYSTEM)
        with client.create_session(tokens(client, prompt, bos=fmt.bos)) as session:
            unused = list(TOOLS)
            for round_ in range(1, args.max_rounds + 1):
                required = round_ == 1 and args.tool_choice == "required"
                schema = reply_schema(unused, answer=not required) if round_ < args.max_rounds else ANSWER
                generation = session.generate(256, json_schema=schema)
                for _ in generation:
                    pass
                if generation.finish_reason == "length":  # a string or number the model kept writing
                    print(f"round {round_}: the reply did not end within 256 tokens: {generation.text}")
                    break
                reply = json.loads(generation.text)
                if "answer" in reply:
                    print(f"answer: {reply['answer']}")
                    break
                name, arguments = reply["tool"], reply["arguments"]
                result = TOOLS[name][2](**arguments)
                print(f"round {round_}: {name}({compact(arguments)}) -> {compact(result)}")
                unused.remove(name)
                session.append(tokens(client, fmt.after_reply(generation.finish_reason)
                                      + fmt.user_turn(compact({"result": result}))))
            print(f"[session {session.id}: {session.n_tokens} tokens, {round_} rounds]")


if __name__ == "__main__":
    sys.exit(main())
