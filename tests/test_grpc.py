"""The session protocol over gRPC: `pyllamaopt serve --grpc-port` as a real process on loopback
ports, driven by pyllamaopt.client (the real grpcio client, sync and asyncio flavours): INV-3
through the SDK, cancellation, TTL eviction, every status code mapped to its exception, API keys;
and the committed stubs are what grpcio-tools generates from the .proto."""
from __future__ import annotations

import asyncio
import base64
import filecmp
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from pyllamaopt import (AuthenticationError, Context, ContextOverflowError, GrammarError, InvalidArgumentError,
                        InvalidTokenError, InvariantViolationError, OptConfig, ServerOverloadedError,
                        SessionBusyError, SessionClosedError)
from pyllamaopt.client import AsyncClient, Client, SessionInfo, Usage
from pyllamaopt.serve import grpc_service
from pyllamaopt.serve.metrics import Metrics
from pyllamaopt.serve.scheduler import Scheduler
from pyllamaopt.serve.service import Service

from test_serve import LONG_PROMPT, N_CTX, Server, free_port, local_greedy, start_server, stop_server

ROOT = Path(__file__).resolve().parent.parent
# A generation that does not end by itself (the grammar allows no end of text) and takes about 5 ms a
# token on the tiny model: SLOW_TOKENS of it last about a second, long enough to cancel it or to find
# its session busy (a fast one, 34 tokens in 8 ms, would be over first).
SLOW = "root ::= [a-z] root"
SLOW_TOKENS = 250


def grpc_server(model: Path, tmp_path: Path, *args: str) -> tuple[Server, str]:
    port = free_port()
    return start_server(model, tmp_path, "--grpc-port", str(port), *args), f"127.0.0.1:{port}"


@pytest.fixture(scope="module")
def served(tiny_model_path, tmp_path_factory) -> Iterator[tuple[Server, str]]:
    server, address = grpc_server(tiny_model_path, tmp_path_factory.mktemp("grpc"), "--max-sessions", "3")
    yield server, address
    stop_server(server)


@pytest.fixture
def client(served) -> Iterator[Client]:
    with Client(served[1], timeout=60) as c:
        yield c


def test_stubs_are_current(tmp_path):
    """The committed pyllamaopt/v1/*_pb2*.py are what grpcio-tools makes of the .proto (regenerate:
    pyllamaopt/v1/__init__.py says how)."""
    grpc_tools = pytest.importorskip("grpc_tools")
    del grpc_tools
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-Iproto", f"--python_out={tmp_path}",
                    f"--pyi_out={tmp_path}", f"--grpc_python_out={tmp_path}", "proto/pyllamaopt/v1/runtime.proto"],
                   cwd=ROOT, check=True)
    names = ["runtime_pb2.py", "runtime_pb2.pyi", "runtime_pb2_grpc.py"]
    _, mismatch, errors = filecmp.cmpfiles(tmp_path / "pyllamaopt" / "v1", ROOT / "pyllamaopt" / "v1", names, shallow=False)
    assert not mismatch and not errors, f"stale generated stubs: {mismatch + errors}; regenerate them"


def test_inv3_through_the_sdk(served, client, tiny_model):
    """INV-3: a history given as initial tokens, as one append, or as many appends generates the
    same tokens, the library's own answer."""
    prompt = LONG_PROMPT
    expected = local_greedy(tiny_model, prompt, 12)
    with client.create_session(tokens=prompt) as initial, client.create_session() as one, \
            client.create_session() as many:
        one.append(prompt)
        for i in range(0, len(prompt), 37):
            many.append(prompt[i:i + 37])
        answers = []
        for session in (initial, one, many):
            assert session.tokens == prompt
            generation = session.generate(12)
            answers.append([t.id for t in generation])
            assert generation.finish_reason == "length" and generation.tokens == answers[-1]
            assert generation.usage is not None and generation.usage.completion_tokens == 12
    assert answers == [expected] * 3


def test_inv3_through_the_async_sdk(served, tiny_model):
    prompt = LONG_PROMPT[:150]
    expected = local_greedy(tiny_model, prompt, 8)

    async def scenario() -> list[list[int]]:
        async with AsyncClient(served[1], timeout=60) as c:
            answers = []
            for how in ("initial", "one", "many"):
                async with await c.create_session(tokens=prompt if how == "initial" else []) as session:
                    if how == "one":
                        await session.append(prompt)
                    elif how == "many":
                        for i in range(0, len(prompt), 50):
                            await session.append(prompt[i:i + 50])
                    assert (await session.info()).tokens == prompt
                    answers.append([t.id async for t in session.generate(8)])
            return answers

    assert asyncio.run(scenario()) == [expected] * 3


