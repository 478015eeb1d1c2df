"""`pyllamaopt serve` as a real process on a loopback port, driven by the real `openai` client and
by plain HTTP (urllib) for the session routes: answers equal the library's, reuse across
requests, the session protocol and its lifecycle, bad input, metrics, API keys."""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pyllamaopt import ChatTemplate, Context, Model, OptConfig, Session
from pyllamaopt.serve.metrics import Metrics
from pyllamaopt.serve.scheduler import STREAM_AHEAD, Scheduler
from pyllamaopt.serve.errors import Busy, InvariantViolation, NotFound, Overloaded
from pyllamaopt.serve.events import DoneEvent, TokenEvent
from pyllamaopt.serve.params import GenerateParams
from pyllamaopt.serve.service import Service
from tinymodel import CHATML, WORDS, write_tiny_llama

N_CTX = 1024


@dataclass
class Server:
    url: str
    process: subprocess.Popen
    log: Path
    ssl_context: ssl.SSLContext | None = None  # https: the context that trusts the server's certificate

    def request(self, method: str, path: str, body: object = None, *, raw: bytes | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, dict]:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"content-type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=60, context=self.ssl_context) as r:
                text = r.read()
                return r.status, json.loads(text) if text else {}
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def events(self, path: str, body: object) -> Iterator[dict]:
        """Server-sent events of a streaming POST, as they arrive."""
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=60, context=self.ssl_context) as r:
            for line in r:
                line = line.decode().strip()
                if line.startswith("data: ") and line != "data: [DONE]":
                    yield json.loads(line[6:])

    def client(self, **kwargs: object) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=kwargs.pop("api_key", "unused"), max_retries=0,
                             **kwargs)

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(self.url + "/metrics", timeout=30, context=self.ssl_context) as r:
            text = r.read().decode()
        return {f"{s.name}{sorted(s.labels.items()) if s.labels else ''}": s.value
                for family in text_string_to_metric_families(text) for s in family.samples}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: Path, tmp_path: Path, *args: str, env: dict[str, str] | None = None,
                 cafile: Path | None = None, preexec_fn: Callable[[], None] | None = None) -> Server:
    """The server as a process (N_CTX, two threads unless ``args`` say otherwise); with ``cafile`` (a
    server given --tls-cert), reached over https trusting that certificate; ``preexec_fn`` runs in
    the child before the server starts (resource limits)."""
    port = free_port()
    log = tmp_path / f"server-{port}.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "pyllamaopt.cli", "serve", "--model", str(model), "--port", str(port),
         "--n-ctx", str(N_CTX), "--threads", "2", *args],
        cwd=tmp_path, stdout=log.open("w"), stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
        preexec_fn=preexec_fn)
    context = ssl.create_default_context(cafile=cafile) if cafile else None
    server = Server(f"{'https' if cafile else 'http'}://127.0.0.1:{port}", process, log, context)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"the server exited with {process.returncode}:\n{log.read_text()}")
        try:
            if server.request("GET", "/health")[0] == 200:
                return server
        except (urllib.error.URLError, ConnectionError):
            pass
        time.sleep(0.2)
    process.kill()
    pytest.fail(f"the server did not answer within 60 s:\n{log.read_text()}")


def stop_server(server: Server) -> None:
    server.process.send_signal(signal.SIGTERM)
    try:
        code = server.process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.process.kill()
        pytest.fail("the server did not stop within 60 s of SIGTERM")
    # uvicorn ends by the signal it was stopped with, after the shutdown it drives
    assert code in (0, -signal.SIGTERM), f"the server exited with {code} on SIGTERM:\n{server.log.read_text()}"
    assert "pyllamaopt serve: stopped" in server.log.read_text(), "the shutdown (sessions closed, saved) did not run"


@pytest.fixture(scope="module")
def server(tiny_model_path, tmp_path_factory) -> Iterator[Server]:
    s = start_server(tiny_model_path, tmp_path_factory.mktemp("serve"), "--max-sessions", "4")
    yield s
    stop_server(s)


# a prompt of several 64-token blocks, so that a repeated prefix is reused
LONG_PROMPT = list(range(10, 10 + 200))


def local_greedy(tiny_model, prompt: list[int], max_tokens: int | None, n_ctx: int = N_CTX) -> list[int]:
    """What the library itself answers, on a context of its own."""
    with Context(tiny_model, n_ctx=n_ctx, n_threads=2) as ctx:
        s = ctx.session()
        s.append(prompt)
        return [t.id for t in s.generate(max_tokens)]


def completion_tokens(server: Server, prompt: list[int], max_tokens: int) -> tuple[list[int], dict]:
    status, body = server.request("POST", "/v1/sessions", {"tokens": prompt})
    assert status == 201, body
    sid = body["session_id"]
    status, out = server.request("POST", f"/v1/sessions/{sid}/generate", {"max_tokens": max_tokens})
    assert status == 200, out
    server.request("DELETE", f"/v1/sessions/{sid}")
    return out["tokens"], out


def test_openai_completions_equal_the_library_and_reuse_a_repeated_prompt(server, tiny_model):
    client = server.client()
    assert [m.id for m in client.models.list().data] == ["tiny-llama"]
    expected = tiny_model.detokenize(local_greedy(tiny_model, LONG_PROMPT, 12))
    first = client.completions.create(model="tiny-llama", prompt=LONG_PROMPT, max_tokens=12)
    second = client.completions.create(model="tiny-llama", prompt=LONG_PROMPT, max_tokens=12)
    assert first.choices[0].text == expected == second.choices[0].text
    assert first.choices[0].finish_reason == "length"
    assert first.usage.prompt_tokens == len(LONG_PROMPT) and first.usage.completion_tokens == 12
    # the second request found the first's blocks (the last chunk is always computed)
    assert second.usage.prompt_tokens_details.cached_tokens >= 128
    extra = second.model_extra["pyllamaopt"]
    assert extra["computed_tokens"] + extra["cached_tokens"] == len(LONG_PROMPT)


