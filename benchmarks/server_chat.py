"""The agent trace through the chat route (issue 47): benchmarks/server.py --route chat.

As a user's agent runs it: chat messages sent with the real `openai` client to
/v1/chat/completions, each server rendering them with its own template (ours: the GGUF's through
pyllamaopt's chat layer; llama-server: with --jinja), each server's own answers re-sent as the
assistant messages of the next turns, greedy, streamed. Both servers are up at once with 2 threads
each and take each turn in turn, the first engine rotating (wall: the sum of an engine's request
times); llama-server has one slot and its prompt cache.

Shapes: `append` (the conversation grows, nothing earlier changes) and `workspace` (a file shown
near the start, as Aider does, after the system prompt, edited every 3rd turn: everything after it
changes). --chat-template-file gives both servers a template file (llama-server's option, ours too)
and --enable-thinking sends `chat_template_kwargs: {"enable_thinking": true}`: with a thinking
template each answer's reasoning comes back apart (`reasoning_content`) and is re-sent with it, as
the openai client hands a message back; the template renders the history as it does (most drop
earlier turns' reasoning), and the answers compared with a cold server's include their reasoning.

Per engine: prompt tokens computed (ours: usage `pyllamaopt.computed_tokens`; llama-server:
`timings.prompt_n`), wall time, and whether the answers of the last --check turns equal those of a
cold server (a freshly started one, sent that turn's messages alone). --per-turn adds where each
turn's time went, beside llama-server's own `timings`: render + tokenize of the conversation in
Python (ours, measured in this process with the server's function), the prefill (ours: the
server's `generate_prefill_duration_seconds`; its `prompt_ms`) per computed token, the rest of the
time to first token (HTTP, rendering, queueing, the first step), and a generated token's time
(ours: over the stream; its `predicted_ms` per token, and over the stream), and the server
process's CPU time per request (all its threads: the work, which a loaded machine stretches less
than the wall).
"""
from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

import agent_trace_data as data
import openai
from server import Server, running

from pyllamaopt import Context, Model
from pyllamaopt.chat import ChatTemplate, prompt_tokens

N_CTX = 8192
ROW_ALIGN = 4  # cpp/engine/context.h row_align(): canonical chunks start at multiples of it
CHAT_SHAPES = ("append", "workspace")


@dataclass
class ChatReply:
    text: str
    wall: float          # the request, from sending to the stream's end
    ttft: float
    generated: int
    prompt: int          # prompt tokens (the server's rendering)
    computed: int        # prompt tokens whose KV the server computed
    prefill: float = 0.0  # the server's own prefill time (ours: its metric; llama-server: prompt_ms)
    predicted: float = 0.0  # llama-server: predicted_ms (its generation, sampling included)
    cpu: float = 0.0     # the server process's CPU time during the request (all its threads)
    reasoning: str = ""  # the answer's reasoning_content


@dataclass(frozen=True)
class ChatOptions:
    template_file: Path | None = None  # given to both servers (--chat-template-file)
    template_kwargs: dict | None = None  # the requests' chat_template_kwargs

    def server_args(self) -> tuple[str, ...]:
        return ("--chat-template-file", str(self.template_file)) if self.template_file else ()

    def extra_body(self) -> dict:
        return {"chat_template_kwargs": self.template_kwargs} if self.template_kwargs else {}


def messages_at(shape: str, turn: int, answers: list[ChatReply]) -> list[dict[str, str]]:
    """The conversation sent at `turn`: system prompt, (workspace,) earlier turns with this
    engine's own answers (and their reasoning, if any), the new user message."""
    turns = data.turns(turn + 1)
    out = [{"role": "system", "content": data.system_prompt()}]
    if shape == "workspace":  # Aider's shape: the files as a user message the assistant acknowledges
        out += [{"role": "user", "content": "Files in the chat:\nmathkit/core.py\n```\n"
                 f"{data.workspace_file(turn // 3)}```"},
                {"role": "assistant", "content": "Ok, I will propose changes to these files."}]
    for earlier, answer in zip(turns, answers):
        reasoning = {"reasoning_content": answer.reasoning} if answer.reasoning else {}
        out += [{"role": "user", "content": earlier.user}, {"role": "assistant", "content": answer.text, **reasoning}]
    return out + [{"role": "user", "content": turns[turn].user}]