def test_sync_fork_text_and_stop(client, tiny_model):
    with client.create_session(tokens=LONG_PROMPT[:100]) as session:
        session.sync(LONG_PROMPT[:70] + [3, 4])
        info = session.info()
        assert info.tokens == LONG_PROMPT[:70] + [3, 4] and info.busy is None and info.kv_bytes > 0
        with session.fork() as forked:
            assert forked.id != session.id and forked.tokens == info.tokens
            forked.append([5])
            assert session.n_tokens == 72 and forked.n_tokens == 73
        with Context(tiny_model, n_ctx=N_CTX, n_threads=2) as ctx, ctx.session() as local:
            local.append(LONG_PROMPT[:70] + [3, 4])
            assert session.generate_text(6) == local.generate_text(6)


def test_cancel_mid_stream_keeps_the_session_usable(client, tiny_model):
    """CANCELLED end to end: leaving a generation cancels the call; the server stops generating
    (between two steps) and the session takes the next call, its history as before the generation."""
    prompt = LONG_PROMPT[:40]
    with client.create_session(tokens=prompt) as session:
        with session.generate(SLOW_TOKENS, grammar=SLOW) as generation:
            first = [next(generation).id for _ in range(3)]
        assert generation.finish_reason == "interrupted"
        deadline = time.monotonic() + 10
        while (info := session.info()).busy is not None:
            assert time.monotonic() < deadline, "the generation did not stop after the cancel"
            time.sleep(0.05)
        generated = info.stats["tokens_generated"]
        assert 3 <= generated < SLOW_TOKENS // 2, f"it did not stop early: {generated} tokens"
        time.sleep(0.3)
        assert session.info().stats["tokens_generated"] == generated, "it kept generating"
        history = session.tokens  # what was generated before the cancel took effect stays, as in-process
        assert history[:len(prompt)] == prompt and len(history) == len(prompt) + generated
        assert [t.id for t in session.generate(3)] == local_greedy(tiny_model, history, 3)


def test_cancel_mid_stream_async(served, tiny_model):
    prompt = LONG_PROMPT[:40]

    async def scenario() -> tuple[list[int], list[int], list[int]]:
        async with AsyncClient(served[1], timeout=60) as c, await c.create_session(tokens=prompt) as session:
            async with session.generate(SLOW_TOKENS, grammar=SLOW) as generation:
                first = [(await generation.__anext__()).id for _ in range(2)]
            deadline = time.monotonic() + 10
            while (info := await session.info()).busy is not None:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            assert info.stats["tokens_generated"] < SLOW_TOKENS // 2, "it did not stop early"
            return first, info.tokens, [t.id async for t in session.generate(2)]

    first, history, again = asyncio.run(scenario())
    assert history[:len(prompt) + 2] == prompt + first
    assert again == local_greedy(tiny_model, history, 2)


def held_generation(info: Callable[[], SessionInfo]) -> SessionInfo:
    """The session's info once its generation has gone nowhere for a second (its reader does not
    read), or has ended (within 10 s)."""
    generated, stable = -1, 0.0
    while stable < 1.0:
        held = info()
        if held.busy is None:
            break
        if held.stats["tokens_generated"] != generated:
            generated, stable = held.stats["tokens_generated"], 0.0
        time.sleep(0.1)
        stable += 0.1
    return held


def test_a_reader_that_pauses_holds_its_generation(client):
    """A client that reads one token of a 250-token generation, then stops reading without
    cancelling (a slow consumer, or a process the machine does not run for a while): the server's
    generation waits within the generations' channel's 512-byte HTTP/2 window (about 25 token
    messages, and the 16 tokens the server runs ahead); grpc core's defaults (a 64 KiB window,
    grown to megabytes by its bandwidth-delay probe) let it compute the whole answer unread. Read
    again, it goes on to its end."""
    with client.create_session(tokens=LONG_PROMPT[:40]) as session:
        generation = session.generate(SLOW_TOKENS, grammar=SLOW)
        next(generation)
        held = held_generation(session.info)
        assert held.busy == "generating", f"the generation did not wait for its reader: {held.stats}"
        assert held.stats["tokens_generated"] < SLOW_TOKENS // 2, f"{held.stats['tokens_generated']} tokens"
        assert len(list(generation)) == SLOW_TOKENS - 1 and generation.finish_reason == "length"