def test_streaming_equals_not_streaming(server, tiny_model):
    client = server.client()
    whole = client.completions.create(model="m", prompt=LONG_PROMPT[:50], max_tokens=10)
    stream = client.completions.create(model="m", prompt=LONG_PROMPT[:50], max_tokens=10, stream=True,
                                       stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 10


def test_text_prompts_are_tokenized_as_the_library_does(server, tiny_model):
    text = "the capital of france is"
    out = server.client().completions.create(model="m", prompt=text, max_tokens=6)
    assert out.choices[0].text == tiny_model.detokenize(local_greedy(tiny_model, tiny_model.tokenize(text), 6))


def test_concurrent_clients_get_the_answers_they_get_alone(server, tiny_model):
    prompts = [LONG_PROMPT[i:i + 90] for i in range(0, 40, 10)]
    alone = [server.client().completions.create(model="m", prompt=p, max_tokens=8).choices[0].text for p in prompts]
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        together = list(pool.map(
            lambda p: server.client().completions.create(model="m", prompt=p, max_tokens=8).choices[0].text, prompts))
    assert together == alone


def test_a_model_without_a_chat_template_answers_chat_with_a_400(server):
    with pytest.raises(openai.BadRequestError, match="no chat template"):
        server.client().chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    with pytest.raises(openai.BadRequestError, match="no chat template"):
        server.client().chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], tools=[tool])
    client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    with pytest.raises(anthropic.BadRequestError, match="no chat template"):
        client.messages.create(model="m", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    status, out = server.request("POST", "/v1/messages", {"messages": [{"role": "user", "content": "hi"}]})
    assert status == 400 and out["type"] == "error" and "max_tokens" in out["error"]["message"]


def when_idle(server: Server, method: str, path: str, body: object = None) -> tuple[int, dict]:
    """The request, once the session's generation has ended (the scheduler notices a client gone
    between two steps)."""
    deadline = time.monotonic() + 30
    while True:
        status, out = server.request(method, path, body)
        if status != 409 or time.monotonic() > deadline:
            return status, out
        time.sleep(0.05)


def test_session_protocol_builds_the_same_history_however_it_was_sent(server):
    """INV-3: one append, many appends, or initial tokens give the same output."""
    prompt = LONG_PROMPT[:150]
    outputs = []
    for pieces in ([prompt], [prompt[:1], prompt[1:64], prompt[64:100], prompt[100:]], None):
        status, body = server.request("POST", "/v1/sessions", {"tokens": prompt} if pieces is None else {})
        assert status == 201
        sid = body["session_id"]
        for piece in pieces or []:
            status, info = server.request("POST", f"/v1/sessions/{sid}/tokens", {"tokens": piece})
            assert status == 200, info
        status, info = server.request("GET", f"/v1/sessions/{sid}")
        assert status == 200 and info["tokens"] == prompt
        status, out = server.request("POST", f"/v1/sessions/{sid}/generate", {"max_tokens": 10})
        assert status == 200 and out["finish_reason"] == "length"
        outputs.append(out["tokens"])
        assert server.request("DELETE", f"/v1/sessions/{sid}")[0] == 204
    assert outputs[0] == outputs[1] == outputs[2]


def test_session_generate_streams_tokens_then_the_end(server):
    sid = server.request("POST", "/v1/sessions", {"tokens": LONG_PROMPT[:40]})[1]["session_id"]
    twin = server.request("POST", f"/v1/sessions/{sid}/fork")[1]["session_id"]
    events = list(server.events(f"/v1/sessions/{sid}/generate", {"max_tokens": 5, "stream": True}))
    assert [("token" in e) for e in events] == [True] * 5 + [False]
    assert events[-1]["finish_reason"] == "length" and events[-1]["usage"]["completion_tokens"] == 5
    # the fork has the history as it was, and generates the same tokens
    status, out = server.request("POST", f"/v1/sessions/{twin}/generate", {"max_tokens": 5})
    assert status == 200 and out["tokens"] == [e["token"] for e in events[:5]]
    # sync sets the history: the generated tokens are part of it
    status, info = server.request("POST", f"/v1/sessions/{sid}/sync", {"tokens": LONG_PROMPT[:40]})
    assert status == 200 and info["tokens"] == LONG_PROMPT[:40]
    for s in (sid, twin):
        assert server.request("DELETE", f"/v1/sessions/{s}")[0] == 204


def test_a_client_gone_mid_stream_leaves_the_session_usable(server):
    sid = server.request("POST", "/v1/sessions", {"tokens": LONG_PROMPT[:40]})[1]["session_id"]
    stream = server.events(f"/v1/sessions/{sid}/generate", {"max_tokens": 500, "stream": True})
    next(stream), next(stream)
    stream.close()  # the connection closes
    status, out = when_idle(server, "POST", f"/v1/sessions/{sid}/generate", {"max_tokens": 3})
    # how far the first generation got depends on when the server noticed: the second one goes on
    # from there (the tiny model may end it early)
    assert status == 200, out
    assert out["finish_reason"] == "length" and len(out["tokens"]) == 3 or out["finish_reason"] == "eos"
    info = server.request("GET", f"/v1/sessions/{sid}")[1]
    assert info["tokens"][:40] == LONG_PROMPT[:40] and info["tokens"][-len(out["tokens"]):] == out["tokens"]
    server.request("DELETE", f"/v1/sessions/{sid}")


def test_one_generation_per_session_at_a_time_and_a_stalled_reader_pauses_it(tiny_model):
    """In process (a real HTTP client cannot stall deterministically: socket buffers hold a whole
    generation of the tiny model): while a generation runs, its session refuses other work, and
    a reader that stops reading holds the generation STREAM_AHEAD tokens ahead."""
    async def scenario() -> None:
        with Context(tiny_model, n_ctx=N_CTX, n_threads=2) as ctx:
            scheduler = Scheduler()
            service = Service(ctx, scheduler, Metrics(), max_sessions=2, session_ttl=60)
            sid = await service.create_session(LONG_PROMPT[:40])
            events = service.generate(sid, GenerateParams(max_tokens=None))
            first = await events.__anext__()
            await asyncio.sleep(0.3)  # the reader stalls
            info = await service.info(sid)
            assert info["generating"] and info["stats"]["tokens_generated"] <= STREAM_AHEAD + 2
            with pytest.raises(Busy, match="is generating"):
                await service.append(sid, [5])
            with pytest.raises(Busy):
                await service.generate(sid, GenerateParams(max_tokens=1)).__anext__()
            rest = [e async for e in events]
            assert isinstance(rest[-1], DoneEvent) and rest[-1].finish_reason == "eos"
            assert [first.id] + [e.id for e in rest[:-1]] == local_greedy(tiny_model, LONG_PROMPT[:40], N_CTX - 40)
            assert len(rest) - 1 > STREAM_AHEAD + 2  # it did pause: it was longer than that
            info = await service.append(sid, [5])  # idle again
            assert not info["generating"]
            scheduler.stop()

    asyncio.run(scenario())


def test_more_requests_than_sequences_are_refused_not_failed(tiny_model):
    """In process, with readers that stall (so that the first requests hold their sequences)."""
    async def scenario() -> None:
        with Context(tiny_model, n_ctx=N_CTX, n_threads=2, n_seq_max=2) as ctx:
            scheduler = Scheduler()
            service = Service(ctx, scheduler, Metrics(), max_sessions=1, session_ttl=60)
            streams = [service.complete(LONG_PROMPT[:40], GenerateParams(max_tokens=None)) for _ in range(2)]
            for stream in streams:
                await stream.__anext__()
            with pytest.raises(Overloaded, match="every sequence of the context is in use"):
                await service.complete(LONG_PROMPT[:40], GenerateParams(max_tokens=4)).__anext__()
            for stream in streams:
                assert isinstance([e async for e in stream][-1], DoneEvent)
            events = [e async for e in service.complete(LONG_PROMPT[:40], GenerateParams(max_tokens=4))]
            assert isinstance(events[-1], DoneEvent) and len(events) == 5  # room again
            scheduler.stop()

    asyncio.run(scenario())


def test_requests_continue_an_idle_request_session_even_after_its_eviction(tiny_model):
    """A request resumes the session of an earlier one sharing its prefix (exact, less to
    compute); if the KV cache evicted that session meanwhile, a new one answers the same."""
    async def scenario() -> None:
        with Context(tiny_model, n_ctx=256, n_threads=2, n_seq_max=4) as ctx:
            scheduler = Scheduler()
            service = Service(ctx, scheduler, Metrics(), max_sessions=2, session_ttl=60)
            prompt = LONG_PROMPT
            first = [e async for e in service.complete(prompt, GenerateParams(max_tokens=4))]
            resumed = [e async for e in service.complete(prompt, GenerateParams(max_tokens=4))]
            # only the last chunk is computed again (a fresh session would also compute the
            # partial block before it: the pool holds complete blocks only)
            assert resumed[-1].usage.computed == ctx._core.min_chunk
            await service.create_session(list(range(300, 500)))  # needs the cache: the idle one is evicted
            assert ctx.stats.sessions_evicted == 1
            again = [e async for e in service.complete(prompt, GenerateParams(max_tokens=4))]
            assert [e.id for e in again[:-1]] == [e.id for e in resumed[:-1]] == [e.id for e in first[:-1]]
            scheduler.stop()

    asyncio.run(scenario())


def test_a_long_prompt_is_computed_in_pieces_between_the_steps_of_other_streams(tiny_model):
    """While a long prompt is computed, a running generation goes on (its steps between the
    prompt's pieces), and both answers are those each gets alone: pieces are exact."""
    long_prompt = [10 + (i * 7) % 500 for i in range(2600)]  # about ten pieces

    async def scenario() -> None:
        with Context(tiny_model, n_ctx=4096, n_threads=2) as ctx:
            scheduler = Scheduler()
            service = Service(ctx, scheduler, Metrics(), max_sessions=2, session_ttl=60)
            order: list[str] = []
            sid = await service.create_session(LONG_PROMPT[:40])
            running = service.generate(sid, GenerateParams(max_tokens=None))
            first = await running.__anext__()

            async def read_running() -> list:
                events = [first]
                async for e in running:
                    order.append("token")
                    events.append(e)
                return events

            reader = asyncio.create_task(read_running())
            await asyncio.sleep(0)
            order.append("prompt sent")
            answer = service.complete(long_prompt, GenerateParams(max_tokens=8))
            head = await answer.__anext__()
            order.append("prompt done")
            rest = [e async for e in answer]
            running_events = await reader
            during = order[order.index("prompt sent"):order.index("prompt done")].count("token")
            assert during >= 8, order  # one whole-prompt step lets through about three
            assert [head.id] + [e.id for e in rest[:-1]] == local_greedy(tiny_model, long_prompt, 8, n_ctx=4096)
            assert rest[-1].usage.computed == len(long_prompt)
            assert [e.id for e in running_events[:-1]] == local_greedy(tiny_model, LONG_PROMPT[:40], None, n_ctx=4096)
            scheduler.stop()

    asyncio.run(scenario())


def test_concurrent_prompts_sharing_a_prefix_compute_it_once(tiny_model, monkeypatch):
    """Agents sharing a system prompt, all at once: the first computes the shared prefix, the others
    wait for it and take its blocks from the pool (computing one chunk at its end again), instead
    of each computing it in pieces beside the others; the answers are those each gets alone. As
    the others only wait, the first computes what they wait for in one piece, not in pieces
    alternating with streams that have nothing to do."""
    shared = [10 + (i * 7) % 500 for i in range(1500)]
    prompts = [shared + [10 + (97 * k + 13 * j) % 590 for j in range(100)] for k in range(4)]
    pieces: dict[int, list[int]] = {}  # by session: the history's length after each piece of its prefill
    for name in ("sync", "append"):
        def spy(session: Session, *args: Any, _call: Any = getattr(Session, name), **kwargs: Any) -> Any:
            result = _call(session, *args, **kwargs)
            pieces.setdefault(id(session), []).append(session.n_tokens)
            return result
        monkeypatch.setattr(Session, name, spy)

    async def scenario() -> tuple[list[tuple[list[int], int]], int]:
        with Context(tiny_model, n_ctx=4096, n_threads=2) as ctx:
            scheduler = Scheduler()
            service = Service(ctx, scheduler, Metrics(), max_sessions=4, session_ttl=60)

            async def ask(prompt: list[int]) -> tuple[list[int], int]:
                events = [e async for e in service.complete(prompt, GenerateParams(max_tokens=4))]
                return [e.id for e in events[:-1]], events[-1].usage.computed

            try:
                return await asyncio.gather(*(ask(p) for p in prompts)), ctx.block_size
            finally:
                scheduler.stop()

    answers, block = asyncio.run(scenario())
    assert [tokens for tokens, _ in answers] == [local_greedy(tiny_model, p, 4, n_ctx=4096) for p in prompts]
    computed = [n for _, n in answers]
    assert computed[0] == len(prompts[0]), computed
    # each other agent: its own 100 tokens and one chunk of the shared prefix again (the canonical
    # schedule's last chunk holds >= 64 tokens, from a block boundary) -- not the 1500 shared ones
    assert all(n <= 100 + 2 * block for n in computed[1:]), computed
    first = next(iter(pieces.values()))  # the first prompt's: one piece before the others came, then
    assert first == [first[0], len(shared) // block * block, len(prompts[0])], first  # all they share at once


def test_an_append_cancelled_between_pieces_leaves_the_old_history(tiny_model):
    """An append is all or nothing: a client that leaves while it is computed in pieces (other
    work waits) finds the session as it was."""
    async def scenario() -> None:
        with Context(tiny_model, n_ctx=4096, n_threads=2) as ctx:
            scheduler = Scheduler()
            service = Service(ctx, scheduler, Metrics(), max_sessions=2, session_ttl=60)
            sid = await service.create_session(LONG_PROMPT[:40])
            other = await service.create_session(LONG_PROMPT[:40])
            running = service.generate(other, GenerateParams(max_tokens=None))  # makes the append go in pieces
            await running.__anext__()
            append = asyncio.create_task(service.append(sid, [10 + i % 500 for i in range(3000)]))
            async def prefilling() -> None:
                while (await service.info(sid))["busy"] != "prefilling":
                    await asyncio.sleep(0)

            await asyncio.wait_for(prefilling(), 30)  # seen between two pieces
            append.cancel()
            with pytest.raises(asyncio.CancelledError):
                await append
            [e async for e in running]
            info = await service.info(sid)
            assert info["tokens"] == LONG_PROMPT[:40] and info["busy"] is None
            events = [e async for e in service.generate(sid, GenerateParams(max_tokens=5))]
            assert [e.id for e in events[:-1]] == local_greedy(tiny_model, LONG_PROMPT[:40], 5, n_ctx=4096)
            scheduler.stop()

    asyncio.run(scenario())


def test_approximate_reuse_is_a_server_option_and_answers_say_so(tiny_model_path, tmp_path):
    """Tier 2, off by default: a prompt changed near its start reuses the rest of the previous
    request's KV at shifted positions, and its usage says the answer is approximate."""
    changed = [7, 8, 9] + LONG_PROMPT[1:]

    def second_request(*args: str) -> dict:
        s = start_server(tiny_model_path, tmp_path, *args)
        try:
            client = s.client()
            client.completions.create(model="m", prompt=LONG_PROMPT, max_tokens=2)
            return client.completions.create(model="m", prompt=changed, max_tokens=2).model_extra["pyllamaopt"]
        finally:
            stop_server(s)

    exact, approximate = second_request(), second_request("--approximate-reuse")
    assert not exact["approximate"] and exact["computed_tokens"] == len(changed)
    assert approximate["approximate"] and approximate["computed_tokens"] < len(changed) // 2


def test_sparse_tool_results_is_a_server_option_that_marks_tool_messages(tmp_path):
    """Tier 2, off by default: with --sparse-tool-results the chat route marks the tool messages'
    contents, their irrelevant spans leave attention (the metrics count the tokens) and the
    answers say they are approximate; off, the same conversation is exact and the next request
    reuses the previous one's KV exactly. The real openai client, tools, a ChatML template."""
    model = write_tiny_llama(tmp_path / "tiny-chatml.gguf", chat_template=CHATML)
    words = [w for w in WORDS if w not in ("capital", "france")]
    result = " ".join(words[(7 * i) % len(words)] for i in range(400)) + " error: the capital of france is paris"
    tools = [{"type": "function", "function": {"name": "read", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}}}}}]
    messages = [{"role": "user", "content": "what is the capital of france"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "read", "arguments": '{"path":"notes"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": result}]

    def conversation(*args: str) -> tuple[dict, dict, float]:
        # the tiny vocabulary spells many words letter by letter, so every span shares tokens with
        # any query: a budget (half of each result) makes the drop independent of that
        s = start_server(model, tmp_path, "--n-ctx", "4096", *args, env={"LLAMA_OPT_SPARSE_ATTN_BUDGET": "0.5"})
        try:
            client = s.client()
            first = client.chat.completions.create(model="m", messages=messages, tools=tools, max_tokens=3)
            later = messages + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "and of italy"}]
            second = client.chat.completions.create(model="m", messages=later, tools=tools, max_tokens=3)
            dropped = s.metrics()["pyllamaopt_sparse_tokens_dropped_total"]
            return first.model_extra["pyllamaopt"], second.model_extra["pyllamaopt"], dropped
        finally:
            stop_server(s)

    (off, off_next, off_dropped), (on, on_next, on_dropped) = conversation(), conversation("--sparse-tool-results")
    assert on["prompt_tokens"] == off["prompt_tokens"]  # the same prompt tokens
    assert not off["approximate"] and not off_next["approximate"] and off_dropped == 0
    assert off_next["cached_tokens"] >= off["prompt_tokens"] - 64  # exact reuse across requests
    assert on["approximate"] and on_next["approximate"] and 0 < on_dropped < on["prompt_tokens"] / 2
    assert on_next["cached_tokens"] >= on["prompt_tokens"] - 64  # the session with holes continues