def prometheus_sum(server: Server, name: str) -> float:
    """A histogram's `_sum` (or a counter) in the server's /metrics."""
    prefix = f"{name} "
    for line in server.get("/metrics").decode().splitlines():
        if line.startswith(prefix):
            return float(line.split()[1])
    return 0.0


def ask_chat(server: Server, client: openai.OpenAI, messages: list[dict[str, str]], gen: int,
             options: ChatOptions) -> ChatReply:
    ours = server.engine.startswith("pyllamaopt")
    prefill_before = prometheus_sum(server, "generate_prefill_duration_seconds_sum") if ours else 0.0
    cpu_before = server.cpu_seconds()
    start = time.perf_counter()
    stream = client.chat.completions.create(model="m", messages=messages, max_tokens=gen, temperature=0, stream=True,
                                            stream_options={"include_usage": True}, extra_body=options.extra_body())
    pieces: list[str] = []
    thoughts: list[str] = []
    first = None
    reply = ChatReply("", 0.0, 0.0, 0, 0, 0)
    for chunk in stream:
        extras = chunk.model_extra or {}
        text = "".join(choice.delta.content or "" for choice in chunk.choices)
        thought = "".join((choice.delta.model_extra or {}).get("reasoning_content") or "" for choice in chunk.choices)
        if text or thought:
            first = first or time.perf_counter()
        pieces.append(text)
        thoughts.append(thought)
        if chunk.usage is not None:
            reply.generated, reply.prompt = chunk.usage.completion_tokens, chunk.usage.prompt_tokens
        if "computed_tokens" in extras.get("pyllamaopt", {}):  # the usage chunk's (a finish chunk's names the format)
            reply.computed = extras["pyllamaopt"]["computed_tokens"]
        if extras.get("timings", {}).get("prompt_n") is not None:  # llama-server: its last chunks carry them
            timings = extras["timings"]
            reply.computed, reply.prefill = timings["prompt_n"], timings["prompt_ms"] / 1000
            reply.predicted = timings["predicted_ms"] / 1000
    end = time.perf_counter()
    reply.cpu = server.cpu_seconds() - cpu_before
    reply.text, reply.reasoning = "".join(pieces), "".join(thoughts)
    reply.wall, reply.ttft = end - start, (first or end) - start
    if ours:
        reply.prefill = prometheus_sum(server, "generate_prefill_duration_seconds_sum") - prefill_before
    return reply


def render_seconds(model: Model, template: ChatTemplate, messages: list[dict[str, str]],
                   options: ChatOptions) -> tuple[float, list[int]]:
    """What our server does to a chat request's messages before its prefill (render, tokenize): its
    time, and the prompt's tokens."""
    kwargs = {"chat_template_kwargs": options.template_kwargs} if options.template_kwargs else {}
    start = time.perf_counter()
    tokens = prompt_tokens(model, template, messages, template.render(messages, **kwargs), **kwargs)
    return time.perf_counter() - start, tokens


