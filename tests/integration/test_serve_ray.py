"""`pyllamaopt serve --ray` (pyllamaopt/ray) on a real local Ray cluster the tests start (2 CPUs), two
engine replicas of one thread each, the real openai client: 8 conversations of 6 turns at once, each
carrying a file of its own (its content is most of its prompts: where a turn lands matters).

- Every answer equals a single `pyllamaopt serve`'s; our router makes the replicas reuse (usage's
  cached_tokens, from RAM: the disk tier's restores left out) at least 0.9 of what the single server
  reuses; Ray's default router is measured beside it (printed), its answers exact too.
- Each replica's metrics and the router's counters reach Ray's metrics export.
- Protocol sessions keep to the replica that created them (INV-3 through Ray); another replica's id
  or none is a 404.
- A replica's actor killed mid-run: the run finishes, a request fails only as a 503 with Retry-After
  (the client retries), no answer differs, the moved conversations restore their blocks from the
  shared disk tier, and the dead replica's sessions are 404.
- The cluster a server joined killed under it (a cluster of that test's own), and the GCS of a cluster
  a server started itself: the server exits within 30 s with a line saying so and what to do, never
  hangs, nor do its clients.

The expensive parts are shared: one cluster for the module (each server joins it: a deployment costs
seconds, a cluster tens of them), the single server's reference run once, our router's deployment
once (tests run in file order: the default router's deployment comes first, alone on the cluster)."""
from __future__ import annotations

import concurrent.futures
import contextlib
import importlib.util
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from test_serve import Server, free_port, start_server, stop_server
from test_serve_crash import CUT_BY_THE_KILL

pytestmark = [pytest.mark.integration, pytest.mark.ray]

N_CTX = 8192  # every conversation stays in the single server's KV cache, and in each replica's
CONVERSATIONS, TURNS, MAX_TOKENS = 8, 6, 12
SYSTEM = "You are a concise assistant for a team of Python programmers. Answer in one short sentence."
TOPICS = ["lists", "dictionaries", "generators", "decorators", "context managers", "type hints", "dataclasses",
          "asyncio"]
QUESTIONS = ["What does this module do?", "Which function would you test first?", "What could go wrong with {topic}?",
             "How do I test code that uses {topic}?", "What is a common mistake with {topic}?",
             "Summarize the module in five words."]
REPLICA_HEADER = "x-pyllamaopt-replica"
RAY_EXPORT_WAIT = 90  # seconds for a value to reach Ray's metrics export (its processes report every 10 s)
FIGURES: dict[str, Run] = {}  # the default router's run, reported beside ours
CLUSTER_LOST_BOUND = 30  # seconds from a cluster's loss to the server's exit


def document(i: int) -> str:
    """Conversation i's own file (~400 tokens), shown in its first turn."""
    name = TOPICS[i].replace(" ", "_") + "_tools"
    lines = [f'"""{name}.py: helpers for {TOPICS[i]} (ticket {1000 + 37 * i})."""', ""]
    for k in range(10):
        lines += [f"def {name}_{k}(values: list[int]) -> int:",
                  f'    """Step {k} of the {TOPICS[i]} pipeline, owned by team {chr(65 + (i + k) % 26)}."""',
                  f"    return sum(v * {i + 2} + {k * 7 + i} for v in values)", ""]
    return "\n".join(lines)


def user_message(i: int, turn: int) -> str:
    question = QUESTIONS[turn].format(topic=TOPICS[i])
    if turn == 0:
        return f"Here is my file:\n```python\n{document(i)}```\n{question}"
    return f"Test run {turn}: {turn + i} passed, {turn % 3} failed in step {turn + i % 4}. {question}"


def conversation_messages(i: int, answers: list[str], turn: int) -> list[dict[str, str]]:
    """The messages of conversation i's turn `turn`, with the reference answers of its earlier turns
    (so that every server is sent the very same requests, even if an answer differed)."""
    messages = [{"role": "system", "content": SYSTEM}]
    for t in range(turn + 1):
        messages.append({"role": "user", "content": user_message(i, t)})
        if t < turn:
            messages.append({"role": "assistant", "content": answers[t]})
    return messages


@dataclass
class Turn:
    answer: str
    prompt: int
    cached: int
    restored: int
    replica: str | None  # the replica that answered (its header), None for the single server