def test_anthropic_continues_a_prefilled_assistant_message(tmp_path, tiny_model_path):
    """The real anthropic client: a last assistant message is continued (its text ends the prompt,
    the reply is what follows it), as Anthropic's API does; the same text as a raw completion of
    that prompt. A server with an API key answers an unauthorized /v1/messages in Anthropic's error
    shape."""
    model = write_tiny_llama(tmp_path / "tiny-chatml.gguf", chat_template=CHATML)
    s = start_server(model, tmp_path, env={"LLAMA_OPT_SERVE_API_KEY": "sesame"})
    try:
        client = anthropic.Anthropic(base_url=s.url, api_key="sesame", max_retries=0)
        messages = [{"role": "user", "content": "the capital of france is"}, {"role": "assistant", "content": "paris"}]
        reply = client.messages.create(model="m", max_tokens=6, messages=messages)
        template = ChatTemplate(CHATML)
        rendered = template.render(messages, add_generation_prompt=False)
        raw = rendered[:rendered.rindex("paris") + len("paris")]
        tokens = Model(str(model)).tokenize(raw, add_bos=False, special=True)
        expected = s.client(api_key="sesame").completions.create(model="m", prompt=tokens, max_tokens=6)
        assert reply.content[0].text == expected.choices[0].text
        assert reply.usage.input_tokens + reply.usage.cache_read_input_tokens == len(tokens)
        with client.messages.stream(model="m", max_tokens=6, messages=messages) as stream:
            start = next(e for e in stream if e.type == "message_start")
            # (it said 0; then all of the prompt as input_tokens: now split into computed and cached)
            usage = start.message.usage
            assert usage.input_tokens + usage.cache_read_input_tokens == len(tokens)
            assert stream.get_final_text() == reply.content[0].text
        with pytest.raises(anthropic.AuthenticationError) as refused:
            anthropic.Anthropic(base_url=s.url, api_key="wrong", max_retries=0).messages.create(
                model="m", max_tokens=2, messages=messages[:1])
        assert refused.value.body["type"] == "error" and refused.value.body["error"]["type"] == "authentication_error"
    finally:
        stop_server(s)


