"""pyllamaopt serve vs llama.cpp's own llama-server, driven by the same openai client.

    python benchmarks/server.py [--shapes append,reasoning,workspace,header,concurrent] [--turns N]
                                [--gen 32] [--clients 4,8] [--no-reference] [--interleave]
                                [--engines pyllamaopt,pyllamaopt-tier2[@SHARE],llama-server]
    python benchmarks/server.py --route chat [--shapes append,workspace] [--turns 16] [--per-turn]
                                [--chat-template-file FILE [--enable-thinking]]
(--route chat: chat messages, each server's own answers re-sent: benchmarks/server_chat.py.)

Every prompt goes as token ids to /v1/completions, greedy, streamed. Both servers run the same
model on the same 2 threads; llama-server is built from the same pinned llama.cpp tree with the
same CPU flags (tools/build_upstream.py) and runs with flash attention and its prompt cache (its
defaults) plus --swa-full, which its prompt reuse needs on Gemma 3's sliding-window layers.

Engines: `pyllamaopt` (exact, the server's defaults); `pyllamaopt-tier2` (the same server with
LLAMA_OPT_DIFF_REUSE_SHIFTED=1: unchanged spans after an edit reused at their shifted positions,
approximately; `@SHARE` sets LLAMA_OPT_DIFF_RECOMPUTE_SHARE and ..._SHARE_HEAD to SHARE); `llama-server`;
`llama-server-ngram` (llama-server drafting from n-grams of the context: --spec-type ngram-mod).

One agent, its whole conversation re-sent every turn (default 22 turns; header 12):
  append, reasoning, workspace   the agent trace of benchmarks/agent_trace.py
  header                         the system prompt's first line changes every request (a
                                 per-request header, as Claude Code sends: llama.cpp #19494)
Per engine: prompt tokens computed (pyllamaopt: usage `pyllamaopt.computed_tokens`;
llama-server: `timings.prompt_n`), wall time, median and max time to first token, how many
answers equal the answer without any reuse (pyllamaopt engines: pyllamaopt on a fresh context
per turn; llama-server: itself with `cache_prompt: false`), and the share of the answers' tokens
equal up to each answer's first difference (503s: requests the server refused for room and the
client sent again; load: the machine's 1-minute load average after the run, 2 when this
benchmark is alone on the 2 cores). The engines run one after the other, or with --interleave
side by side turn by turn (both servers up, each turn sent to every engine, the first engine
rotating; wall is then the sum of each engine's request times).

concurrent: agents sharing the system prompt, each its own conversation (default 4 turns),
growing turn by turn. Each engine runs on a freshly started server per phase: first every agent
alone, one after another (the one-client baseline, and each agent's answers alone), then each
count of --clients agents at once, from threads. Per phase: generated tokens/s (all of them over
the phase's wall time), p50/p95 time to first token and between tokens, the peak of the KV bytes
in use (pyllamaopt: its `session_kv_live_bytes` gauge; llama-server: the tokens its /slots hold,
times the model's KV bytes per token), prompt tokens computed, generated tokens pyllamaopt's
memo confirmed from drafts (several in one pass: they arrive in bursts), 503s retried, and how
many agents (turns) answer as when alone, the fastest and slowest agent's time (fairness). For
each count the engines run one after the other, so that drift of the machine's speed hits both.
llama-server runs with as many slots (-np) as the most clients and a context of CONCURRENT_CTX
cells per slot; pyllamaopt with the same number of KV cells.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tools"))
import agent_trace_data as data  # noqa: E402
import openai  # noqa: E402
from served import stop  # noqa: E402

import pyllamaopt  # noqa: E402
from pyllamaopt import Context, Model, models  # noqa: E402

N_CTX = 8192             # one agent's conversation (the sequential shapes)
CONCURRENT_CTX = 4096    # KV cells per agent (concurrent shape)
TURNS = {"append": 22, "reasoning": 22, "workspace": 22, "header": 12, "concurrent": 4}
RETRY_503 = 100          # times a request refused with 503 (every sequence busy) is sent again
KV_POLL_SECONDS = 0.5


# the servers

@dataclass
class Server:
    engine: str
    port: int
    kv_bytes_per_token: int
    pid: int = 0  # the server's process (0: not known)

    def cpu_seconds(self) -> float:
        """The CPU time the server's process has used so far (all its threads): a turn's work that
        a loaded machine stretches less than its wall time."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="x", max_retries=0, timeout=600)

    def get(self, path: str) -> bytes:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=60) as response:
            return response.read()

    def kv_bytes(self) -> int:
        """KV bytes in use now."""
        if self.engine.startswith("pyllamaopt"):
            gauge = next(line for line in self.get("/metrics").decode().splitlines()
                         if line.startswith("session_kv_live_bytes "))
            return int(float(gauge.split()[1]))
        return sum(slot.get("n_prompt_tokens", 0) for slot in json.loads(self.get("/slots"))) * self.kv_bytes_per_token


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(engine: str, path: Path, server_bin: Path | None, port: int, n_ctx: int,
                   slots: int, jinja: bool = False, extra: tuple[str, ...] = ()) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of `engine` (`jinja`: llama-server renders chat messages
    with the GGUF's template through its jinja engine; `extra`: more of its arguments)."""
    env = dict(os.environ)  # PYTHONPATH included: the server runs the same pyllamaopt as this script
    if engine.startswith("pyllamaopt"):
        kind, _, share = engine.partition("@")
        if kind == "pyllamaopt-tier2":
            env["LLAMA_OPT_DIFF_REUSE_SHIFTED"] = "1"
            if share:
                env["LLAMA_OPT_DIFF_RECOMPUTE_SHARE"] = env["LLAMA_OPT_DIFF_RECOMPUTE_SHARE_HEAD"] = share
        elif engine != "pyllamaopt":
            raise SystemExit(f"unknown engine {engine}")
        return [sys.executable, "-m", "pyllamaopt.cli", "serve", "--model", str(path), "--port", str(port),
                "--n-ctx", str(n_ctx), "--threads", "2", *extra], env
    speculation = {"llama-server": [], "llama-server-ngram": ["--spec-type", "ngram-mod"]}
    if engine not in speculation or server_bin is None:
        raise SystemExit(f"unknown engine {engine}")
    return [str(server_bin), "-m", str(path), "--port", str(port), "-c", str(n_ctx), "-t", "2", "-tb", "2",
            "-np", str(slots), "-fa", "on", "--swa-full", "--no-webui", "--metrics", *speculation[engine],
            *(["--jinja"] if jinja else []), *extra], env


@contextlib.contextmanager
def running(engine: str, model: Model, server_bin: Path | None, n_ctx: int, slots: int = 1,
            jinja: bool = False, extra: tuple[str, ...] = ()) -> Iterator[Server]:
    port = free_port()
    command, env = server_command(engine, Path(model.path), server_bin, port, n_ctx, slots, jinja, extra)
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-{engine}.log"
    # outside the checkout: its pyllamaopt/ (without the built extension) must not shadow the installed one
    process = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=log.parent, env=env)
    server = Server(engine, port, model.kv_bytes_per_token, process.pid)
    try:
        wait_ready(process, server, log)
        yield server
    finally:
        stop(process)