@dataclass
class Run:
    """One pass of the conversations, filled as they go; `retries`: the 503s answered (and retried)."""
    turns: list[list[Turn]] = field(default_factory=lambda: [[] for _ in range(CONVERSATIONS)])
    retries: list[float] = field(default_factory=list)  # when each came (time.monotonic)

    @property
    def answers(self) -> list[list[str]]:
        return [[t.answer for t in c] for c in self.turns]

    @property
    def prompts(self) -> list[list[int]]:
        return [[t.prompt for t in c] for c in self.turns]

    def total(self, what: str) -> int:
        return sum(getattr(t, what) for c in self.turns for t in c)

    def done(self) -> int:
        return sum(map(len, self.turns))

    def placement(self) -> str:
        """Turns per replica, and how many turns a conversation's previous turn was elsewhere."""
        per_replica = Counter(t.replica for c in self.turns for t in c)
        moves = sum(a.replica != b.replica for c in self.turns for a, b in zip(c, c[1:]))
        return f"turns per replica {sorted(per_replica.values())}, {moves} moves"


def ask(client: openai.OpenAI, messages: list[dict[str, str]], run: Run) -> Turn:
    """One turn; a 503 (a replica died under it, or none could take it) must say when to retry, and is
    retried then."""
    for _ in range(5):
        try:
            raw = client.chat.completions.with_raw_response.create(model="gemma", max_tokens=MAX_TOKENS,
                                                                   messages=messages)
        except openai.APIStatusError as exc:
            assert exc.status_code == 503 and "retry-after" in exc.response.headers, (exc.status_code, exc.body)
            run.retries.append(time.monotonic())
            time.sleep(float(exc.response.headers["retry-after"]))
            continue
        reply = raw.parse()
        usage = reply.usage
        assert usage is not None and usage.prompt_tokens_details is not None
        return Turn(reply.choices[0].message.content or "", usage.prompt_tokens,
                    usage.prompt_tokens_details.cached_tokens or 0,
                    (reply.model_extra or {})["pyllamaopt"]["restored_tokens"], raw.headers.get(REPLICA_HEADER))
    pytest.fail(f"5 answers of 503 in a row to {messages[-1]['content'][:60]!r}")


def run_conversations(server: Server, reference: Run | None, run: Run | None = None) -> Run:
    """The conversations at once, each turn after the previous; with no reference, each turn is built on
    this server's own answers (the reference run). `run` is filled as they go (another thread watches)."""
    client = server.client(timeout=600)
    run = run if run is not None else Run()

    def conversation(i: int) -> None:
        for turn in range(TURNS):
            history = [t.answer for t in run.turns[i]] if reference is None else reference.answers[i]
            run.turns[i].append(ask(client, conversation_messages(i, history, turn), run))

    with concurrent.futures.ThreadPoolExecutor(CONVERSATIONS) as pool:
        list(pool.map(conversation, range(CONVERSATIONS)))
    return run


@dataclass
class Cluster:
    address: str       # the GCS's, for RAY_ADDRESS
    metrics_port: int  # Ray's metrics export (Prometheus text at /metrics)
    process: subprocess.Popen
    log: Path
    token: str         # Ray's token authentication, this cluster's own token

    def environment(self) -> dict[str, str]:
        """What a process joining the cluster needs in its environment."""
        return {"RAY_ADDRESS": self.address, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token,
                "RAY_USAGE_STATS_ENABLED": "0"}


def start_cluster(directory: Path) -> Cluster:
    """`ray start --head --block`: a local cluster of 2 CPUs, ended by its process (stop_cluster; never
    `ray stop`, which ends every cluster of this user on the machine)."""
    if importlib.util.find_spec("ray") is None:
        pytest.fail('these tests need Ray Serve: pip install ".[ray]"')
    port, metrics_port, agent_port, client_port = free_port(), free_port(), free_port(), free_port()
    directory.mkdir(parents=True, exist_ok=True)
    log = directory / "ray-start.log"
    token = uuid.uuid4().hex  # (not the user's ~/.ray/auth_token, which other clusters may use)
    process = subprocess.Popen(
        [str(Path(sys.executable).with_name("ray")), "start", "--head", "--block", f"--port={port}", "--num-cpus=2",
         "--include-dashboard=false", f"--metrics-export-port={metrics_port}",
         f"--dashboard-agent-listen-port={agent_port}", f"--ray-client-server-port={client_port}",
         "--object-store-memory=100000000", "--disable-usage-stats"],  # (ports of its own: other clusters may run)
        stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token, "RAY_USAGE_STATS_ENABLED": "0"})
    deadline = time.monotonic() + 180
    while "Ray runtime started" not in log.read_text():
        if process.poll() is not None or time.monotonic() > deadline:
            os.killpg(process.pid, signal.SIGKILL)
            pytest.fail(f"ray start did not start a cluster:\n{log.read_text()[-4000:]}")
        time.sleep(0.5)
    return Cluster(f"127.0.0.1:{port}", metrics_port, process, log, token)