def test_refused_tier2_plans_are_counted_in_the_metrics(tiny_model):
    """A Tier-2 plan that cannot work (here: flash attention off, V stored transposed) is refused
    before computing; the request gets exact mode's answer, and the metrics count the reason."""
    async def scenario() -> None:
        config = OptConfig(env={}, diff_reuse_shifted=True)
        with Context(tiny_model, n_ctx=N_CTX, n_threads=2, flash_attn=False, config=config) as ctx:
            scheduler = Scheduler()
            metrics = Metrics()
            service = Service(ctx, scheduler, metrics, max_sessions=2, session_ttl=60)
            [e async for e in service.complete(LONG_PROMPT, GenerateParams(max_tokens=2))]
            changed = [7, 8, 9] + LONG_PROMPT[1:]
            answer = [e async for e in service.complete(changed, GenerateParams(max_tokens=2))]
            assert not answer[-1].usage.approximate and answer[-1].usage.computed == len(changed)
            refused = metrics.shift_fallbacks
            assert refused.labels(reason="unsupported")._value.get() == 1
            assert refused.labels(reason="shared")._value.get() == refused.labels(reason="room")._value.get() == 0
            assert b'pyllamaopt_shift_fallbacks_total{reason="unsupported"} 1.0' in metrics.exposition()
            scheduler.stop()

    asyncio.run(scenario())


