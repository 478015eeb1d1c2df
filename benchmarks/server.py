"""pyllamaopt serve vs llama.cpp's own llama-server, driven turn by turn by the same openai client.

    python benchmarks/server.py [--shapes append,reasoning,workspace] [--turns 22] [--gen 32]
                                [--engines pyllamaopt,llama-server] [--no-reference]

The agent trace of benchmarks/agent_trace.py (the whole conversation re-sent every turn, as token
ids to /v1/completions, greedy, streamed). Both servers run the same model on the same 2 threads;
llama-server is built from the same pinned llama.cpp tree with the same CPU flags
(tools/build_upstream.py) and runs with flash attention, one slot, and its prompt cache (its
defaults) plus --swa-full, which its prompt reuse needs on Gemma 3's sliding-window layers.

Per engine and shape: prompt tokens computed (pyllamaopt: its usage counters; llama-server: its
`timings.prompt_n`), wall time of the whole trace, median and max time to first token, and how
many answers equal the same server's answer without any reuse (the reference: pyllamaopt on a
fresh context per turn; llama-server with `cache_prompt: false`).
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tools"))
import agent_trace_data as data  # noqa: E402
import openai  # noqa: E402

from pyllamaopt import Context, Model, models  # noqa: E402

N_CTX = 8192


@dataclass
class Result:
    computed: int = 0
    wall: float = 0.0
    ttft: list[float] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(command: list[str], port: int, log: Path) -> subprocess.Popen:
    # outside the checkout: its pyllamaopt/ (without the built extension) must not shadow the installed one
    process = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=log.parent)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"{command[0]} exited:\n{log.read_text()[-3000:]}")
        try:
            client.models.list()
            return process
        except openai.APIError:
            time.sleep(0.3)
    process.kill()
    raise SystemExit(f"{command[0]} did not start:\n{log.read_text()[-3000:]}")


def stop(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()


def run_turns(port: int, prompts: list[list[int]], gen: int, extra: dict) -> Result:
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=600)
    result = Result()
    start_all = time.perf_counter()
    for prompt in prompts:
        t0 = time.perf_counter()
        first = None
        pieces: list[str] = []
        stream = client.completions.create(model="m", prompt=prompt, max_tokens=gen, temperature=0, stream=True,
                                           stream_options={"include_usage": True}, extra_body=extra)
        for chunk in stream:
            extras = chunk.model_extra or {}
            if chunk.choices and chunk.choices[0].text and first is None:
                first = time.perf_counter() - t0
            if "pyllamaopt" in extras:
                result.computed += extras["pyllamaopt"]["computed_tokens"]
            if "timings" in extras and extras["timings"].get("prompt_n") is not None and chunk.choices \
                    and chunk.choices[0].finish_reason:
                result.computed += extras["timings"]["prompt_n"]
            pieces += [choice.text for choice in chunk.choices]
        result.ttft.append(first if first is not None else time.perf_counter() - t0)
        result.answers.append("".join(pieces))
    result.wall = time.perf_counter() - start_all
    return result


def reference_answers(model: Model, prompts: list[list[int]], gen: int) -> list[str]:
    """pyllamaopt without reuse: every turn on a fresh context."""
    out = []
    for prompt in prompts:
        with Context(model, n_ctx=N_CTX, n_threads=2) as ctx:
            s = ctx.session()
            s.append(prompt)
            out.append(s.generate_text(gen, temperature=0.0))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--shapes", default="append")
    parser.add_argument("--turns", type=int, default=22)
    parser.add_argument("--gen", type=int, default=32)
    parser.add_argument("--engines", default="pyllamaopt,llama-server")
    parser.add_argument("--no-reference", action="store_true", help="skip the answers-without-reuse runs")
    args = parser.parse_args()
    path = models.resolve(args.model)
    model = Model(path)
    engines = args.engines.split(",")
    logs = Path(os.environ.get("TMPDIR", "/tmp"))
    server_bin = None
    if "llama-server" in engines:
        import build_upstream

        server_bin = build_upstream.build(("llama-server",)) / "llama-server"
    print(f"model {model.description}; 2 threads; {args.gen} generated tokens per turn; n_ctx {N_CTX}")
    for shape in args.shapes.split(","):
        system = data.system_prompt()
        turns = data.turns(args.turns)
        prompts = [model.tokenize(data.render(system, turns[:i], turns[i], shape=shape, workspace_version=i // 3),
                                  special=True) for i in range(args.turns)]
        never_seen = sum(len(p) - max((len(os.path.commonprefix([p, q])) for q in prompts[:i]), default=0) for i, p in enumerate(prompts))
        print(f"\n## shape {shape}: {len(prompts)} turns, prompts {len(prompts[0])}..{len(prompts[-1])} tokens, "
              f"{sum(map(len, prompts))} sent, {never_seen} never seen before")
        print(f"  {'engine':16} {'computed':>9} {'/never-seen':>11} {'wall s':>8} {'TTFT med ms':>11} "
              f"{'TTFT max ms':>11} {'same answers as without reuse':>30}")
        walls = {}
        for engine in engines:
            port = free_port()
            if engine == "pyllamaopt":
                command = [sys.executable, "-m", "pyllamaopt.cli", "serve", "--model", str(path), "--port", str(port),
                           "--n-ctx", str(N_CTX), "--threads", "2"]
            else:
                command = [str(server_bin), "-m", str(path), "--port", str(port), "-c", str(N_CTX), "-t", "2",
                           "-tb", "2", "-np", "1", "-fa", "on", "--swa-full", "--no-webui"]
            process = start(command, port, logs / f"bench-{engine}.log")
            try:
                result = run_turns(port, prompts, args.gen, {})
                reference = None
                if not args.no_reference and engine == "llama-server":
                    reference = run_turns(port, prompts, args.gen, {"cache_prompt": False}).answers
            finally:
                stop(process)
            if not args.no_reference and engine == "pyllamaopt":
                reference = reference_answers(model, prompts, args.gen)
            answers = result.answers
            same = "-" if reference is None else f"{sum(a == r for a, r in zip(answers, reference))}/{len(answers)}"
            walls[engine] = result.wall
            print(f"  {engine:16} {result.computed:>9} {result.computed / never_seen:>11.3f} {result.wall:>8.1f} "
                  f"{statistics.median(result.ttft) * 1000:>11.0f} {max(result.ttft) * 1000:>11.0f} {same:>30}")
        if len(walls) == 2:
            print(f"  wall time pyllamaopt / llama-server: {walls['pyllamaopt'] / walls['llama-server']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
