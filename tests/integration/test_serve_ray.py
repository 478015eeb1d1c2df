"""`pyllamaopt serve --ray` (pyllamaopt/ray): the real CLI starts a local Ray cluster with two engine
replicas of one thread each; the real openai client sends 8 conversations of 6 turns at once.
Every answer equals a single `pyllamaopt serve`'s, and our router makes the replicas reuse (usage's
cached_tokens) at least 0.9 of what the single server reuses; Ray's default router is measured
beside it (printed: it is expected far lower, and its answers are still exact). Protocol sessions
keep to the replica that created them (INV-3 holds through Ray), and an id of another replica or of
none is a 404.

The clusters are expensive on a 2-core machine: each starts once for the module (fixtures), and the
single server's reference run is made once and shared."""
from __future__ import annotations

import concurrent.futures
import importlib.util
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from test_serve import Server, free_port, start_server, stop_server

pytestmark = [pytest.mark.integration, pytest.mark.ray]

RAY_N_CTX = 2048
CONVERSATIONS, TURNS, MAX_TOKENS = 8, 6, 12
SYSTEM = ("You are a concise assistant for a team of Python programmers. Their project has these modules: "
          + ", ".join(f"mathkit/op_{i}.py" for i in range(30)) + ". Answer in one short sentence.")
TOPICS = ["lists", "dictionaries", "generators", "decorators", "context managers", "type hints", "dataclasses",
          "asyncio"]
QUESTIONS = ["What are {topic} in Python?", "Give one example of {topic}.", "When should I avoid {topic}?",
             "How do I test code that uses {topic}?", "What is a common mistake with {topic}?",
             "Summarize {topic} in five words."]


@dataclass
class Run:
    """One pass of the conversations: each turn's answer and its usage's cached prompt tokens."""
    answers: list[list[str]]
    cached: list[list[int]]
    prompt: list[list[int]]

    @property
    def cached_total(self) -> int:
        return sum(map(sum, self.cached))

    @property
    def prompt_total(self) -> int:
        return sum(map(sum, self.prompt))


def conversation_messages(i: int, answers: list[str], turn: int) -> list[dict[str, str]]:
    """The messages of conversation i's turn `turn`, with the reference answers of its earlier turns
    (so that every server is sent the very same requests, even if an answer differed)."""
    messages = [{"role": "system", "content": SYSTEM}]
    for t in range(turn + 1):
        messages.append({"role": "user", "content": QUESTIONS[t].format(topic=TOPICS[i])})
        if t < turn:
            messages.append({"role": "assistant", "content": answers[t]})
    return messages


def run_conversations(server: Server, reference: Run | None) -> Run:
    """The 8 conversations at once, each turn after the previous; with no reference, each turn is built
    on this server's own answers (the reference run)."""
    client = server.client(timeout=600)

    def conversation(i: int) -> tuple[list[str], list[int], list[int]]:
        answers: list[str] = []
        cached, prompt = [], []
        for turn in range(TURNS):
            history = answers if reference is None else reference.answers[i]
            reply = client.chat.completions.create(model="gemma", max_tokens=MAX_TOKENS,
                                                   messages=conversation_messages(i, history, turn))
            answers.append(reply.choices[0].message.content or "")
            cached.append(reply.usage.prompt_tokens_details.cached_tokens)
            prompt.append(reply.usage.prompt_tokens)
        return answers, cached, prompt

    with concurrent.futures.ThreadPoolExecutor(CONVERSATIONS) as pool:
        results = list(pool.map(conversation, range(CONVERSATIONS)))
    return Run([r[0] for r in results], [r[1] for r in results], [r[2] for r in results])


def start_ray_server(model: Path, tmp_path: Path, *args: str) -> Server:
    """`pyllamaopt serve --ray` as a process (its own process group: Ray's processes go with it)."""
    if importlib.util.find_spec("ray") is None:
        pytest.fail('these tests need Ray Serve: pip install ".[ray]"')
    port = free_port()
    log = tmp_path / f"ray-{port}.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "pyllamaopt.cli", "serve", "--ray", "--replicas", "2", "--threads", "1",
         "--model", str(model), "--port", str(port), "--n-ctx", str(RAY_N_CTX), *args],
        cwd=tmp_path, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "RAY_ADDRESS": "", "RAY_USAGE_STATS_ENABLED": "0"})
    server = Server(f"http://127.0.0.1:{port}", process, log)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"the Ray server exited with {process.returncode}:\n{log.read_text()}")
        if "replicas" in log.read_text() and "Ctrl-C stops it" in log.read_text():
            with_health = _health(server)
            if with_health:
                return server
        time.sleep(0.5)
    stop_ray_server(server)
    pytest.fail(f"the Ray server did not answer within 300 s:\n{log.read_text()}")


def _health(server: Server) -> bool:
    try:
        return server.request("GET", "/health")[0] == 200
    except (urllib.error.URLError, ConnectionError):
        return False


def stop_ray_server(server: Server) -> None:
    server.process.send_signal(signal.SIGTERM)  # as Ctrl-C: Serve and the cluster it started shut down
    try:
        server.process.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(server.process.pid, signal.SIGKILL)
        pytest.fail(f"the Ray server did not stop within 120 s of SIGTERM:\n{server.log.read_text()[-4000:]}")
    assert "pyllamaopt serve --ray: stopped" in server.log.read_text()


@pytest.fixture(scope="module")
def reference(gemma_path, tmp_path_factory) -> Run:
    single = start_server(gemma_path, tmp_path_factory.mktemp("single"), "--threads", "2", "--n-ctx", str(RAY_N_CTX))
    try:
        return run_conversations(single, None)
    finally:
        stop_server(single)