def test_an_invariant_violation_fails_the_request_closes_the_session_and_keeps_nothing(tiny_model, tmp_path):
    """003 §2.8: KV removed behind a session's back (a stand-in for a bug) is found after the next
    operation, counted, and answered with an error that says what to do; the session is gone
    and none of its KV is saved to disk or reused."""
    async def scenario() -> None:
        config = OptConfig(env={}, persist_enabled=True, persist_dir=str(tmp_path / "kv"))
        with Context(tiny_model, n_ctx=N_CTX, n_threads=2, config=config) as ctx:
            scheduler = Scheduler()
            metrics = Metrics()
            service = Service(ctx, scheduler, metrics, max_sessions=2, session_ttl=60)
            sid = await service.create_session(LONG_PROMPT)
            seq = service._sessions[sid].session._core.seq
            ctx._core._test_kv_remove(seq, 64, 128)
            with pytest.raises(InvariantViolation, match=r"inv1: .*no KV at position 64.*create a new one"):
                await service.append(sid, [5])
            with pytest.raises(NotFound):
                await service.info(sid)
            violations = metrics.cache_invariant_violations_total
            assert violations.labels(kind="inv1")._value.get() == 1
            assert violations.labels(kind="inv2")._value.get() == 0
            assert metrics.session_total.labels(outcome="failed")._value.get() == 1
            assert ctx.persist is not None and ctx.persist.entries() == []
            fresh = [e async for e in service.complete(LONG_PROMPT, GenerateParams(max_tokens=4))]
            assert fresh[-1].usage.computed == len(LONG_PROMPT)  # nothing of the failed session reused
            assert [e.id for e in fresh[:-1]] == local_greedy(tiny_model, LONG_PROMPT, 4)
            scheduler.stop()

    asyncio.run(scenario())


def test_a_session_the_kv_cache_evicted_is_not_found_and_its_blocks_come_back_from_disk(tiny_model, tmp_path):
    """With persistence on, a protocol session evicted for room is saved first: it answers "not
    found", and a request with its history restores its blocks from disk and answers the same."""
    async def scenario() -> None:
        config = OptConfig(env={}, persist_enabled=True, persist_dir=str(tmp_path / "kv"))
        with Context(tiny_model, n_ctx=256, n_threads=2, n_seq_max=4, config=config) as ctx:
            scheduler = Scheduler()
            service = Service(ctx, scheduler, Metrics(), max_sessions=2, session_ttl=60)
            sid = await service.create_session(LONG_PROMPT)
            other = await service.create_session(list(range(300, 500)))  # the idle one is evicted for room
            assert ctx.stats.sessions_evicted == 1
            with pytest.raises(NotFound, match="evicted"):
                await service.info(sid)
            await service.close(other)  # room again (its blocks stay cached, and go first)
            events = [e async for e in service.complete(LONG_PROMPT, GenerateParams(max_tokens=4))]
            # the complete blocks below the last chunk, which is computed (it gives the logits)
            assert events[-1].usage.restored == 2 * ctx.block_size
            assert [e.id for e in events[:-1]] == local_greedy(tiny_model, LONG_PROMPT, 4)
            scheduler.stop()

    asyncio.run(scenario())


def test_a_generating_session_is_never_evicted_a_prompt_that_needs_its_room_waits(tiny_model):
    """A prompt that needs the KV of a generation in progress is a 503 (retry), not an eviction
    that would break the running stream; once the generation ends, the same prompt goes through."""
    async def scenario() -> None:
        with Context(tiny_model, n_ctx=256, n_threads=2, n_seq_max=4) as ctx:
            scheduler = Scheduler()
            service = Service(ctx, scheduler, Metrics(), max_sessions=2, session_ttl=60)
            sid = await service.create_session(LONG_PROMPT[:100])
            running = service.generate(sid, GenerateParams(max_tokens=None))
            first = await running.__anext__()  # then the reader stalls: the generation stays on
            other = list(range(300, 460))
            with pytest.raises(Overloaded, match="generations in progress"):
                await service.complete(other, GenerateParams(max_tokens=2)).__anext__()
            rest = [e async for e in running]
            assert ctx.stats.sessions_evicted == 0
            assert [first.id] + [e.id for e in rest[:-1]] == local_greedy(tiny_model, LONG_PROMPT[:100], None, n_ctx=256)
            events = [e async for e in service.complete(other, GenerateParams(max_tokens=2))]
            assert isinstance(events[-1], DoneEvent) and ctx.stats.sessions_evicted == 1  # idle now: evicted
            scheduler.stop()

    asyncio.run(scenario())


def test_a_prompt_between_its_pieces_is_not_evicted_for_another_prompts_room(tiny_model):
    """Two long prompts at once, computed in alternating pieces, in a KV cache with room for one:
    a prompt between its pieces is not idle (Session.pinned), so the one that finds no room is a
    503 to retry and the other is answered; the KV cache evicted the other's session instead, and
    its client got a 404 (or a 500)."""
    async def scenario() -> None:
        with Context(tiny_model, n_ctx=1024, n_threads=2, n_seq_max=4) as ctx:
            scheduler = Scheduler()
            service = Service(ctx, scheduler, Metrics(), max_sessions=2, session_ttl=60)
            prompts = [[10 + (i * 7 + k) % 500 for i in range(700)] for k in (0, 1)]

            async def answer(prompt: list[int]) -> list[Any] | Exception:
                try:
                    return [e async for e in service.complete(prompt, GenerateParams(max_tokens=4))]
                except Exception as exc:  # noqa: BLE001 (which one is the point)
                    return exc

            outcomes = await asyncio.gather(answer(prompts[0]), answer(prompts[1]))
            refused = [i for i, o in enumerate(outcomes) if isinstance(o, Overloaded)]
            assert len(refused) == 1, outcomes
            answered = 1 - refused[0]
            events = outcomes[answered]
            assert isinstance(events, list) and isinstance(events[-1], DoneEvent), events
            assert [e.id for e in events[:-1]] == local_greedy(tiny_model, prompts[answered], 4)
            assert ctx.stats.sessions_evicted == 0
            retried = prompts[refused[0]]
            again = [e async for e in service.complete(retried, GenerateParams(max_tokens=4))]
            assert [e.id for e in again[:-1]] == local_greedy(tiny_model, retried, 4)
            scheduler.stop()

    asyncio.run(scenario())