def stop_cluster(cluster: Cluster) -> None:
    cluster.process.send_signal(signal.SIGTERM)
    try:
        cluster.process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(cluster.process.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    """The module's cluster, which each server joins (but those the last two tests lose a cluster under)."""
    cluster = start_cluster(tmp_path_factory.mktemp("cluster"))
    yield cluster
    stop_cluster(cluster)


def start_ray_server(model: Path, tmp_path: Path, cluster: Cluster | None, *args: str,
                     env: dict[str, str] | None = None, replicas: int = 2) -> Server:
    """`pyllamaopt serve --ray` joining the cluster, as a process (cluster None: with no RAY_ADDRESS, it
    starts a cluster of its own)."""
    port = free_port()
    log = tmp_path / f"ray-{port}.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "pyllamaopt.cli", "serve", "--ray", "--replicas", str(replicas), "--threads", "1",
         "--model", str(model), "--port", str(port), "--n-ctx", str(N_CTX), *args],
        cwd=tmp_path, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True,
        env={**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, "RAY_USAGE_STATS_ENABLED": "0",
             **(cluster.environment() if cluster else {}), **(env or {})})
    server = Server(f"http://127.0.0.1:{port}", process, log)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"the Ray server exited with {process.returncode}:\n{log.read_text()}")
        if "Ctrl-C stops it" in log.read_text() and _health(server):
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
    server.process.send_signal(signal.SIGTERM)  # as Ctrl-C: Serve's application goes, the cluster stays
    try:
        server.process.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(server.process.pid, signal.SIGKILL)
        pytest.fail(f"the Ray server did not stop within 120 s of SIGTERM:\n{server.log.read_text()[-4000:]}")
    assert "pyllamaopt serve --ray: stopped" in server.log.read_text()


@pytest.fixture(scope="module")
def reference(gemma_path, tmp_path_factory) -> Run:
    single = start_server(gemma_path, tmp_path_factory.mktemp("single"), "--threads", "2", "--n-ctx", str(N_CTX))
    try:
        return run_conversations(single, None)
    finally:
        stop_server(single)


@pytest.fixture(scope="module")
def on_ray(gemma_path, tmp_path_factory, cluster) -> Iterator[Server]:
    """Our router's deployment; the replicas share a disk tier (the kill test's conversations restore
    from it)."""
    tmp = tmp_path_factory.mktemp("ray")
    server = start_ray_server(gemma_path, tmp, cluster,
                              env={"LLAMA_OPT_PERSIST_ENABLED": "1", "LLAMA_OPT_PERSIST_DIR": str(tmp / "kv")})
    yield server
    stop_ray_server(server)


def router_samples(server: Server) -> list:
    """The router's counters, from the gateway's /metrics/router."""
    with urllib.request.urlopen(server.url + "/metrics/router", timeout=30) as r:
        text = r.read().decode()
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def router_counts(server: Server) -> dict[str, float]:
    """The router's requests by reason (pyllamaopt_router_requests_total)."""
    return {s.labels["reason"]: s.value for s in router_samples(server) if s.name == "pyllamaopt_router_requests_total"}