def wait_ready(process: subprocess.Popen, server: Server, log: Path) -> None:
    client = server.client()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"{server.engine} exited:\n{log.read_text()[-3000:]}")
        try:
            client.models.list()
            return
        except openai.APIError:
            time.sleep(0.3)
    process.kill()
    raise SystemExit(f"{server.engine} did not start:\n{log.read_text()[-3000:]}")


# one request

@dataclass
class Reply:
    text: str
    ttft: float            # from the first attempt's start to the first token
    gaps: list[float]      # between consecutive tokens
    generated: int
    computed: int          # prompt tokens whose KV the server computed
    drafted: int = 0       # generated tokens confirmed from pyllamaopt's memo drafts (several in one pass)
    retries: int = 0       # 503s before it was taken
    restored: int = 0      # prompt tokens pyllamaopt read back from its disk tier


def ask(client: openai.OpenAI, prompt: list[int], gen: int, extra: dict | None = None) -> Reply:
    """One streamed completion; a 503 (every sequence busy) is retried after a short wait."""
    t0 = time.perf_counter()
    for retries in range(RETRY_503 + 1):
        try:
            stream = client.completions.create(model="m", prompt=prompt, max_tokens=gen, temperature=0, stream=True,
                                               stream_options={"include_usage": True}, extra_body=extra or {})
            reply = read_stream(stream, t0)
            reply.retries = retries
            return reply
        except openai.APIStatusError as exc:
            if exc.status_code != 503 or retries == RETRY_503:
                raise
            time.sleep(0.2)
    raise AssertionError("unreachable")