def test_a_reader_that_pauses_holds_its_generation_async(served):
    async def scenario() -> tuple[SessionInfo, int, str | None]:
        async with AsyncClient(served[1], timeout=60) as c, await c.create_session(tokens=LONG_PROMPT[:40]) as session:
            generation = session.generate(SLOW_TOKENS, grammar=SLOW)
            await generation.__anext__()
            loop = asyncio.get_running_loop()
            held = await asyncio.to_thread(held_generation, lambda: asyncio.run_coroutine_threadsafe(
                session.info(), loop).result())
            rest = [t async for t in generation]
            return held, len(rest), generation.finish_reason

    held, rest, finish_reason = asyncio.run(scenario())
    assert held.busy == "generating" and held.stats["tokens_generated"] < SLOW_TOKENS // 2, held.stats
    assert (rest, finish_reason) == (SLOW_TOKENS - 1, "length")


def test_every_status_code_is_its_exception(client):
    def code(exc_info: pytest.ExceptionInfo) -> str:
        return exc_info.value.code  # type: ignore[no-any-return]

    # NOT_FOUND: never created, closed
    with pytest.raises(SessionClosedError) as e:
        client.session("no-such-session").info()
    assert code(e) == "NOT_FOUND"
    closed = client.create_session([1, 2])
    closed.close()
    with pytest.raises(SessionClosedError):
        client.session(closed.id).append([3])
    with pytest.raises(SessionClosedError):
        list(client.session(closed.id).generate(2))
    with client.create_session() as empty:  # nothing to generate after (it was UNKNOWN)
        with pytest.raises(InvalidArgumentError, match="no history") as e:
            list(empty.generate(2))
        assert code(e) == "INVALID_ARGUMENT"

    with client.create_session(tokens=LONG_PROMPT[:40]) as session:
        # INVALID_ARGUMENT: a token outside the vocabulary, a bad sampling value, a bad schema; the session unchanged
        with pytest.raises(InvalidTokenError) as e:
            session.append([5, 10**7])
        assert code(e) == "INVALID_ARGUMENT"
        with pytest.raises(InvalidArgumentError, match="temperature"):
            list(session.generate(2, temperature=-1))
        with pytest.raises(InvalidArgumentError, match="max_tokens"):
            list(session.generate(-1))
        with pytest.raises(GrammarError) as e:
            list(session.generate(2, json_schema={"type": 5}))
        assert code(e) == "INVALID_ARGUMENT"
        with pytest.raises(GrammarError):
            list(session.generate(2, grammar="root ::= ("))
        assert session.tokens == LONG_PROMPT[:40]

        # RESOURCE_EXHAUSTED: a history longer than the context
        with pytest.raises(ContextOverflowError) as e:
            session.append([7] * N_CTX)
        assert code(e) == "RESOURCE_EXHAUSTED"
        with pytest.raises(ContextOverflowError):
            client.create_session([7] * (N_CTX + 1))

        # ABORTED: a generation in progress on the session. A stream's reader that stalls does not
        # pause it over gRPC (HTTP/2 buffers far more than 16 tokens): a grammar that never ends
        # keeps each generation going for about a second (5 ms a token), 250 tokens of KV each.
        slow = {"grammar": SLOW}
        with session.generate(SLOW_TOKENS, **slow) as running:
            next(running)
            with pytest.raises(SessionBusyError) as e:
                session.append([5])
            assert code(e) == "ABORTED"
            with pytest.raises(SessionBusyError):
                list(session.generate(2))
            # RESOURCE_EXHAUSTED: every session slot (--max-sessions 3) taken by a busy session
            with client.create_session(LONG_PROMPT[:40]) as second, client.create_session(LONG_PROMPT[:40]) as third:
                with second.generate(SLOW_TOKENS, **slow) as g2, third.generate(SLOW_TOKENS, **slow) as g3:
                    next(g2), next(g3)
                    with pytest.raises(ServerOverloadedError) as e:
                        client.create_session([3])
                    assert code(e) == "RESOURCE_EXHAUSTED"