def ray_export(cluster: Cluster, name: str) -> list[tuple[dict[str, str], float]]:
    """The samples of `name` in Ray's metrics export, with their tags."""
    with urllib.request.urlopen(f"http://127.0.0.1:{cluster.metrics_port}/metrics", timeout=30) as r:
        text = r.read().decode()
    return [(s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples
            if s.name == name]


def test_rays_default_router_answers_the_same(reference, gemma_path, tmp_path_factory, cluster):
    """Ray Serve's default router (power of two choices): exact whichever replica answers, only slower;
    its reuse is reported beside ours (the next test)."""
    default = start_ray_server(gemma_path, tmp_path_factory.mktemp("ray-default"), cluster, "--ray-router", "default")
    try:
        theirs = FIGURES["default"] = run_conversations(default, reference)
    finally:
        stop_ray_server(default)
    assert theirs.answers == reference.answers and theirs.prompts == reference.prompts
    assert not theirs.retries
    print(f"\n2 replicas with Ray's default router: cached prompt tokens {theirs.total('cached')} "
          f"({theirs.total('cached') / reference.total('cached'):.2f}x one server's); {theirs.placement()}")


def test_conversations_through_ray_equal_one_server_and_reuse_as_much(reference, on_ray, cluster):
    ours = run_conversations(on_ray, reference)
    assert ours.answers == reference.answers and ours.prompts == reference.prompts
    assert not ours.retries
    counts = router_counts(on_ray)
    from_ram = ours.total("cached") - ours.total("restored")  # what the disk tier (on here) gave left out
    default = FIGURES.get("default")
    print(f"\ncached prompt tokens: one server {reference.total('cached')} of {reference.total('prompt')}, "
          f"2 replicas with our router {from_ram} from RAM ({from_ram / reference.total('cached'):.2f}x) "
          f"+ {ours.total('restored')} restored, with Ray's default router "
          + (f"{default.total('cached')} ({default.total('cached') / reference.total('cached'):.2f}x)"
             if default else "(not measured in this session)") + f"; ours: {ours.placement()}; router: {counts}")
    assert from_ram >= 0.9 * reference.total("cached")
    assert counts["prefix"] > 0
    assert len({t.replica for c in ours.turns for t in c}) == 2  # both replicas worked

    # Ray's metrics export: each replica's own counters (the single server's /metrics, tagged with the
    # replica), which add up to the run's work; and the router's
    # (the default router's deployment, gone, may still be there: its replicas are others)
    replicas = {t.replica for c in ours.turns for t in c}
    computed = sum(t.prompt - t.cached for c in ours.turns for t in c)
    deadline = time.monotonic() + RAY_EXPORT_WAIT
    while True:
        per_replica = {tags["replica"]: value for tags, value in
                       ray_export(cluster, "ray_pyllamaopt_prompt_tokens_computed_total") if tags["replica"] in replicas}
        routed = [value for tags, value in ray_export(cluster, "ray_pyllamaopt_router_requests_total")
                  if tags["reason"] == "prefix"]
        exported = set(per_replica) == replicas and sum(per_replica.values()) == computed and counts["prefix"] in routed
        if exported or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert set(per_replica) == replicas and sum(per_replica.values()) == computed, (per_replica, computed)
    assert counts["prefix"] in routed, (counts, routed)


def new_session_on_each_replica(server: Server) -> dict[str, str]:
    """{replica: a new session's id}: new sessions go to the replica with the fewest open, by the
    replicas' digests (every second)."""
    by_replica: dict[str, str] = {}
    for _ in range(4):
        status, body = server.request("POST", "/v1/sessions", {})
        assert status == 201
        by_replica.setdefault(body["session_id"].partition(".")[0], body["session_id"])
        if len(by_replica) == 2:
            return by_replica
        time.sleep(2.5)  # the replicas' next digests count the session just opened
    pytest.fail(f"every new session went to one replica: {by_replica}")


def test_sessions_keep_to_their_replica_and_foreign_ids_are_not_found(on_ray):
    status, body = on_ray.request("POST", "/v1/tokenize", {"text": SYSTEM + document(0)})
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

    by_replica = new_session_on_each_replica(on_ray)
    ids += by_replica.values()
    (first, sid), (second, _) = by_replica.items()
    token = sid.partition(".")[2]
    # another replica's id, no replica's, none at all, and a token no session has
    for foreign in (f"{second}.{token}", f"someone-else.{token}", token, f"{first}.{token[::-1]}"):
        status, body = on_ray.request("GET", f"/v1/sessions/{foreign}")
        assert status == 404 and body["error"]["type"] == "not_found_error", (foreign, body)
    for sid in ids:
        assert on_ray.request("DELETE", f"/v1/sessions/{sid}")[0] == 204
        assert on_ray.request("GET", f"/v1/sessions/{sid}")[0] == 404
    counts = router_counts(on_ray)
    assert counts["session"] >= 12 and counts["session_unknown"] >= 2 and counts["session_new"] >= 4


def test_a_replica_killed_mid_run(reference, on_ray, cluster, monkeypatch):
    """ray.kill of a replica's actor while the conversations run (Serve starts another)."""
    for name, value in cluster.environment().items():  # (Ray reads the address and its token from there)
        monkeypatch.setenv(name, value)
    import ray

    sessions = new_session_on_each_replica(on_ray)
    run = Run()
    ray.init(namespace="pyllamaopt-tests", log_to_driver=False, logging_level=logging.WARNING)
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            running = pool.submit(run_conversations, on_ray, reference, run)
            while run.done() < 2 * CONVERSATIONS and not running.done():  # mid-run: two turns each, about
                time.sleep(0.05)
            # the replica that answered most conversations' latest turn; its actor, as Ray Serve names it
            victim = Counter(c[-1].replica for c in run.turns if c).most_common(1)[0][0]
            actors = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                      if a["name"].startswith("SERVE_REPLICA::") and a["name"].endswith(f"#engine#{victim}")]
            assert len(actors) == 1, actors
            killed_at, turns_before = time.monotonic(), [len(c) for c in run.turns]
            ray.kill(ray.get_actor(actors[0], namespace="serve"), no_restart=True)
            running.result()
    finally:
        ray.shutdown()

    assert run.answers == reference.answers  # never a wrong token
    assert all(retry > killed_at for retry in run.retries) and len(run.retries) <= CONVERSATIONS, run.retries
    # the conversations on the killed replica: each one's first turn elsewhere restored its blocks
    moved = []
    for i, turns in enumerate(run.turns):
        if turns_before[i] and turns[turns_before[i] - 1].replica == victim:
            after = next((t for t in turns[turns_before[i]:] if t.replica != victim), None)
            if after is not None:  # (None: the conversation had ended)
                moved.append(after)
                assert after.restored > 0, (i, after)
    assert moved
    # the replicas' digests of their (shared) disk tier reached the router, which counted prompt blocks
    # the chosen replica restores rather than computes (a moved conversation's: no pool held them)
    disk_blocks = sum(s.value for s in router_samples(on_ray)
                      if s.name == "pyllamaopt_router_matched_disk_blocks_total")
    assert disk_blocks > 0
    print(f"\nkilled replica {victim}: {len(moved)} conversations moved, {len(run.retries)} requests answered 503 "
          f"and retried, {sum(t.restored for t in moved)} prompt tokens restored from the shared disk tier; the "
          f"router placed {disk_blocks:g} prompt blocks by the disk tier's digests")
    # its sessions went with it; the other replica's did not
    for replica, sid in sessions.items():
        status, body = on_ray.request("GET", f"/v1/sessions/{sid}")
        assert (status, replica == victim) in ((404, True), (200, False)), (replica, victim, status, body)
        on_ray.request("DELETE", f"/v1/sessions/{sid}")