def test_generating_on_an_empty_session_is_a_400(server):
    sid = server.request("POST", "/v1/sessions", {"tokens": []})[1]["session_id"]
    status, out = server.request("POST", f"/v1/sessions/{sid}/generate", {"max_tokens": 2})
    assert status == 400 and "no history to generate after" in out["error"]["message"], out
    assert server.request("POST", f"/v1/sessions/{sid}/tokens", {"tokens": [5, 6]})[0] == 200
    assert server.request("POST", f"/v1/sessions/{sid}/generate", {"max_tokens": 2})[0] == 200
    server.request("DELETE", f"/v1/sessions/{sid}")


def test_a_chunked_body_beyond_the_limit_is_a_413(server):
    """The body limit holds for bodies without a Content-Length too (they were read whole)."""
    import http.client

    host, port = server.url.removeprefix("http://").split(":")
    piece = b"x" * 2**20

    def send(megabytes: int) -> tuple[int, dict]:
        connection = http.client.HTTPConnection(host, int(port), timeout=60)
        connection.request("POST", "/v1/completions", body=(piece for _ in range(megabytes)),
                           headers={"content-type": "application/json"}, encode_chunked=True)
        response = connection.getresponse()
        out = json.loads(response.read() or b"{}")
        connection.close()
        return response.status, out

    status, out = send(17)
    assert status == 413 and "larger than" in out["error"]["message"], out
    assert send(1)[0] == 400  # under the limit: read, and not JSON
    chunked_json = http.client.HTTPConnection(host, int(port), timeout=60)
    chunked_json.request("POST", "/v1/completions", body=iter([b'{"prompt": [5, 6], ', b'"max_tokens": 2}']),
                         headers={"content-type": "application/json"}, encode_chunked=True)
    answer = chunked_json.getresponse()
    assert answer.status == 200 and json.loads(answer.read())["usage"]["completion_tokens"] == 2
    chunked_json.close()


def test_time_to_first_token_counts_the_prompt(tiny_model):
    """The metric measures what a client waits for: from the request to its first token, the
    prompt's computation included (it started after the prompt)."""
    async def scenario() -> None:
        with Context(tiny_model, n_ctx=4096, n_threads=2) as ctx:
            scheduler = Scheduler()
            metrics = Metrics()
            service = Service(ctx, scheduler, metrics, max_sessions=2, session_ttl=60)
            events = [e async for e in service.complete([10 + i % 500 for i in range(3000)], GenerateParams(max_tokens=2))]
            assert isinstance(events[-1], DoneEvent)
            samples = {s.name: s.value for family in text_string_to_metric_families(metrics.exposition().decode())
                       for s in family.samples}
            prefill = samples["generate_prefill_duration_seconds_sum"]
            assert prefill > 0 and samples["pyllamaopt_time_to_first_token_seconds_sum"] >= prefill
            scheduler.stop()

    asyncio.run(scenario())


def test_closed_and_unknown_sessions_are_not_found(server):
    sid = server.request("POST", "/v1/sessions", {"tokens": [1, 2, 3]})[1]["session_id"]
    assert server.request("DELETE", f"/v1/sessions/{sid}")[0] == 204
    for method, path, body in (("GET", f"/v1/sessions/{sid}", None), ("DELETE", f"/v1/sessions/{sid}", None),
                               ("POST", f"/v1/sessions/{sid}/tokens", {"tokens": [1]}),
                               ("POST", "/v1/sessions/nope/generate", {"max_tokens": 1})):
        status, out = server.request(method, path, body)
        assert status == 404 and "does not exist" in out["error"]["message"], (method, path)


def test_the_least_recently_used_idle_session_goes_first(server):
    ids = [server.request("POST", "/v1/sessions", {"tokens": [1, 2, 3]})[1]["session_id"] for _ in range(4)]
    assert server.request("GET", f"/v1/sessions/{ids[0]}")[0] == 200  # ids[1] is now the oldest
    before = server.metrics().get("session_evicted_total[('reason', 'lru')]", 0)
    newest = server.request("POST", "/v1/sessions", {"tokens": [4]})[1]["session_id"]  # max_sessions is 4
    assert server.request("GET", f"/v1/sessions/{ids[1]}")[0] == 404
    assert all(server.request("GET", f"/v1/sessions/{s}")[0] == 200 for s in (ids[0], ids[2], ids[3], newest))
    assert server.metrics()["session_evicted_total[('reason', 'lru')]"] == before + 1
    for s in (ids[0], ids[2], ids[3], newest):
        server.request("DELETE", f"/v1/sessions/{s}")


@pytest.mark.parametrize("path, body, raw, status, message", [
    ("/v1/completions", None, b"{not json", 400, "JSON"),
    ("/v1/completions", {"prompt": "x", "max_tokens": -1}, None, 400, "body.max_tokens:"),
    ("/v1/completions", {"prompt": "x", "max_tokens": "many"}, None, 400, "body.max_tokens:"),
    ("/v1/completions", {"prompt": [1, 10**9]}, None, 400, "outside the vocabulary"),
    ("/v1/completions", {"prompt": "x", "n": 9}, None, 400, "body.n:"),  # (n > 8: choices.MAX_CHOICES)
    ("/v1/completions", {"prompt": "x", "temperature": -1}, None, 400, "body.temperature:"),
    ("/v1/completions", {"prompt": [5] * (N_CTX + 5)}, None, 400,
     f"the prompt has {N_CTX + 5} tokens, and the server's context holds {N_CTX} with the answer: shorten it"),
    ("/v1/completions", {"prompt": [5] * N_CTX}, None, 400, f"the prompt has {N_CTX} tokens"),  # no room to answer
    ("/v1/completions", None, b"[1, 2]", 400, "valid dictionary"),
    ("/v1/chat/completions", {"messages": []}, None, 400, "messages"),
    ("/v1/sessions", {"tokens": [-1]}, None, 400, "outside the vocabulary"),
    ("/v1/sessions", {"tokens": "abc"}, None, 400, "body.tokens:"),
    ("/v1/sessions", {"tokens": [1], "extra": 1}, None, 400, "body.extra:"),
    ("/v1/completions", {"prompt": []}, None, 400, "the prompt is empty"),
    ("/v1/completions", {"prompt": [], "stream": True}, None, 400, "the prompt is empty"),
    ("/v1/completions", {"prompt": "x", "logprobs": 21}, None, 400, "body.logprobs:"),
    ("/v1/completions", {"prompt": "x", "logprobs": -1}, None, 400, "body.logprobs:"),
    ("/v1/completions", {"prompt": "x", "logprobs": 1, "max_tokens": 0}, None, 400,
     "logprobs with max_tokens=0 and no echo"),
    ("/v1/completions", {"prompt": "x", "echo": "loud"}, None, 400, "body.echo:"),
    ("/v1/completions", {"prompt": [[1], [2]]}, None, 400, "a batch of 2 prompts is not served"),
    ("/v1/completions", {"prompt": [], "echo": True, "logprobs": 1, "max_tokens": 0}, None, 400, "the prompt is empty"),
    ("/v1/completions", {"prompt": [5] * N_CTX, "echo": True, "logprobs": 1, "max_tokens": 0}, None, 400,
     f"the prompt has {N_CTX} tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 21},
     None, 400, "body.top_logprobs:"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, None, 400,
     "top_logprobs needs logprobs: true"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "echo": True}, None, 400, "body.echo:"),
])
def test_bad_input_is_a_4xx_with_a_message_and_the_server_lives_on(server, path, body, raw, status, message):
    got, out = server.request("POST", path, body, raw=raw)
    assert got == status, out
    assert message in out["error"]["message"]
    assert server.request("GET", "/health")[0] == 200