def test_logit_bias_and_penalties_over_grpc_answer_what_http_and_the_library_answer(served, client, tiny_model):
    """GenerateRequest's logit_bias and penalties: a biased-out token never appears (greedy and
    sampled), the penalties change the text as over HTTP (the same text as /v1/completions and the
    library), both SDK flavours; a bad value is INVALID_ARGUMENT naming the field."""
    prompt = LONG_PROMPT[:90]
    with client.create_session(tokens=prompt) as session:
        plain = [t.id for t in session.generate(16)]
        banned = sorted(set(plain[:6]))
        bias = {t: -100.0 for t in banned}
        for sampling in ({}, {"temperature": 1.5, "seed": 3}, {"temperature": 1.5, "seed": 4}):
            session.sync(prompt)
            biased = [t.id for t in session.generate(16, logit_bias=bias, **sampling)]
            assert not set(biased) & set(banned)
            assert biased == _local(tiny_model, prompt, 16, logit_bias=bias, **sampling)
        penalties = {"frequency_penalty": 1.5, "presence_penalty": 0.5, "repeat_penalty": 1.25, "repeat_last_n": 32}
        expected = _local(tiny_model, prompt, 24, **penalties)
        assert expected != _local(tiny_model, prompt, 24)
        session.sync(prompt)
        assert session.generate_text(24, **penalties) == tiny_model.detokenize(expected)
        http = served[0].client().completions.create(model="m", prompt=prompt, max_tokens=24,
                                                     extra_body=penalties).choices[0].text
        session.sync(prompt)
        assert session.generate_text(24, **penalties) == http

        async def from_async() -> list[int]:
            async with AsyncClient(served[1], timeout=60) as c:
                remote = c.session(session.id)
                await remote.sync(prompt)
                return [t.id async for t in remote.generate(24, logit_bias=bias, **penalties)]

        assert asyncio.run(from_async()) == _local(tiny_model, prompt, 24, logit_bias=bias, **penalties)
        for fields, named in [({"frequency_penalty": 2.5}, "frequency_penalty"),
                              ({"presence_penalty": -3.0}, "presence_penalty"),
                              ({"repeat_penalty": 0.0}, "repeat_penalty"), ({"repeat_last_n": -1}, "repeat_last_n"),
                              ({"logit_bias": {5: 101.0}}, "logit_bias"), ({"logit_bias": {-5: 1.0}}, "logit_bias"),
                              ({"logit_bias": {10**6: -100.0}}, "logit_bias: token 1000000")]:
            with pytest.raises(InvalidArgumentError, match=named) as e:
                list(session.generate(2, **fields))
            assert e.value.code == "INVALID_ARGUMENT"  # type: ignore[attr-defined]
        assert session.tokens[:len(prompt)] == prompt


def _local(tiny_model, prompt: list[int], max_tokens: int, **sampling: object) -> list[int]:
    with Context(tiny_model, n_ctx=N_CTX, n_threads=2) as ctx, ctx.session() as s:
        s.append(prompt)
        return [t.id for t in s.generate(max_tokens, **sampling)]  # type: ignore[arg-type]


def test_invariant_violation_is_failed_precondition(tiny_model, tmp_path):
    """003 §2.8 through gRPC: KV removed behind a session's back (the test hook of test_serve) is
    found by the next operation; FAILED_PRECONDITION, InvariantViolationError, the session gone.
    The server runs in this process (the hook needs its Context), the client is the real one."""
    async def scenario() -> None:
        config = OptConfig(env={})
        with Context(tiny_model, n_ctx=N_CTX, n_threads=2, config=config) as ctx:
            scheduler = Scheduler()
            service = Service(ctx, scheduler, Metrics(), max_sessions=2, session_ttl=60)
            port = free_port()
            server = await grpc_service.start(service, "127.0.0.1", port, None)
            try:
                async with AsyncClient(f"127.0.0.1:{port}", timeout=60) as c:
                    session = await c.create_session(LONG_PROMPT)
                    ctx._core._test_kv_remove(service._sessions[session.id].session._core.seq, 64, 128)
                    with pytest.raises(InvariantViolationError, match="inv1") as e:
                        await session.append([5])
                    assert e.value.code == "FAILED_PRECONDITION"  # type: ignore[attr-defined]
                    with pytest.raises(SessionClosedError):
                        await session.info()
            finally:
                await server.stop(None)
                scheduler.stop()

    asyncio.run(scenario())