def exact_floor(prompts: list[list[int]], min_chunk: int) -> list[int]:
    """The prompt tokens an exact engine computes at each turn, at the least, by the canonical
    schedule (docs/exactness.md): an earlier prompt's rows are reusable where the new prompt repeats
    them, in whole groups of ROW_ALIGN (its answer's rows, computed by decode steps, are not), and the
    last chunk holds min_chunk tokens. The rest of what an engine computes beyond llama-server's is
    not exactness's."""
    def canonical(n: int) -> int:  # the rows a prompt of n tokens leaves reusable
        return 0 if n < min_chunk else n // ROW_ALIGN * ROW_ALIGN

    floors = []
    for turn, tokens in enumerate(prompts):
        held = max((min(canonical(len(p)), len(os.path.commonprefix([p, tokens]))) for p in prompts[:turn]), default=0)
        last_chunk = (len(tokens) - min_chunk) // ROW_ALIGN * ROW_ALIGN if len(tokens) >= min_chunk else 0
        floors.append(len(tokens) - min(held // ROW_ALIGN * ROW_ALIGN, last_chunk))
    return floors


def cold_answer(engine: str, model: Model, server_bin: Path | None, messages: list[dict[str, str]], gen: int,
                options: ChatOptions) -> tuple[str, str]:
    with running(engine, model, server_bin, N_CTX, jinja=True, extra=options.server_args()) as server:
        reply = ask_chat(server, server.client(), messages, gen, options)
        return reply.text, reply.reasoning


def bench_chat(shape: str, model: Model, server_bin: Path | None, engines: list[str], n_turns: int, gen: int,
               check: int, per_turn: bool, options: ChatOptions = ChatOptions()) -> None:
    if shape not in CHAT_SHAPES:
        raise SystemExit(f"the chat route runs the shapes {', '.join(CHAT_SHAPES)}, not {shape}")
    template = ChatTemplate.for_model(model, file=options.template_file)
    replies: dict[str, list[ChatReply]] = {e: [] for e in engines}
    renders: list[float] = []
    our_prompts: list[list[int]] = []  # as our server tokenizes them
    with contextlib.ExitStack() as stack:
        servers = {e: stack.enter_context(running(e, model, server_bin, N_CTX, jinja=True, extra=options.server_args()))
                   for e in engines}
        clients = {e: s.client() for e, s in servers.items()}
        for turn in range(n_turns):
            for engine in engines[turn % len(engines):] + engines[:turn % len(engines)]:
                messages = messages_at(shape, turn, replies[engine])
                replies[engine].append(ask_chat(servers[engine], clients[engine], messages, gen, options))
                if engine.startswith("pyllamaopt"):
                    seconds, tokens = render_seconds(model, template, messages, options)
                    renders.append(seconds)
                    our_prompts.append(tokens)
        load = os.getloadavg()[0]
    first = max(0, n_turns - check)
    same = {e: sum(cold_answer(e, model, server_bin, messages_at(shape, t, replies[e][:t]), gen, options)
                   == (replies[e][t].text, replies[e][t].reasoning) for t in range(first, n_turns)) for e in engines}
    prompts = [r.prompt for r in replies[engines[0]]]
    print(f"\n## chat route, shape {shape}: {n_turns} turns, prompts {prompts[0]}..{prompts[-1]} tokens "
          f"({engines[0]}'s rendering); load {load:.1f} after the trace")
    if options.template_file:
        thinking = {e: sum(bool(r.reasoning) for r in rs) for e, rs in replies.items()}
        print(f"  template {options.template_file.name}, chat_template_kwargs {options.template_kwargs or {}}; "
              f"answers with reasoning: {', '.join(f'{e} {n}/{n_turns}' for e, n in thinking.items())}")
    # decode per generated token: the engines' answers part at a near tie, and an answer that ends
    # early (end of turn) leaves fewer tokens to generate, so totals alone compare unequal work
    print(f"  {'engine':14} {'computed':>9} {'wall s':>7} {'TTFT med ms':>11} {'prefill s':>9} {'decode s':>8} "
          f"{'generated':>9} {'ms/gen token':>12} {'answers = a cold server':>23}")
    for engine, rs in replies.items():
        ttfts = sorted(r.ttft for r in rs)
        decode, generated = sum(r.wall - r.ttft for r in rs), sum(r.generated for r in rs)
        after_first = sum(max(1, r.generated - 1) for r in rs)  # the tokens streamed after the first
        print(f"  {engine:14} {sum(r.computed for r in rs):>9} {sum(r.wall for r in rs):>7.1f} "
              f"{ttfts[len(ttfts) // 2] * 1000:>11.0f} {sum(r.ttft for r in rs):>9.2f} {decode:>8.2f} "
              f"{generated:>9} {decode / after_first * 1000:>12.1f} {f'{same[engine]}/{n_turns - first}':>23}")
    if "llama-server" in replies:
        base = replies["llama-server"]
        for engine, rs in replies.items():
            if engine != "llama-server":
                print(f"  {engine} / llama-server: wall {sum(r.wall for r in rs) / sum(r.wall for r in base):.3f}, "
                      f"server CPU time {sum(r.cpu for r in rs) / sum(r.cpu for r in base):.3f}, "
                      f"prompt tokens computed {sum(r.computed for r in rs)} / {sum(r.computed for r in base)}")
        if "pyllamaopt" in replies:
            with Context(model, n_ctx=256) as probe:  # the schedule's minimum chunk, as the server's context has it
                floors = exact_floor(our_prompts, probe._core.min_chunk)
            print_bounds(replies["pyllamaopt"], base, floors)
            if per_turn:
                print_turns(replies["pyllamaopt"], base, renders, floors)


def print_bounds(ours: list[ChatReply], its: list[ChatReply], floors: list[int]) -> None:
    """Issue 47's goals against what exactness allows in this run: the prompt tokens the canonical
    schedule computes at the least, and the wall ours would take if the tokens beyond llama-server's
    were free (at our prefill's time per token in this run) and, besides, each generated token cost
    its time per token."""
    computed, its_computed = sum(r.computed for r in ours), sum(r.computed for r in its)
    wall, its_wall = sum(r.wall for r in ours), sum(r.wall for r in its)
    per_computed = sum(r.prefill for r in ours) / max(1, computed)
    extra = (computed - its_computed) * per_computed
    after_first = [max(1, r.generated - 1) for r in ours]
    decode = sum(r.wall - r.ttft for r in ours)
    its_per_token = sum(r.wall - r.ttft for r in its) / sum(max(1, r.generated - 1) for r in its)
    print(f"  bounds: prompt tokens the exact schedule computes at the least {sum(floors)} "
          f"({sum(floors) / its_computed:.3f} × llama-server's; ours {computed / its_computed:.3f} ×); wall ÷ its "
          f"{wall / its_wall:.3f}, without the tokens beyond its {(wall - extra) / its_wall:.3f}, and besides with "
          f"its time per generated token {(wall - extra - decode + its_per_token * sum(after_first)) / its_wall:.3f}")


def print_turns(ours: list[ChatReply], its: list[ChatReply], renders: list[float], floors: list[int]) -> None:
    """Where each turn's time went, ours beside llama-server's (its own timings)."""
    print(f"    {'turn':>4} {'prompt':>11} {'computed':>11} {'floor':>5} {'render+tok':>10} {'prefill ms':>13} "
          f"{'ms/computed':>13} {'TTFT-prefill':>13} {'ms/gen token':>13} {'its predicted':>13} {'CPU s':>11}")
    for i, (a, b) in enumerate(zip(ours, its)):
        def per_token(r: ChatReply) -> float:
            return (r.wall - r.ttft) / max(1, r.generated - 1) * 1000

        print(f"    {i:>4} {a.prompt:>5}/{b.prompt:<5} {a.computed:>5}/{b.computed:<5} {floors[i]:>5} {renders[i] * 1000:>10.1f} "
              f"{a.prefill * 1000:>6.0f}/{b.prefill * 1000:<6.0f} "
              f"{a.prefill / max(1, a.computed) * 1000:>6.2f}/{b.prefill / max(1, b.computed) * 1000:<6.2f} "
              f"{(a.ttft - a.prefill) * 1000:>6.0f}/{(b.ttft - b.prefill) * 1000:<6.0f} "
              f"{per_token(a):>6.1f}/{per_token(b):<6.1f} {b.predicted / max(1, b.generated) * 1000:>13.1f} "
              f"{a.cpu:>5.2f}/{b.cpu:<5.2f}")
    total = {k: (sum(getattr(r, k) for r in ours), sum(getattr(r, k) for r in its))
             for k in ("prefill", "computed", "ttft", "wall", "generated", "cpu")}
    print(f"    totals: render+tokenize {sum(renders):.2f} s (ours, in Python); prefill {total['prefill'][0]:.2f} / "
          f"{total['prefill'][1]:.2f} s for {total['computed'][0]} / {total['computed'][1]} computed tokens; "
          f"TTFT outside the prefill {total['ttft'][0] - total['prefill'][0]:.2f} / "
          f"{total['ttft'][1] - total['prefill'][1]:.2f} s; after the first token "
          f"{total['wall'][0] - total['ttft'][0]:.2f} / {total['wall'][1] - total['ttft'][1]:.2f} s for "
          f"{total['generated'][0]} / {total['generated'][1]} tokens "
          f"(its predicted_ms {sum(r.predicted for r in its):.2f} s); the server processes' CPU time "
          f"{total['cpu'][0]:.2f} / {total['cpu'][1]:.2f} s")