def test_what_ray_cannot_do_is_one_line_before_the_model_loads(tmp_path, cluster):
    """--ray without the extra, --replicas 0 or beyond the cluster's CPUs, single-server options: one
    line saying what to do (the model, absent here, is never loaded)."""
    no_ray = tmp_path / "no-ray" / "ray"
    no_ray.mkdir(parents=True)
    (no_ray / "__init__.py").write_text("raise ImportError(\"No module named 'ray'\")\n")
    cases = [(["--ray"], {"PYTHONPATH": str(no_ray.parent)}, 'pip install "pyllamaopt[ray]"'),
             (["--ray", "--replicas", "0"], {}, "--replicas must be at least 1"),
             (["--replicas", "2"], {}, "--replicas needs --ray"),
             (["--ray", "--grpc-port", "50051"], {}, "--grpc-port is single-server only"),
             (["--ray", "--replicas", "3", "--threads", "1"], {}, "need 3 CPUs, and the Ray cluster has 2")]
    for args, env, message in cases:
        done = subprocess.run([sys.executable, "-m", "pyllamaopt.cli", "serve", "--model", str(tmp_path / "absent.gguf"),
                               *args], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                              env={**os.environ, **cluster.environment(), **env})
        last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
        assert done.returncode != 0 and message in last, (args, done.stderr[-2000:])