def test_ttl_eviction_and_api_key(tiny_model_path, tmp_path):
    """NOT_FOUND after the TTL; with --api-key, UNAUTHENTICATED without it (both flavours)."""
    server, address = grpc_server(tiny_model_path, tmp_path, "--session-ttl", "3", "--api-key", "sekret")
    try:
        with Client(address, timeout=60) as anonymous:
            with pytest.raises(AuthenticationError) as e:
                anonymous.create_session([1])
            assert e.value.code == "UNAUTHENTICATED"  # type: ignore[attr-defined]
        with Client(address, api_key="wrong", timeout=60) as wrong:
            with pytest.raises(AuthenticationError):
                list(wrong.session("x").generate(1))

        async def async_unauthenticated() -> None:
            async with AsyncClient(address, timeout=60) as c:
                with pytest.raises(AuthenticationError):
                    await c.create_session([1])

        asyncio.run(async_unauthenticated())
        with Client(address, api_key="sekret", timeout=60) as c:
            session = c.create_session([1, 2, 3])
            assert session.n_tokens == 3
            time.sleep(5.0)  # idle beyond the TTL; the sweeper runs every TTL/4 (a 1 s TTL was outlasted under load)
            with pytest.raises(SessionClosedError) as e:
                session.info()
            assert e.value.code == "NOT_FOUND"  # type: ignore[attr-defined]
            session.close()  # closing what is gone is not an error
    finally:
        stop_server(server)


def test_server_overloaded_through_grpc(tiny_model_path, tmp_path):
    """RESOURCE_EXHAUSTED from a KV cache full of a generation in progress (the 503 over HTTP):
    ServerOverloadedError, not ContextOverflowError (the history fits the context); once the
    generation is cancelled, the same session is created."""
    server, address = grpc_server(tiny_model_path, tmp_path, "--n-ctx", "256")
    try:
        with Client(address, timeout=60) as c, c.create_session(LONG_PROMPT[:100]) as running:
            with running.generate(SLOW_TOKENS, grammar=SLOW) as generation:
                next(generation)  # 100 + its tokens of the 256 cells are held until it ends
                with pytest.raises(ServerOverloadedError, match="generations in progress") as e:
                    c.create_session(list(range(300, 460)))
                assert e.value.code == "RESOURCE_EXHAUSTED"  # type: ignore[attr-defined]
                with pytest.raises(ContextOverflowError):  # too long for any cache: the other error
                    c.create_session([7] * 300)
            deadline = time.monotonic() + 10
            while running.info().busy is not None:  # the server stops it between two steps
                assert time.monotonic() < deadline
                time.sleep(0.05)
            with c.create_session(list(range(300, 460))) as other:  # the cancelled one is idle: evicted for room
                assert other.n_tokens == 160
            with pytest.raises(SessionClosedError):
                running.info()
    finally:
        stop_server(server)


def test_tokenize(served, client, tiny_model):
    """Tokenize (gRPC, HTTP and both clients) is the model's tokenizer: the same ids as Model.tokenize."""
    text = "hello world <s> the capital of france"
    assert client.tokenize(text) == tiny_model.tokenize(text, add_bos=False)
    assert client.tokenize(text, add_bos=True, special=True) == tiny_model.tokenize(text, add_bos=True, special=True)
    assert client.tokenize("") == []
    status, body = served[0].request("POST", "/v1/tokenize", {"text": text, "special": True})
    assert status == 200 and body["tokens"] == tiny_model.tokenize(text, add_bos=False, special=True)
    status, body = served[0].request("POST", "/v1/tokenize", {"tokens": [1]})
    assert status == 400 and "text" in body["error"]["message"]

    async def from_async() -> list[int]:
        async with AsyncClient(served[1], timeout=60) as c:
            return await c.tokenize(text, add_bos=True)

    assert asyncio.run(from_async()) == tiny_model.tokenize(text, add_bos=True)


