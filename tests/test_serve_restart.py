"""`pyllamaopt serve` restarted on its disk tier (LLAMA_OPT_PERSIST_ENABLED=1): real server processes
on one directory, driven by the real openai, anthropic and grpcio clients. A prompt the first server
computed is restored by the second and reported as cached in every surface's usage, streamed and
not, and in the metrics; protocol session ids do not survive, their KV does; entries of another
model or build are ignored and said once."""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path

import anthropic
import grpc
import pytest

from pyllamaopt.client import Client
from pyllamaopt.v1 import runtime_pb2 as pb
from pyllamaopt.v1 import runtime_pb2_grpc
from test_serve import Server, free_port, start_server, stop_server
from tinymodel import CHATML, WORDS, write_tiny_llama

BLOCK = 64


@pytest.fixture
def chat_model(tmp_path) -> Path:
    return write_tiny_llama(tmp_path / "tiny-chatml.gguf", chat_template=CHATML)


def persistent(tmp_path: Path) -> dict[str, str]:
    return {"LLAMA_OPT_PERSIST_ENABLED": "1", "LLAMA_OPT_PERSIST_DIR": str(tmp_path / "kv")}


def system_prompt(k: int, words: int = 150) -> str:
    """A system prompt of several blocks (with 150 words), distinct from its first block on."""
    return f"prompt {k}: " + " ".join(WORDS[(k * 7 + i) % len(WORDS)] for i in range(words))


def answers(server: Server) -> dict[str, tuple[str, dict]]:
    """One request per surface and way (each with its own prompt, so that each restores its own):
    the answer's text and its usage as the surface reports it, streamed and not."""
    out = {}
    client = server.client()
    user = [{"role": "user", "content": "and now?"}]

    def chat(k: int) -> list[dict[str, str]]:
        return [{"role": "system", "content": system_prompt(k)}, *user]

    r = client.chat.completions.create(model="m", messages=chat(0), max_tokens=6)
    out["openai chat"] = r.choices[0].message.content, {
        "prompt": r.usage.prompt_tokens, "cached": r.usage.prompt_tokens_details.cached_tokens,
        "restored": r.model_extra["pyllamaopt"]["restored_tokens"]}

    chunks = list(client.chat.completions.create(model="m", messages=chat(1), max_tokens=6, stream=True,
                                                 stream_options={"include_usage": True}))
    last = chunks[-1]
    out["openai chat streamed"] = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), {
        "prompt": last.usage.prompt_tokens, "cached": last.usage.prompt_tokens_details.cached_tokens,
        "restored": last.model_extra["pyllamaopt"]["restored_tokens"]}

    prompt = server.request("POST", "/v1/tokenize", {"text": system_prompt(2)})[1]["tokens"]
    chunks = list(client.completions.create(model="m", prompt=prompt, max_tokens=6, stream=True,
                                            stream_options={"include_usage": True}))
    last = chunks[-1]
    out["openai completion streamed"] = "".join(c.choices[0].text for c in chunks if c.choices), {
        "prompt": last.usage.prompt_tokens, "cached": last.usage.prompt_tokens_details.cached_tokens,
        "restored": last.model_extra["pyllamaopt"]["restored_tokens"]}

    claude = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    m = claude.messages.create(model="m", max_tokens=6, system=system_prompt(3), messages=user)
    out["anthropic"] = m.content[0].text, {
        "prompt": m.usage.input_tokens + m.usage.cache_read_input_tokens, "cached": m.usage.cache_read_input_tokens,
        "restored": m.model_extra["pyllamaopt"]["restored_tokens"]}

    with claude.messages.stream(model="m", max_tokens=6, system=system_prompt(4), messages=user) as stream:
        events = {e.type: e for e in stream if e.type in ("message_start", "message_delta")}
        final = stream.get_final_message()
    start = events["message_start"].message.usage
    assert (start.input_tokens, start.cache_read_input_tokens) == (final.usage.input_tokens,
                                                                   final.usage.cache_read_input_tokens)
    out["anthropic streamed"] = final.content[0].text, {
        "prompt": start.input_tokens + start.cache_read_input_tokens, "cached": start.cache_read_input_tokens,
        "restored": events["message_delta"].model_extra["pyllamaopt"]["restored_tokens"]}
    return out