def read_stream(stream: openai.Stream, t0: float) -> Reply:
    times: list[float] = []
    pieces: list[str] = []
    generated = computed = drafted = restored = 0
    for chunk in stream:
        extras = chunk.model_extra or {}
        text = "".join(choice.text for choice in chunk.choices)
        if text:
            times.append(time.perf_counter())
            pieces.append(text)
        if chunk.usage is not None:
            generated = chunk.usage.completion_tokens
        if "computed_tokens" in extras.get("pyllamaopt", {}):  # the usage chunk's
            computed += extras["pyllamaopt"]["computed_tokens"]
            drafted += extras["pyllamaopt"]["drafted_tokens"]
            restored += extras["pyllamaopt"]["restored_tokens"]
        if extras.get("timings", {}).get("prompt_n") is not None and chunk.choices and chunk.choices[0].finish_reason:
            computed += extras["timings"]["prompt_n"]
    end = time.perf_counter()
    return Reply("".join(pieces), (times[0] if times else end) - t0, [b - a for a, b in zip(times, times[1:])],
                 generated or len(times), computed, drafted, restored=restored)


def run_turns(client: openai.OpenAI, prompts: list[list[int]], gen: int, extra: dict | None = None) -> list[Reply]:
    return [ask(client, prompt, gen, extra) for prompt in prompts]


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))]


# sequential shapes: one agent re-sending its conversation

def reference_answers(model: Model, prompts: list[list[int]], gen: int) -> list[str]:
    """pyllamaopt without reuse: every turn on a fresh context."""
    out = []
    for prompt in prompts:
        with Context(model, n_ctx=N_CTX, n_threads=2) as ctx:
            s = ctx.session()
            s.append(prompt)
            out.append(s.generate_text(gen, temperature=0.0))
    return out


def agreement(model: Model, answers: list[str], reference: list[str]) -> tuple[int, float]:
    """(answers equal to the reference, share of the reference's tokens before each answer's first
    difference); answers are compared as the model tokenizes their text."""
    tok = [(model.tokenize(a, add_bos=False), model.tokenize(r, add_bos=False)) for a, r in zip(answers, reference)]
    same_prefix = sum(len(os.path.commonprefix([a, r])) for a, r in tok)
    return sum(a == r for a, r in zip(answers, reference)), same_prefix / max(1, sum(len(r) for _, r in tok))