def cluster_lost_under(server: Server, kill: Callable[[], object]) -> tuple[str, float, float]:
    """`kill`s the server's cluster while an answer streams: the stream breaks off, never hangs; the
    server exits with status 1 within CLUSTER_LOST_BOUND seconds; a request after it is refused at
    once. Returns the server's last line and the seconds until the stream broke off and it exited."""
    client = server.client(timeout=120)
    messages = [{"role": "user", "content": "Count from 1 to 300, one number per line."}]
    assert client.chat.completions.create(model="gemma", max_tokens=8, messages=messages).choices[0].message.content
    chunks = iter(client.chat.completions.create(model="gemma", max_tokens=600, messages=messages, stream=True))
    while not any(choice.delta.content for choice in next(chunks).choices):
        pass  # until the answer streams
    kill()
    killed_at = time.monotonic()
    with pytest.raises(CUT_BY_THE_KILL):
        for _ in chunks:
            pass
    broke_off = time.monotonic() - killed_at
    try:
        server.process.wait(timeout=CLUSTER_LOST_BOUND)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the server still ran {CLUSTER_LOST_BOUND} s after its cluster went:\n"
                    f"{server.log.read_text()[-4000:]}")
    exited = time.monotonic() - killed_at
    assert server.process.returncode == 1, server.log.read_text()[-4000:]
    asked_at = time.monotonic()
    with pytest.raises(openai.APIConnectionError):
        client.chat.completions.create(model="gemma", max_tokens=8, messages=messages)
    assert broke_off < CLUSTER_LOST_BOUND and time.monotonic() - asked_at < 5
    last = server.log.read_text().strip().splitlines()[-1]
    print(f"\nthe cluster killed: the stream broke off after {broke_off:.1f} s, the server exited after "
          f"{exited:.1f} s: {last}")
    return last, broke_off, exited


def test_a_cluster_that_goes_away_ends_the_server_with_a_message(gemma_path, tmp_path):
    """Every process of the cluster the server joined killed at once (SIGKILL, as `ray stop --force`
    does; a cluster of this test's own, not the module's): the last line names the cluster and what
    to do."""
    cluster = start_cluster(tmp_path / "cluster")
    try:
        server = start_ray_server(gemma_path, tmp_path, cluster, replicas=1)
        try:
            last, _, _ = cluster_lost_under(server, lambda: os.killpg(cluster.process.pid, signal.SIGKILL))
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.process.pid, signal.SIGKILL)
    finally:
        stop_cluster(cluster)  # (its processes are gone: only the group's leader is waited for)
    port = cluster.address.rpartition(":")[2]
    assert last.startswith("pyllamaopt serve --ray: the Ray cluster at ") and f":{port} went away" in last, last
    assert "ray start --head" in last and "RAY_ADDRESS" in last, last


def process_group(pgid: int) -> dict[int, str]:
    """The live processes of a process group: {pid: command name}."""
    members = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # (gone meanwhile)
            continue
        state, _, group = text[text.rindex(")") + 2:].split()[:3]
        if int(group) == pgid and state != "Z":
            members[int(stat.parent.name)] = text[text.index("(") + 1:text.rindex(")")]
    return members


def test_a_cluster_of_its_own_that_loses_its_gcs_ends_the_server(gemma_path, tmp_path):
    """The GCS of the cluster a server started itself (no RAY_ADDRESS) killed: the last line says
    so, and no process of that cluster outlives the server (they are of its process group)."""
    server = start_ray_server(gemma_path, tmp_path, None, replicas=1)
    try:
        gcs = [pid for pid, name in process_group(server.process.pid).items() if name == "gcs_server"]
        assert len(gcs) == 1, process_group(server.process.pid)
        last, _, _ = cluster_lost_under(server, lambda: os.kill(gcs[0], signal.SIGKILL))
        deadline = time.monotonic() + 15
        while process_group(server.process.pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = process_group(server.process.pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.process.pid, signal.SIGKILL)
    assert last.startswith("pyllamaopt serve --ray: the Ray cluster this server started went away (its gcs_server "
                           "process exited"), last
    assert "start pyllamaopt serve --ray again" in last, last
    assert not left, left