def test_restored_tokens_are_cached_tokens_in_every_surface_and_in_the_metrics(chat_model, tmp_path):
    """A first server computes five prompts and stops cleanly (its sessions saved to disk); a second
    server on the same directory restores them: every answer equals the first server's, and its
    usage counts the restored tokens as cached (OpenAI's cached_tokens, Anthropic's
    cache_read_input_tokens, in message_start already: it said 0), as do the metrics."""
    env = persistent(tmp_path)
    first = start_server(chat_model, tmp_path, env=env)
    try:
        cold = answers(first)
    finally:
        stop_server(first)
    assert all(usage["cached"] == usage["restored"] == 0 for _, usage in cold.values()), cold

    second = start_server(chat_model, tmp_path, env=env)
    try:
        warm = answers(second)
        metrics = second.metrics()
    finally:
        stop_server(second)
    for how, (text, usage) in warm.items():
        assert text == cold[how][0], how
        assert usage["prompt"] == cold[how][1]["prompt"], how
        # every complete block below the last chunk (which gives the logits) comes from disk
        assert usage["cached"] == usage["restored"] >= (usage["prompt"] // BLOCK - 1) * BLOCK > 0, (how, usage)
    restored = sum(usage["restored"] for _, usage in warm.values())
    assert metrics["pyllamaopt_prompt_tokens_restored_total"] == restored
    assert metrics["pyllamaopt_prompt_tokens_reused_total"] == restored  # reused: from RAM or from disk


@contextlib.contextmanager
def rpc(address: str) -> Iterator[runtime_pb2_grpc.RuntimeStub]:
    with grpc.insecure_channel(address) as channel:
        yield runtime_pb2_grpc.RuntimeStub(channel)


def test_protocol_session_ids_are_gone_after_a_restart_their_kv_is_not(tiny_model_path, tmp_path):
    """Session ids live in the server process: after a restart they are 404 / NOT_FOUND with a
    message that says what happened and what to do; a session created with the same tokens
    restores their KV from disk (its counters say so) and generates what the first one did."""
    env = persistent(tmp_path)
    prompts = {"http": list(range(10, 10 + 200)), "grpc": list(range(300, 300 + 200))}
    first_port = free_port()
    first = start_server(tiny_model_path, tmp_path, "--grpc-port", str(first_port), env=env)
    try:
        _, body = first.request("POST", "/v1/sessions", {"tokens": prompts["http"]})
        http_id = body["session_id"]
        http_answer = first.request("POST", f"/v1/sessions/{http_id}/generate", {"max_tokens": 6})[1]["tokens"]
        with rpc(f"127.0.0.1:{first_port}") as stub:
            grpc_id = stub.CreateSession(pb.CreateSessionRequest(tokens=prompts["grpc"])).session_id
            grpc_answer = [r.token.id for r in stub.Generate(pb.GenerateRequest(session_id=grpc_id, max_tokens=6))
                           if r.HasField("token")]
    finally:
        stop_server(first)  # (the open sessions are saved as the server drains)

    second_port = free_port()
    second = start_server(tiny_model_path, tmp_path, "--grpc-port", str(second_port), env=env)
    try:
        status, body = second.request("GET", f"/v1/sessions/{http_id}")
        assert status == 404 and body["error"]["pyllamaopt_error"] == "SessionClosedError"
        assert "restarted" in body["error"]["message"] and "create a new one" in body["error"]["message"]
        _, body = second.request("POST", "/v1/sessions", {"tokens": prompts["http"]})
        info = second.request("GET", f"/v1/sessions/{body['session_id']}")[1]
        assert info["stats"]["persist_tokens_restored"] == 2 * BLOCK  # the blocks below the last chunk
        assert second.request("POST", f"/v1/sessions/{body['session_id']}/generate",
                              {"max_tokens": 6})[1]["tokens"] == http_answer
        with rpc(f"127.0.0.1:{second_port}") as stub:
            with pytest.raises(grpc.RpcError) as gone:
                stub.GetSessionInfo(pb.GetSessionInfoRequest(session_id=grpc_id))
            assert gone.value.code() == grpc.StatusCode.NOT_FOUND and "restarted" in gone.value.details()
            new_id = stub.CreateSession(pb.CreateSessionRequest(tokens=prompts["grpc"])).session_id
            assert stub.GetSessionInfo(pb.GetSessionInfoRequest(session_id=new_id)).stats[
                "persist_tokens_restored"] == 2 * BLOCK
            assert [r.token.id for r in stub.Generate(pb.GenerateRequest(session_id=new_id, max_tokens=6))
                    if r.HasField("token")] == grpc_answer
    finally:
        stop_server(second)


def test_a_restored_sessions_first_generation_reports_the_restore_in_its_usage(tiny_model_path, tmp_path):
    """A protocol session created after a restart restores its prompt from disk at its creation; its
    first generation's usage says so, over HTTP and through the gRPC client: the prompt is the whole
    history, the restored tokens are cached, the rest computed (it said 0 prompt tokens, 0 restored:
    the creation's work showed in no usage)."""
    env = persistent(tmp_path)
    prompts = {"http": list(range(10, 10 + 200)), "grpc": list(range(300, 300 + 200))}
    first = start_server(tiny_model_path, tmp_path, env=env)
    try:
        for prompt in prompts.values():
            session_id = first.request("POST", "/v1/sessions", {"tokens": prompt})[1]["session_id"]
            assert first.request("DELETE", f"/v1/sessions/{session_id}")[0] == 204  # (saved)
    finally:
        stop_server(first)
    port = free_port()
    second = start_server(tiny_model_path, tmp_path, "--grpc-port", str(port), env=env)
    try:
        session_id = second.request("POST", "/v1/sessions", {"tokens": prompts["http"]})[1]["session_id"]
        usage = {"http": second.request("POST", f"/v1/sessions/{session_id}/generate", {"max_tokens": 4})[1]["usage"]}
        with Client(f"127.0.0.1:{port}", timeout=60) as client, client.create_session(prompts["grpc"]) as session:
            generation = session.generate(4)
            assert len(list(generation)) == 4 and generation.usage is not None
            usage["grpc"] = dataclasses.asdict(generation.usage)
    finally:
        stop_server(second)
    for how, u in usage.items():
        assert u["prompt_tokens"] == 200 and u["restored_tokens"] == 2 * BLOCK, (how, u)  # below the last chunk
        assert u["cached_tokens"] == 2 * BLOCK and u["computed_tokens"] == 200 - 2 * BLOCK, (how, u)


def test_a_server_on_entries_of_another_model_ignores_them_and_says_so_once(tiny_model_path, tmp_path):
    """Entries of another model in the directory: a miss as before (the answer is the model's own,
    nothing restored), said once in the log at the start with what to do; `cache ls --model`
    marks them."""
    other = write_tiny_llama(tmp_path / "other.gguf", seed=1)
    env = persistent(tmp_path)
    prompts = [list(range(10, 10 + 200)), list(range(300, 300 + 200))]

    def generated(server: Server, prompt: list[int]) -> tuple[list[int], int]:
        session_id = server.request("POST", "/v1/sessions", {"tokens": prompt})[1]["session_id"]
        restored = server.request("GET", f"/v1/sessions/{session_id}")[1]["stats"]["persist_tokens_restored"]
        answer = server.request("POST", f"/v1/sessions/{session_id}/generate", {"max_tokens": 6})[1]["tokens"]
        assert server.request("DELETE", f"/v1/sessions/{session_id}")[0] == 204  # (saved)
        return answer, restored

    cold = start_server(other, tmp_path)  # no disk tier: the other model's own answers
    try:
        expected = [generated(cold, p)[0] for p in prompts]
    finally:
        stop_server(cold)
    first = start_server(tiny_model_path, tmp_path, env=env)
    try:
        for p in prompts:
            generated(first, p)
    finally:
        stop_server(first)
    second = start_server(other, tmp_path, env=env)
    try:
        assert [generated(second, p) for p in prompts] == [(answer, 0) for answer in expected]
    finally:
        stop_server(second)
    log = second.log.read_text()
    line = f"2 of 2 entries in {tmp_path / 'kv'} are for another model, build or KV type and will not be used"
    assert log.count(line) == 1 and "pyllamaopt cache ls --model" in log, log
    assert f"`pyllamaopt cache clean --foreign --model {other}` removes them" in log, log
    assert "another model, build or KV type" not in first.log.read_text()  # (a directory of its own model's entries)