def test_the_client_needs_no_engine(served):
    """pyllamaopt.client on a machine without the compiled engine: importing it, the whole protocol
    and its errors work with pyllamaopt._core (llama.cpp) unimportable, and nothing loaded it."""
    script = """
import sys
sys.modules["pyllamaopt._core"] = None  # any import of the engine now fails
from pyllamaopt import SessionClosedError
from pyllamaopt.client import Client
with Client(sys.argv[1], timeout=60) as client:
    prompt = client.tokenize("hello world", add_bos=True)
    with client.create_session(prompt) as session:
        session.append(client.tokenize(" the"))
        generated = [t.id for t in session.generate(4)]
        assert len(generated) == 4 and session.tokens[-4:] == generated
    try:
        session.info()
        raise AssertionError("a closed session answered")
    except SessionClosedError:
        pass
engine = [m for m in sys.modules if m in ("pyllamaopt._core", "pyllamaopt.model", "pyllamaopt.context", "pyllamaopt.session")]
assert engine == ["pyllamaopt._core"] and sys.modules["pyllamaopt._core"] is None, engine
print("ok")
"""
    run = subprocess.run([sys.executable, "-c", script, served[1]], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stdout + run.stderr


def test_raw_stub_status_codes(served):
    """Without the SDK: what any gRPC client sees (the status code and the metadata naming the error)."""
    from pyllamaopt.v1 import runtime_pb2 as pb
    from pyllamaopt.v1 import runtime_pb2_grpc

    with grpc.insecure_channel(served[1]) as channel:
        stub = runtime_pb2_grpc.RuntimeStub(channel)
        with pytest.raises(grpc.RpcError) as e:
            stub.GetSessionInfo(pb.GetSessionInfoRequest(session_id="nope"), timeout=30)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        assert dict(e.value.trailing_metadata())["pyllamaopt-error"] == "SessionClosedError"
        with pytest.raises(grpc.RpcError) as e:
            stub.CreateSession(pb.CreateSessionRequest(tokens=[10**7]), timeout=30)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        sid = stub.CreateSession(pb.CreateSessionRequest(tokens=[1, 2, 3]), timeout=30).session_id
        events = list(stub.Generate(pb.GenerateRequest(session_id=sid, max_tokens=2), timeout=30))
        assert [e.WhichOneof("event") for e in events] == ["token", "token", "done"]
        assert events[-1].done.usage.completion_tokens == 2
        stub.CloseSession(pb.CloseSessionRequest(session_id=sid), timeout=30)



def test_chat_tokens_helper(tiny_model):
    """The opt-in helper: a transformers-like tokenizer's own template; a pyllamaopt model's GGUF
    template (the synthetic model has none: the error says so; the Gemma path is the chat
    routes' own, tests/integration)."""
    from pyllamaopt import ChatTemplateError
    from pyllamaopt.client import chat_tokens

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]

    class HFLike:
        def apply_chat_template(self, messages: list, tokenize: bool, add_generation_prompt: bool) -> list[int]:
            assert tokenize and add_generation_prompt
            return [len(m["content"]) for m in messages]

    assert chat_tokens(HFLike(), messages) == [9, 2]
    with pytest.raises(ChatTemplateError):
        chat_tokens(tiny_model, messages)


def test_one_service_behind_both_transports(served, client):
    """A session created over HTTP is the same session over gRPC, and the other way round."""
    server, _ = served
    status, body = server.request("POST", "/v1/sessions", {"tokens": [1, 2, 3]})
    assert status == 201
    remote = client.session(body["session_id"])
    remote.append([4])
    assert remote.tokens == [1, 2, 3, 4]
    with client.create_session([5, 6]) as session:
        status, info = server.request("GET", f"/v1/sessions/{session.id}")
        assert status == 200 and info["tokens"] == [5, 6]
    remote.close()
    assert server.request("GET", f"/v1/sessions/{remote.id}")[0] == 404


def test_a_sessions_generation_counts_its_prompt_in_usage(served, client):
    """A protocol session's generation reports as its prompt the whole history it follows, and as
    computed (restored, cached) what was done for it since the session's previous generation: the
    creation's prefill in the first generation's usage (it said 0 prompt tokens, and the creation's
    work showed in no usage), an append's in the next, nothing but the unshared tail in a fork's:
    the usage OpenAI's route gives for a prompt. Through the gRPC client and over HTTP."""
    server, _ = served
    prompt = [7 + (31 * i) % 190 for i in range(150)]  # (its own blocks: no other test's prefix)

    def check(usage: dict[str, int], history: int, stats: dict[str, int], stats_before: dict[str, int]) -> None:
        computed = stats["tokens_prefilled"] - stats_before.get("tokens_prefilled", 0)
        assert usage["prompt_tokens"] == history and usage["computed_tokens"] == computed, (usage, computed)
        assert usage["cached_tokens"] == history - computed and usage["restored_tokens"] == 0, usage

    def fields(usage: Usage | None) -> dict[str, int]:
        assert usage is not None
        return {name: getattr(usage, name) for name in ("prompt_tokens", "computed_tokens", "cached_tokens",
                                                        "restored_tokens")}

    with client.create_session(tokens=prompt) as session:
        first = session.generate(4)
        assert len(list(first)) == 4
        after_first = session.info().stats
        assert after_first["tokens_prefilled"] >= len(prompt) - 64  # (the creation computed the prompt)
        check(fields(first.usage), len(prompt), after_first, {})
        session.append([5, 6, 7])
        second = session.generate(4)
        list(second)
        after_second = session.info().stats
        check(fields(second.usage), len(prompt) + 7, after_second, after_first)
        assert 0 < fields(second.usage)["computed_tokens"] < len(prompt)  # the blocks of the first turn were kept
        with session.fork() as forked:
            at_fork = forked.info().stats
            third = forked.generate(2)
            list(third)
            check(fields(third.usage), len(prompt) + 11, forked.info().stats, at_fork)

    session_id = server.request("POST", "/v1/sessions", {"tokens": [9] + prompt})[1]["session_id"]
    usage = server.request("POST", f"/v1/sessions/{session_id}/generate", {"max_tokens": 3})[1]["usage"]
    info = server.request("GET", f"/v1/sessions/{session_id}")[1]
    check(usage, len(prompt) + 1, info["stats"], {})
    assert usage["computed_tokens"] > 0
    assert server.request("DELETE", f"/v1/sessions/{session_id}")[0] == 204