@pytest.fixture(scope="module")
def on_ray(gemma_path, tmp_path_factory) -> Iterator[Server]:
    server = start_ray_server(gemma_path, tmp_path_factory.mktemp("ray"))
    yield server
    stop_ray_server(server)


def router_counts(server: Server) -> dict[str, float]:
    """The router's requests by reason (pyllamaopt_router_requests_total), from the gateway's /metrics/router."""
    with urllib.request.urlopen(server.url + "/metrics/router", timeout=30) as r:
        text = r.read().decode()
    return {s.labels["reason"]: s.value for family in text_string_to_metric_families(text)
            for s in family.samples if s.name == "pyllamaopt_router_requests_total"}


def test_conversations_through_ray_equal_one_server_and_reuse_as_much(reference, on_ray, gemma_path,
                                                                     tmp_path_factory):
    ours = run_conversations(on_ray, reference)
    assert ours.answers == reference.answers
    assert ours.prompt == reference.prompt
    counts = router_counts(on_ray)
    print(f"\ncached prompt tokens: one server {reference.cached_total} of {reference.prompt_total}, "
          f"2 replicas with our router {ours.cached_total} ({ours.cached_total / reference.cached_total:.2f}x); "
          f"router: {counts}")
    assert ours.cached_total >= 0.9 * reference.cached_total
    assert counts["prefix"] > 0

    default = start_ray_server(gemma_path, tmp_path_factory.mktemp("ray-default"), "--ray-router", "default")
    try:
        theirs = run_conversations(default, reference)
    finally:
        stop_ray_server(default)
    print(f"2 replicas with Ray's default router: {theirs.cached_total} "
          f"({theirs.cached_total / reference.cached_total:.2f}x of one server's)")
    assert theirs.answers == reference.answers  # exact whichever replica answers, only slower


def test_sessions_keep_to_their_replica_and_foreign_ids_are_not_found(on_ray):
    status, body = on_ray.request("POST", "/v1/tokenize", {"text": SYSTEM})
    assert status == 200
    prompt = body["tokens"][:150]
    outputs, ids = [], []
    for pieces in ([prompt], [prompt[:1], prompt[1:64], prompt[64:100], prompt[100:]], None):
        status, body = on_ray.request("POST", "/v1/sessions", {"tokens": prompt} if pieces is None else {})
        assert status == 201, body
        sid = body["session_id"]
        ids.append(sid)
        for piece in pieces or []:
            status, info = on_ray.request("POST", f"/v1/sessions/{sid}/tokens", {"tokens": piece})
            assert status == 200, info
        status, info = on_ray.request("GET", f"/v1/sessions/{sid}")
        assert status == 200 and info["tokens"] == prompt and info["session_id"] == sid
        status, out = on_ray.request("POST", f"/v1/sessions/{sid}/generate", {"max_tokens": 10})
        assert status == 200 and out["finish_reason"] == "length"
        outputs.append(out["tokens"])
    assert outputs[0] == outputs[1] == outputs[2]  # INV-3, each session on its own replica

    by_replica: dict[str, str] = {}  # a session of each replica (new ones go where the fewest are open)
    for _ in range(4):
        time.sleep(2.5)  # the replicas' next digests (every second) count the sessions open
        status, body = on_ray.request("POST", "/v1/sessions", {})
        assert status == 201
        ids.append(body["session_id"])
        replica, _, token = body["session_id"].partition(".")
        by_replica.setdefault(replica, token)
        if len(by_replica) == 2:
            break
    assert len(by_replica) == 2, f"every new session went to one replica: {ids}"
    (first, token), (second, _) = by_replica.items()
    # another replica's id, no replica's, none at all, and a token no session has
    for foreign in (f"{second}.{token}", f"someone-else.{token}", token, f"{first}.{token[::-1]}"):
        status, body = on_ray.request("GET", f"/v1/sessions/{foreign}")
        assert status == 404 and body["error"]["type"] == "not_found_error", (foreign, body)
    for sid in ids:
        assert on_ray.request("DELETE", f"/v1/sessions/{sid}")[0] == 204
        assert on_ray.request("GET", f"/v1/sessions/{sid}")[0] == 404
    counts = router_counts(on_ray)
    assert counts["session"] >= 12 and counts["session_unknown"] >= 2 and counts["session_new"] >= 4


def test_what_ray_cannot_do_is_one_line_before_the_model_loads(tmp_path):
    """--ray without the extra, --replicas 0 or beyond the cluster's CPUs, single-server options: one
    line saying what to do (the model, absent here, is never loaded)."""
    no_ray = tmp_path / "no-ray" / "ray"
    no_ray.mkdir(parents=True)
    (no_ray / "__init__.py").write_text("raise ImportError(\"No module named 'ray'\")\n")
    cases = [(["--ray"], {"PYTHONPATH": str(no_ray.parent)}, 'pip install "pyllamaopt[ray]"'),
             (["--ray", "--replicas", "0"], {}, "--replicas must be at least 1"),
             (["--replicas", "2"], {}, "--replicas needs --ray"),
             (["--ray", "--grpc-port", "50051"], {}, "--grpc-port is single-server only"),
             (["--ray", "--replicas", str(2 * (os.cpu_count() or 2) + 1), "--threads", "1"], {},
              "CPUs, and the Ray cluster has")]
    for args, env, message in cases:
        done = subprocess.run([sys.executable, "-m", "pyllamaopt.cli", "serve", "--model", str(tmp_path / "absent.gguf"),
                               *args], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                              env={**os.environ, "RAY_ADDRESS": "", "RAY_USAGE_STATS_ENABLED": "0", **env})
        last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
        assert done.returncode != 0 and message in last, (args, done.stderr[-2000:])