@pytest.mark.parametrize("kind, read", [("application/x-www-form-urlencoded", False), ("text/json", False),
                                        ("application/json; charset=utf-8", True), ("application/vnd.x+json", True)])
def test_a_body_not_sent_as_json_says_so(server, kind, read):
    """curl -d sends a form's content type: FastAPI's "Input should be a valid dictionary" did not say
    what was wrong. (FastAPI reads application/json and application/*+json only.)"""
    got, out = server.request("POST", "/v1/completions", raw=b'{"prompt": "x", "max_tokens": 1}',
                              headers={"content-type": kind})
    if read:
        assert got == 200, out
    else:
        assert got == 400 and "must be JSON, sent with 'Content-Type: application/json'" in out["error"]["message"]


def test_a_strict_schema_we_cannot_enforce_is_a_400_a_non_strict_one_is_checked(server):
    import jsonschema

    sid = server.request("POST", "/v1/sessions", {"tokens": [1, 2, 3]})[1]["session_id"]
    lookahead = {"type": "string", "pattern": "(?!a)b", "maxLength": 6}
    bad = {"type": "json_schema", "json_schema": {"schema": lookahead, "strict": True}}
    status, out = server.request("POST", f"/v1/sessions/{sid}/generate", {"max_tokens": 4, "response_format": bad})
    assert status == 400 and "lookahead" in out["error"]["message"] and "'pattern' at #" in out["error"]["message"]
    assert out["error"]["pyllamaopt_error"] == "UnsupportedRegexError"
    for strict in (False, None):  # OpenAI's meaning: absent is false
        spec = {"schema": lookahead} if strict is None else {"schema": lookahead, "strict": strict}
        status, out = server.request("POST", f"/v1/sessions/{sid}/generate",
                                     {"max_tokens": 12, "response_format": {"type": "json_schema", "json_schema": spec}})
        assert status == 200, out
        try:
            jsonschema.validate(json.loads(out["text"]), lookahead)
            expected = True
        except (ValueError, jsonschema.ValidationError):
            expected = False
        assert out["schema_valid"] is expected and (out["schema_error"] is None) == expected, out
    status, out = server.request("POST", f"/v1/sessions/{sid}/generate",
                                 {"max_tokens": 4, "response_format": {"type": "json_schema",
                                                                       "json_schema": {"schema": {}, "strict": "yes"}}})
    assert status == 400 and "strict must be true or false" in out["error"]["message"]
    status, out = server.request("POST", f"/v1/sessions/{sid}/generate",
                                 {"max_tokens": 4, "response_format": {"type": "xml"}})
    assert status == 400 and "response_format.type" in out["error"]["message"]
    ok = {"type": "json_schema", "json_schema": {"schema": {"type": "object", "properties": {"a": {"type": "integer"}},
                                                            "required": ["a"]}}}
    status, out = server.request("POST", f"/v1/sessions/{sid}/generate", {"max_tokens": 40, "response_format": ok})
    assert status == 200, out
    if out["finish_reason"] != "length":
        assert isinstance(json.loads(out["text"])["a"], int) and out["schema_valid"] is True
    server.request("DELETE", f"/v1/sessions/{sid}")


def test_fit_max_tokens_is_a_server_configuration_that_closes_structured_output(tiny_model_path, tmp_path):
    """LLAMA_OPT_SCHEMA_FIT_MAX_TOKENS=1 (off by default): an answer under a response_format that
    max_tokens would cut off is closed in time instead, and valid."""
    schema = {"type": "object", "properties": {"files": {"type": "array", "items": {"type": "string"}},
                                               "line": {"type": "integer"}}, "required": ["files", "line"]}
    request = {"max_tokens": 30, "response_format": {"type": "json_schema", "json_schema": {"schema": schema}}}

    def answer(s: Server) -> dict:
        sid = s.request("POST", "/v1/sessions", {"tokens": LONG_PROMPT[10:40]})[1]["session_id"]
        status, out = s.request("POST", f"/v1/sessions/{sid}/generate", request)
        assert status == 200, out
        return out

    # json.dumps's one-line layout, in which the tiny model's answer runs past max_tokens (in the
    # server's default layout, indented, it finishes within them: issue 43)
    spaced = start_server(tiny_model_path, tmp_path, "--json-whitespace", "spaced")
    try:
        cut = answer(spaced)
    finally:
        stop_server(spaced)
    assert cut["finish_reason"] == "length" and cut["schema_valid"] is False
    fitting = start_server(tiny_model_path, tmp_path, "--json-whitespace", "spaced",
                           env={"LLAMA_OPT_SCHEMA_FIT_MAX_TOKENS": "1"})
    try:
        closed = answer(fitting)
    finally:
        stop_server(fitting)
    assert closed["finish_reason"] != "length" and closed["schema_valid"] is True, closed
    assert set(json.loads(closed["text"])) == {"files", "line"} and len(closed["tokens"]) <= 30


def test_a_max_tokens_beyond_the_context_is_clamped(server):
    out = server.client().completions.create(model="m", prompt=LONG_PROMPT[:20], max_tokens=10**6)
    assert out.choices[0].finish_reason == "length"
    assert out.usage.prompt_tokens + out.usage.completion_tokens <= N_CTX


