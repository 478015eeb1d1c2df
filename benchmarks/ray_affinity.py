"""Engine replicas on Ray Serve, our router vs Ray's default router vs one server, on an agent trace.

    python benchmarks/ray_affinity.py [--model gemma3-270m] [--agents 8] [--turns 4] [--gen 16] [--replicas 2]
                                      [--own-functions 10]

The agents of benchmarks/server.py's concurrent shape (a shared system prompt, each its own
conversation, growing turn by turn; token ids to /v1/completions, greedy, streamed) all at once; each
agent's first turn also carries its own working copy of a file (--own-functions functions, about 55
tokens each: 0 for the plain trace), so that its own content is a large part of its prompts, as an
agent's repository files are. Against: `one`, a single `pyllamaopt serve` with --replicas threads;
`ray-affinity`, `pyllamaopt serve --ray` with --replicas replicas of one thread and our router
(prefix and session affinity); `ray-default`, the same with Ray Serve's default router (power of two
choices). Every engine has KV cells for all of it (N_CTX): the comparison is of routing, not of
room. Per engine: prompt tokens computed (usage `pyllamaopt.computed_tokens`; the headline: on this
2-core machine the replicas share the cores, so wall time says little of a real cluster), its ratio
to one server's, wall time, TTFT p50/p95, and how many answers equal one server's (all of them:
reuse is exact wherever a prompt lands); the load average before each engine's run.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import agent_trace_data as data  # noqa: E402
import openai  # noqa: E402
from served import wait_ready  # noqa: E402
from server import Reply, ask, free_port, percentile  # noqa: E402

from pyllamaopt import Model  # noqa: E402

N_CTX = 16384  # every agent's conversation fits in one server's KV cache, and in each replica's


@contextlib.contextmanager
def running(model: str, *args: str, log: Path) -> Iterator[str]:
    """`pyllamaopt serve --model MODEL ARGS` on a free port (its own process group: with --ray, the local
    cluster's processes go with it); yields its URL once /health answers."""
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "pyllamaopt.cli", "serve", "--model", model, "--port", str(port),
                                "--n-ctx", str(N_CTX), *args], stdout=log.open("w"), stderr=subprocess.STDOUT,
                               start_new_session=True, env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(process, url, log, 600)
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)


def agent_prompts(model: Model, n_agents: int, n_turns: int, own_functions: int) -> list[list[list[int]]]:
    """benchmarks/server.py's agents, each first turn with the agent's own file."""
    system = data.system_prompt()
    prompts = []
    for i in range(n_agents):
        task = data.session_task(i, n_turns)
        if own_functions:
            own_file = data.python_file(f"agent{i}", own_functions)
            task[0] = dataclasses.replace(task[0], user=f"{task[0].user}\nMy working copy of mathkit/agent{i}.py:\n"
                                                         f"```\n{own_file}```")
        prompts.append([model.tokenize(data.render(system, task[:k], task[k], shape="append"), special=True)
                        for k in range(n_turns)])
    return prompts


def run(url: str, agents: list[list[list[int]]], gen: int) -> tuple[list[list[Reply]], float]:
    """Every agent at once (a thread each), each sending its turns one after another."""
    replies: list[list[Reply]] = [[] for _ in agents]

    def agent(i: int) -> None:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=1200)
        for prompt in agents[i]:
            replies[i].append(ask(client, prompt, gen))

    threads = [threading.Thread(target=agent, args=(i,)) for i in range(len(agents))]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return replies, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3-270m")
    for option, default in (("--agents", 8), ("--turns", 4), ("--gen", 16), ("--replicas", 2), ("--own-functions", 10)):
        parser.add_argument(option, type=int, default=default)
    parser.add_argument("--log-dir", type=Path, default=Path("/tmp"))
    args = parser.parse_args()

    model = Model(args.model)
    agents = agent_prompts(model, args.agents, args.turns, args.own_functions)
    system_tokens = len(model.tokenize(data.system_prompt()))
    engines = {"one": ("--threads", str(args.replicas)),
               "ray-affinity": ("--ray", "--replicas", str(args.replicas), "--threads", "1"),
               "ray-default": ("--ray", "--replicas", str(args.replicas), "--threads", "1", "--ray-router", "default")}
    results, loads = {}, {}
    for engine, extra in engines.items():
        with running(args.model, *extra, log=args.log_dir / f"ray_affinity-{engine}.log") as url:
            loads[engine] = os.getloadavg()[0]
            results[engine] = run(url, agents, args.gen)
    prompt_tokens = sum(len(p) for a in agents for p in a)
    last = [a[-1] for a in agents]
    print(f"{args.agents} agents x {args.turns} turns, {prompt_tokens} prompt tokens in all (a shared "
          f"{system_tokens}-token system prompt; each agent's last prompt {min(map(len, last))}..{max(map(len, last))} "
          f"tokens, its own file {args.own_functions} functions), {args.gen} generated per turn; {args.replicas} "
          f"replicas x 1 thread vs one server x {args.replicas} threads, {N_CTX} KV cells each; {os.cpu_count()} cores")
    print(f"  {'engine':13} {'computed':>8} {'x one':>6} {'wall s':>7} {'TTFT p50':>8} {'p95 ms':>7} {'same as one':>11} "
          f"{'load':>5}")
    one_replies, _ = results["one"]
    one_computed = sum(r.computed for a in one_replies for r in a)
    for engine, (replies, wall) in results.items():
        done = [r for a in replies for r in a]
        ttft = [r.ttft for r in done]
        computed = sum(r.computed for r in done)
        same = sum(r.text == o.text for a, b in zip(replies, one_replies) for r, o in zip(a, b))
        print(f"  {engine:13} {computed:>8} {computed / one_computed:>6.2f} {wall:>7.1f} "
              f"{percentile(ttft, 50) * 1000:>8.0f} {percentile(ttft, 95) * 1000:>7.0f} {same:>7}/{len(done)} "
              f"{loads[engine]:>5.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