TYPESCRIPT = ROOT / "sdks" / "typescript"


def test_typescript_sdk(served, tiny_model_path, tmp_path):
    """sdks/typescript's own tests (node --test), each over HTTP/JSON and over gRPC, against this module's
    server, one with a short --session-ttl (3 s) and one with an API key."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not on PATH: the TypeScript SDK's tests need Node 20+")
    short_ttl, short_ttl_grpc = grpc_server(tiny_model_path, tmp_path, "--session-ttl", "3")
    keyed, keyed_grpc = grpc_server(tiny_model_path, tmp_path, "--api-key", "sesame")
    try:
        run = subprocess.run([node, "--test", "test/"], cwd=TYPESCRIPT, capture_output=True, text=True, timeout=300,
                             env={**os.environ, "PYLLAMAOPT_URL": served[0].url, "PYLLAMAOPT_GRPC_URL": served[1],
                                  "PYLLAMAOPT_TTL_URL": short_ttl.url, "PYLLAMAOPT_TTL_GRPC_URL": short_ttl_grpc,
                                  "PYLLAMAOPT_KEY_URL": keyed.url, "PYLLAMAOPT_KEY_GRPC_URL": keyed_grpc})
    finally:
        stop_server(short_ttl)
        stop_server(keyed)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "# pass 22" in run.stdout, run.stdout  # every test ran: 9 over each transport, 4 more


# Node's side of test_typescript_protobuf_...: the message descriptions of sdks/typescript/src/protobuf.js,
# and the bytes it encodes and the values it decodes for the JSON on stdin
NODE_PROTOBUF = """
import { MESSAGES, decode, encode } from "./src/protobuf.js";
let input = "";
for await (const chunk of process.stdin) input += chunk;
const { encodeThese, decodeThese } = JSON.parse(input);
const described = (type) => typeof type === "object" ? type.name : type;
console.log(JSON.stringify({
  messages: Object.fromEntries(Object.values(MESSAGES).map((m) => [m.name, m.fields.map((f) =>
    ({ no: f.no, name: f.name, type: described(f.type), repeated: !!f.repeated, optional: !!f.optional }))])),
  encoded: encodeThese.map(([type, value]) => Buffer.from(encode(MESSAGES[type], value)).toString("base64")),
  decoded: decodeThese.map(([type, bytes]) => decode(MESSAGES[type], Buffer.from(bytes, "base64"))),
}));
"""


def test_typescript_protobuf_matches_the_proto_and_pythons_protobuf():
    """The TypeScript SDK's own protobuf codec (no npm here: no protobufjs) describes every message of
    runtime.proto as its compiled descriptors do, and its bytes are the protobuf library's both ways:
    negative and 64-bit integers, floats, optional fields set to 0, oneofs, maps, packed repeats, UTF-8."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not on PATH")
    from google.protobuf.descriptor import FieldDescriptor as F

    from pyllamaopt.v1 import runtime_pb2 as pb

    scalar = {F.TYPE_INT32: "int32", F.TYPE_INT64: "int64", F.TYPE_BOOL: "bool", F.TYPE_STRING: "string",
              F.TYPE_FLOAT: "float"}

    def described(field: F) -> dict[str, object]:
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            key, value = field.message_type.fields
            kind = f"map<{scalar[key.type]},{scalar[value.type]}>"
        else:
            kind = field.message_type.name if field.message_type is not None else scalar[field.type]
        return {"no": field.number, "name": field.name, "type": kind,
                "repeated": field.is_repeated and not kind.startswith("map<"),
                "optional": field.containing_oneof is not None}  # proto3 optional, or a oneof member

    requests = [
        pb.CreateSessionRequest(tokens=[0, 1, 262143, -2, 2**31 - 1]),
        pb.AppendTokensRequest(session_id="s-1", tokens=[5]),
        pb.SyncRequest(session_id="s-2"),
        pb.TokenizeRequest(text="héllo ✓ <start_of_turn>", add_bos=True, special=False),
        pb.GenerateRequest(session_id="g", max_tokens=0, temperature=0.5, top_k=40, seed=2**32 - 2, stop=["\n", "é"],
                           json_schema='{"type": "object"}'),
        pb.GenerateRequest(session_id="g", top_p=0.0, min_p=0.25, grammar='root ::= "a"'),
        pb.GenerateRequest(session_id="b", logit_bias={19556: -100.0}, frequency_penalty=0.0, presence_penalty=-1.5,
                           repeat_penalty=1.25, repeat_last_n=0),
        pb.CloseSessionRequest(session_id="x"),
    ]
    answers = [
        pb.SessionInfo(session_id="s", n_tokens=3, tokens=[7, -1, 300], kv_bytes=2**40 + 3, approx_from=0,
                       generating=True, busy="generating", stats={"tokens_prefilled": 12, "big": 2**50}),
        pb.SessionInfo(session_id="t"),
        pb.GenerateResponse(token=pb.Token(id=262143, text="✓")),
        pb.GenerateResponse(token=pb.Token(id=1, text="\ufeffhi")),  # a leading U+FEFF is text, not a BOM
        pb.GenerateResponse(done=pb.Done(finish_reason="stop", usage=pb.Usage(prompt_tokens=3, approximate=True),
                                         stop_string="")),
        pb.GenerateResponse(done=pb.Done(finish_reason="length")),
        pb.TokenizeResponse(tokens=[2, 651]),
        pb.CloseSessionResponse(),
    ]

    def as_js(message) -> dict[str, object]:
        """A message as protobuf.js decodes it: every field, unset ones at their default (null where present)."""
        out: dict[str, object] = {}
        for field in message.DESCRIPTOR.fields:
            value = getattr(message, field.name)
            if field.message_type is not None and field.message_type.GetOptions().map_entry:
                out[field.name] = dict(value)
            elif field.is_repeated:
                out[field.name] = list(value)
            elif field.has_presence and not message.HasField(field.name):
                out[field.name] = None
            elif field.message_type is not None:
                out[field.name] = as_js(value)
            else:
                out[field.name] = value
        return out

    def js_value(message) -> dict[str, object]:
        return {k: v for k, v in as_js(message).items() if v is not None}

    stdin = json.dumps({"encodeThese": [[m.DESCRIPTOR.name, js_value(m)] for m in requests],
                        "decodeThese": [[m.DESCRIPTOR.name, base64.b64encode(m.SerializeToString()).decode()]
                                        for m in answers]})
    run = subprocess.run([node, "--input-type=module", "-e", NODE_PROTOBUF], cwd=TYPESCRIPT, input=stdin,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)

    expected = {m.name: [described(f) for f in m.fields] for m in pb.DESCRIPTOR.message_types_by_name.values()}
    assert out["messages"] == expected
    for message, encoded in zip(requests, out["encoded"], strict=True):
        parsed = type(message).FromString(base64.b64decode(encoded))
        assert parsed == message, f"{message.DESCRIPTOR.name}: {parsed} != {message}"
        assert base64.b64decode(encoded) == message.SerializeToString()  # the same bytes, field for field
    for message, decoded in zip(answers, out["decoded"], strict=True):
        want = as_js(message)
        for name, value in want.items():  # floats come back as float32, as sent
            if isinstance(value, float):
                want[name] = pytest.approx(value, rel=1e-7)
        assert decoded == want, message.DESCRIPTOR.name


def test_typescript_sdk_types():
    """The JSDoc types check (tsc --checkJs, strict) where a TypeScript compiler is installed
    (Debian: apt-get install node-typescript)."""
    tsc = shutil.which("tsc")
    if tsc is None:
        pytest.skip("no tsc on PATH (apt-get install node-typescript)")
    run = subprocess.run([tsc, "-p", "jsconfig.json"], cwd=TYPESCRIPT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr


def test_grpc_port_must_differ_from_the_http_port():
    from pyllamaopt.serve import ServeSettings

    with pytest.raises(SystemExit, match="--grpc-port"):
        ServeSettings(port=8080, grpc_port=8080).check()
    ServeSettings(port=8080, grpc_port=50051).check()