def test_metrics_parse_and_count_the_work(server):
    before = server.metrics()
    out = server.client().completions.create(model="m", prompt=LONG_PROMPT[:70], max_tokens=4)
    after = server.metrics()
    assert after["pyllamaopt_tokens_generated_total"] == before["pyllamaopt_tokens_generated_total"] + 4
    assert after["generate_prefill_tokens_sum"] == before["generate_prefill_tokens_sum"] + 70
    assert after["generate_prefill_tokens_count"] == before["generate_prefill_tokens_count"] + 1
    computed = out.model_extra["pyllamaopt"]["computed_tokens"]
    assert after["pyllamaopt_prompt_tokens_computed_total"] == before["pyllamaopt_prompt_tokens_computed_total"] + computed
    assert after["session_history_tokens_count"] == before["session_history_tokens_count"] + 1
    assert after["cache_invariant_violations_total[('kind', 'inv1')]"] == 0
    for name in ("session_active", "session_kv_live_bytes", "pyllamaopt_queue_depth",
                 "pyllamaopt_time_to_first_token_seconds_count"):
        assert name in after


def test_idle_sessions_expire(tiny_model_path, tmp_path):
    # a TTL a loaded machine's two requests cannot outlast (0.5 s did, at a load of 11 on 2 cores)
    s = start_server(tiny_model_path, tmp_path, "--session-ttl", "3")
    try:
        sid = s.request("POST", "/v1/sessions", {"tokens": [1, 2]})[1]["session_id"]
        assert s.request("GET", f"/v1/sessions/{sid}")[0] == 200
        time.sleep(6.0)  # idle for two TTLs (a request would touch it); the sweeper runs every TTL / 4
        assert s.request("GET", f"/v1/sessions/{sid}")[0] == 404
        assert s.metrics()["session_evicted_total[('reason', 'ttl')]"] == 1
    finally:
        stop_server(s)


def test_an_api_key_is_required_when_given(tiny_model_path, tmp_path):
    s = start_server(tiny_model_path, tmp_path, env={"LLAMA_OPT_SERVE_API_KEY": "sesame"})
    try:
        with pytest.raises(openai.AuthenticationError):
            s.client(api_key="wrong").completions.create(model="m", prompt="x", max_tokens=1)
        assert s.client(api_key="sesame").completions.create(model="m", prompt="x", max_tokens=1).usage
        assert s.request("POST", "/v1/sessions", {}, headers={"x-api-key": "sesame"})[0] == 201
        assert s.request("POST", "/v1/sessions", {})[0] == 401
    finally:
        stop_server(s)


def test_binding_beyond_loopback_needs_an_api_key(tiny_model_path, tmp_path):
    result = subprocess.run([sys.executable, "-m", "pyllamaopt.cli", "serve", "--model", str(tiny_model_path),
                             "--host", "0.0.0.0", "--port", str(free_port())],
                            cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "--api-key" in result.stderr


@pytest.mark.parametrize("option", ["--port", "--grpc-port"])
def test_a_port_in_use_is_a_message_that_names_the_option(tiny_model_path, tmp_path, option):
    """Another program on the port: one line that says what to change, before the model loads (the
    gRPC port's was a stack trace from the web framework's startup; the HTTP port's uvicorn's own)."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        busy = held.getsockname()[1]
        ports = {"--port": busy, "--grpc-port": free_port()} if option == "--port" else {"--port": free_port(),
                                                                                          "--grpc-port": busy}
        result = subprocess.run([sys.executable, "-m", "pyllamaopt.cli", "serve", "--model", str(tiny_model_path),
                                 *(x for o, p in ports.items() for x in (o, str(p)))],
                                cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip() == (f"pyllamaopt serve: cannot listen on 127.0.0.1:{busy} (Address already in use): "
                                     f"another program listens there: stop it, or choose another port with {option}")


def test_ctrl_c_stops_the_server_cleanly_with_exit_code_0(tiny_model_path, tmp_path):
    """uvicorn re-raises the SIGINT it handled once it has shut down: the CLI said "interrupted" and
    exited 130 after a clean stop."""
    s = start_server(tiny_model_path, tmp_path)
    s.process.send_signal(signal.SIGINT)
    assert s.process.wait(timeout=60) == 0
    log = s.log.read_text()
    assert "pyllamaopt serve: stopped" in log and "interrupted" not in log


def test_a_second_server_cannot_share_the_grpc_port_and_the_first_says_where_it_listens(tiny_model_path, tmp_path):
    """gRPC turns SO_REUSEPORT on: a second server on the same --grpc-port started silently, and calls
    reached either model at random. And a server says once it listens, where."""
    grpc_port = free_port()
    first = start_server(tiny_model_path, tmp_path, "--grpc-port", str(grpc_port))
    try:
        port = first.url.rsplit(":", 1)[1]
        assert (f"pyllamaopt serve: tiny-llama on http://127.0.0.1:{port}, gRPC on 127.0.0.1:{grpc_port} (n_ctx "
                in first.log.read_text())
        second = subprocess.run([sys.executable, "-m", "pyllamaopt.cli", "serve", "--model", str(tiny_model_path),
                                 "--port", str(free_port()), "--grpc-port", str(grpc_port)],
                                cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert second.returncode == 1 and "with --grpc-port" in second.stderr
    finally:
        stop_server(first)


@pytest.mark.parametrize("spec_version", ["2.4", "2.3"])
def test_a_stream_whose_client_left_is_closed_at_once_down_to_the_generation(spec_version):
    """A client that leaves while the server sends (undici's abort, at ASGI 2.4 seen only by the
    failing send) must close the chain of event generators at once, not when the garbage collector
    finds it: the innermost one's cleanup ends the session's generation (it stayed 'generating')."""
    import gc

    from pyllamaopt.serve.streaming import sse

    closed = []

    async def generation() -> Any:
        try:
            for i in range(100):
                yield TokenEvent(i, "x")
                await asyncio.sleep(0)
        finally:
            closed.append(True)

    async def scenario() -> None:
        sent = []

        async def send(message: dict) -> None:
            if len(sent) == 3:
                raise OSError("the client left")
            sent.append(message)

        async def receive() -> dict:
            await asyncio.sleep(3600)
            return {"type": "http.disconnect"}

        response = sse(generation(), lambda e: [{"token": e.id}], lambda exc: {})
        scope = {"type": "http", "asgi": {"spec_version": spec_version}}
        with contextlib.suppress(Exception):
            await response(scope, receive, send)
        await asyncio.sleep(0)  # (a close the event loop runs next counts; the end of asyncio.run would not)
        assert closed == [True], "the generation was left open"

    gc.disable()
    try:
        asyncio.run(scenario())
    finally:
        gc.enable()