def trace_prompts(model: Model, shape: str, n_turns: int) -> list[list[int]]:
    system = data.system_prompt()
    turns = data.turns(n_turns)
    return [model.tokenize(data.render(system, turns[:i], turns[i], shape=shape, workspace_version=i // 3),
                           special=True) for i in range(n_turns)]


# (replies, wall time, load average after, llama-server's answers without its prompt cache) per engine
TraceRun = tuple[list[Reply], float, float, "list[str] | None"]


def cold_answers(engine: str, client: openai.OpenAI, prompts: list[list[int]], gen: int) -> list[str] | None:
    """llama-server's own answers without its prompt cache (pyllamaopt's: reference_answers)."""
    if not engine.startswith("llama-server"):
        return None
    return [r.text for r in run_turns(client, prompts, gen, {"cache_prompt": False})]


def trace_one_by_one(engines: list[str], model: Model, server_bin: Path | None, prompts: list[list[int]], gen: int,
                     with_reference: bool) -> Iterator[tuple[str, TraceRun]]:
    """Each engine's whole trace, one engine after the other."""
    for engine in engines:
        with running(engine, model, server_bin, N_CTX) as server:
            client = server.client()
            start = time.perf_counter()
            replies = run_turns(client, prompts, gen)
            wall = time.perf_counter() - start
            load = os.getloadavg()[0]
            yield engine, (replies, wall, load, cold_answers(engine, client, prompts, gen) if with_reference else None)


def trace_interleaved(engines: list[str], model: Model, server_bin: Path | None, prompts: list[list[int]], gen: int,
                      with_reference: bool) -> Iterator[tuple[str, TraceRun]]:
    """Every engine's server up at once, the trace turn by turn: each turn goes to every engine, the
    engine that goes first rotating, so that drift of the machine's speed and the order (the engine
    right after another's turn is slower) hit them alike. Wall: the sum of an engine's request times."""
    with contextlib.ExitStack() as stack:
        clients = {e: stack.enter_context(running(e, model, server_bin, N_CTX)).client() for e in engines}
        replies: dict[str, list[Reply]] = {e: [] for e in engines}
        walls = dict.fromkeys(engines, 0.0)
        for turn, prompt in enumerate(prompts):
            for engine in engines[turn % len(engines):] + engines[:turn % len(engines)]:
                start = time.perf_counter()
                replies[engine].append(ask(clients[engine], prompt, gen))
                walls[engine] += time.perf_counter() - start
        load = os.getloadavg()[0]
        for engine in engines:
            yield engine, (replies[engine], walls[engine], load,
                           cold_answers(engine, clients[engine], prompts, gen) if with_reference else None)


def bench_trace(shape: str, model: Model, server_bin: Path | None, engines: list[str], n_turns: int, gen: int,
                with_reference: bool, interleave: bool) -> None:
    prompts = trace_prompts(model, shape, n_turns)
    never_seen = sum(len(p) - max((len(os.path.commonprefix([p, q])) for q in prompts[:i]), default=0)
                     for i, p in enumerate(prompts))
    print(f"\n## shape {shape}: {len(prompts)} turns, prompts {len(prompts[0])}..{len(prompts[-1])} tokens, "
          f"{sum(map(len, prompts))} sent, {never_seen} never seen before")
    print(f"  {'engine':22} {'computed':>9} {'/never-seen':>11} {'wall s':>7} {'TTFT med ms':>11} {'TTFT max ms':>11} "
          f"{'503s':>5} {'same answers as without reuse':>29} {'tokens before 1st diff':>22} {'load':>4}")
    exact: list[str] | None = None  # pyllamaopt's answers without reuse, shared by its engines
    totals: dict[str, tuple[int, float]] = {}
    runs = trace_interleaved if interleave else trace_one_by_one
    for engine, (replies, wall, load, reference) in runs(engines, model, server_bin, prompts, gen, with_reference):
        if with_reference and engine.startswith("pyllamaopt"):
            exact = exact or reference_answers(model, prompts, gen)
            reference = exact
        computed = sum(r.computed for r in replies)
        totals[engine] = computed, wall
        ttft = [r.ttft for r in replies]
        same, prefix = "-", "-"
        if reference is not None:
            n_same, share = agreement(model, [r.text for r in replies], reference)
            same, prefix = f"{n_same}/{len(replies)}", f"{share:.3f}"
        print(f"  {engine:22} {computed:>9} {computed / never_seen:>11.3f} {wall:>7.1f} "
              f"{statistics.median(ttft) * 1000:>11.0f} {max(ttft) * 1000:>11.0f} {sum(r.retries for r in replies):>5} "
              f"{same:>29} {prefix:>22} {load:>4.1f}")
    if "llama-server" in totals:
        base_computed, base_wall = totals["llama-server"]
        for engine, (computed, wall) in totals.items():
            if engine != "llama-server":
                print(f"  {engine}: computed llama-server / {engine} {base_computed / max(1, computed):.2f}x, "
                      f"wall {engine} / llama-server {wall / base_wall:.3f}")


# concurrent shape: agents sharing the system prompt

@dataclass
class Phase:
    """What a phase's requests did; replies[agent][turn] (None: the request failed)."""
    replies: list[list[Reply | None]]
    agent_walls: list[float]  # each agent's time from its first request to its last answer
    wall: float = 0.0
    kv_peak: int = 0
    load: float = 0.0         # the machine's 1-minute load average at the phase's end (2: this run alone)
    errors: list[str] = field(default_factory=list)

    def done(self) -> list[Reply]:
        return [r for agent in self.replies for r in agent if r is not None]


@contextlib.contextmanager
def kv_peak(server: Server) -> Iterator[list[int]]:
    """Polls the server's KV bytes in use while the block runs; [the peak] when it ends."""
    peak = [0]
    stop = threading.Event()

    def sample() -> None:
        with contextlib.suppress(OSError, StopIteration, ValueError):  # a server too busy to answer in time
            peak[0] = max(peak[0], server.kv_bytes())

    def poll() -> None:
        sample()
        while not stop.wait(KV_POLL_SECONDS):
            sample()

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield peak
    finally:
        stop.set()
        thread.join()
        sample()  # the last requests' KV


def run_agents(server: Server, agents: list[list[list[int]]], gen: int, *, together: bool) -> Phase:
    """Each agent sends its turns one after another; `together`: all agents at once (a thread
    each), else one agent after another."""
    phase = Phase([[] for _ in agents], [0.0] * len(agents))

    def agent(i: int, client: openai.OpenAI) -> None:
        start = time.perf_counter()
        for prompt in agents[i]:
            try:
                phase.replies[i].append(ask(client, prompt, gen))
            except openai.APIError as exc:
                phase.errors.append(f"agent {i}: {type(exc).__name__}: {exc}")
                phase.replies[i].append(None)
        phase.agent_walls[i] = time.perf_counter() - start

    clients = [server.client() for _ in agents]
    with kv_peak(server) as peak:
        start = time.perf_counter()
        if together:
            threads = [threading.Thread(target=agent, args=(i, c)) for i, c in enumerate(clients)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        else:
            for i, c in enumerate(clients):
                agent(i, c)
        phase.wall = time.perf_counter() - start
    phase.kv_peak = peak[0]
    phase.load = os.getloadavg()[0]
    return phase


def agent_prompts(model: Model, n_agents: int, n_turns: int) -> list[list[list[int]]]:
    system = data.system_prompt()
    tasks = [data.session_task(i, n_turns) for i in range(n_agents)]
    return [[model.tokenize(data.render(system, task[:k], task[k], shape="append"), special=True)
             for k in range(n_turns)] for task in tasks]


def same_as_alone(phase: Phase, alone: Phase) -> tuple[int, int]:
    """(agents whose every answer equals its answer alone, turns equal to the turn alone)."""
    equal = [[r is not None and a is not None and r.text == a.text for r, a in zip(replies, alone.replies[i])]
             for i, replies in enumerate(phase.replies)]
    return sum(all(e) for e in equal), sum(map(sum, equal))


def bench_concurrent(model: Model, server_bin: Path | None, engines: list[str], counts: list[int], n_turns: int,
                     gen: int) -> None:
    most = max(counts)
    agents = agent_prompts(model, most, n_turns)
    sizes = [len(p) for a in agents for p in a]
    print(f"\n## shape concurrent: {most} agents sharing a {len(model.tokenize(data.system_prompt()))}-token system "
          f"prompt, {n_turns} turns each, prompts {min(sizes)}..{max(sizes)} tokens; each phase on a fresh server "
          f"({CONCURRENT_CTX * most} KV cells; llama-server -np {most})")
    print(f"  {'engine':14} {'clients':>7} {'gen tok/s':>9} {'x alone':>7} {'TTFT p50':>8} {'p95 ms':>7} "
          f"{'ITL p50':>7} {'p95 ms':>7} {'KV peak MB':>10} {'computed':>8} {'drafted':>7} {'503s':>4} {'errors':>6} "
          f"{'same as alone: agents':>21} {'turns':>5} {'agent s':>9} {'load':>4}")
    phases: dict[tuple[str, int], Phase] = {}
    for count in [1, *counts]:  # 1: every agent alone, one after another; engines interleaved
        for engine in engines:
            with running(engine, model, server_bin, CONCURRENT_CTX * most, slots=most) as server:
                phases[engine, count] = run_agents(server, agents[:most if count == 1 else count], gen,
                                                   together=count > 1)
    for (engine, count), phase in sorted(phases.items(), key=lambda item: engines.index(item[0][0])):
        alone = phases[engine, 1]
        done = phase.done()
        ttft = [r.ttft for r in done]
        gaps = [g for r in done for g in r.gaps]
        # the baseline of `count` agents at once: the same agents alone, one after another
        n = len(phase.replies)
        alone_rate = rate([r for a in alone.replies[:n] for r in a if r is not None], sum(alone.agent_walls[:n]))
        agents_same, turns_same = same_as_alone(phase, alone)
        label = f"1 (x{n})" if count == 1 else str(count)
        print(f"  {engine:14} {label:>7} {rate(done, phase.wall):>9.1f} {rate(done, phase.wall) / alone_rate:>7.2f} "
              f"{percentile(ttft, 50) * 1000:>8.0f} {percentile(ttft, 95) * 1000:>7.0f} "
              f"{percentile(gaps, 50) * 1000:>7.1f} {percentile(gaps, 95) * 1000:>7.1f} {phase.kv_peak / 2**20:>10.1f} "
              f"{sum(r.computed for r in done):>8} {sum(r.drafted for r in done):>7} {sum(r.retries for r in done):>4} "
              f"{len(phase.errors):>6} {agents_same:>17}/{n} {turns_same:>2}/{n * n_turns} "
              f"{min(phase.agent_walls):>4.1f}-{max(phase.agent_walls):<4.1f} {phase.load:>4.1f}")
        for error in phase.errors[:5]:
            print(f"    {error}")
    if "llama-server" in engines:
        def p95(engine: str, count: int) -> float:
            return percentile([r.ttft for r in phases[engine, count].done()], 95)

        for engine in engines:
            if engine != "llama-server":
                print(f"  p95 TTFT {engine} / llama-server: " + ", ".join(
                    f"{count} clients {p95(engine, count) / p95('llama-server', count):.2f}" for count in [1, *counts]))


def rate(replies: list[Reply], wall: float) -> float:
    """Generated tokens per second."""
    return sum(r.generated for r in replies) / wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--shapes", default="append")
    parser.add_argument("--turns", type=int, help=f"turns per conversation (default: {TURNS})")
    parser.add_argument("--gen", type=int, default=32)
    parser.add_argument("--clients", default="4,8", help="agents at once in the concurrent shape")
    parser.add_argument("--engines", default="pyllamaopt,llama-server")
    parser.add_argument("--no-reference", action="store_true", help="skip the answers-without-reuse runs")
    parser.add_argument("--interleave", action="store_true",
                        help="sequential shapes: all engines' servers at once, each turn to every engine in rotating order")
    parser.add_argument("--route", choices=("completions", "chat"), default="completions",
                        help="chat: messages to /v1/chat/completions, interleaved (benchmarks/server_chat.py)")
    parser.add_argument("--check", type=int, default=4, help="chat: the last turns compared with a cold server")
    parser.add_argument("--per-turn", action="store_true", help="chat: where each turn's time went")
    parser.add_argument("--chat-template-file", type=Path, help="chat: both servers' template (their option)")
    parser.add_argument("--enable-thinking", action="store_true",
                        help="chat: chat_template_kwargs enable_thinking true; answers re-sent with their reasoning")
    args = parser.parse_args()
    model = Model(models.resolve(args.model))
    engines = args.engines.split(",")
    server_bin = None
    if any(engine.startswith("llama-server") for engine in engines):
        import build_upstream

        server_bin = build_upstream.build(("llama-server",)) / "llama-server"
    print(f"model {model.description}; 2 threads; {args.gen} generated tokens per turn; "
          f"pyllamaopt from {Path(pyllamaopt.__file__).parent}")
    for shape in args.shapes.split(","):
        if shape not in TURNS:
            raise SystemExit(f"unknown shape {shape}: one of {', '.join(TURNS)}")
        n_turns = args.turns or TURNS[shape]
        if args.route == "chat":
            import server_chat  # (it imports this module's servers)

            options = server_chat.ChatOptions(args.chat_template_file,
                                              {"enable_thinking": True} if args.enable_thinking else None)
            server_chat.bench_chat(shape, model, server_bin, engines, args.turns or 16, args.gen, args.check,
                                   args.per_turn, options)
        elif shape == "concurrent":
            bench_concurrent(model, server_bin, engines, [int(c) for c in args.clients.split(",")], n_turns, args.gen)
        else:
            bench_trace(shape, model, server_bin, engines, n_turns, args.gen, not args.no_reference, args.interleave)
    return 0


if __name__ == "__main__":
    sys.exit(main())
