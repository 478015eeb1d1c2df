"""Per-token cost of the session protocol's transports vs the in-process API, on one generation.

    python benchmarks/transport_overhead.py [--model gemma3-270m] [--threads 1] [--tokens 128] [--rounds 9] [--memo]

The same generation each time: one history (PROMPT_TOKENS tokens), greedy, --tokens tokens, run
(1) in-process with Session.generate on a Context of this process, (2) over the HTTP stream
(POST /v1/sessions/{id}/generate, server-sent events, read line by line with http.client) and (3) over the gRPC stream through pyllamaopt.client, against one `pyllamaopt serve`
process with the same model and threads. The three run one after the other in every round
(interleaved: a drift of the machine's speed hits all three); before each generation the session
is synced back to the history (the common prefix is kept, the previous generation's tokens
dropped), so each computes the same tokens. The memo is off (LLAMA_OPT_MEMO_ENABLED=0, in this
process and the server's) unless --memo: each token is then one decode step, the steady stream
this measures, not bursts of drafted tokens. Per mode: the median over rounds of the time per
token, from the request to the last token's arrival over the tokens (a server runs ahead of its
reader, so the span between the first and last arrival alone would hide a late first token),
tokens/s, the ratio to in-process, the spread over rounds, and the median time to the first
token; the tokens generated are checked equal in every mode and round, and the forward passes
per token counted.

On a loaded machine wall times say more about the kernel's scheduler than about the transport
(a thread that computes waits in the run queue for a share of the cores that varies from one
process to another), so the CPU time per token is measured too, the work itself, from the request to the last
token: in-process, this process's; over a transport, the server process's (all its threads)
plus this process's (the client). Its ratio to in-process is the transport's cost, but the engine's own CPU time per token
drifts with the load too (caches and cores shared with other processes), by about as much as the
transport costs; so the CPU outside the engine's thread (the server's other threads, the event
loop's included, and the client) is shown apart: "transport ms" per token, and its share of the
in-process CPU time per token. The engine's thread also does the service's own per-token
bookkeeping (the scheduler, metrics): that part is in the ratio, not in the transport column.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from served import load_average, serve, thread_cpu_seconds  # noqa: E402

from pyllamaopt import Context, Model  # noqa: E402
from pyllamaopt.client import Client  # noqa: E402

PROMPT_TOKENS = 256
PROMPT = ("The history of the city begins with a small settlement on the river, where traders from the north "
          "exchanged furs and amber for salt, wine and cloth brought up from the coast. Over the centuries the "
          "settlement grew into a market town with a stone bridge, a cathedral and a university whose scholars "
          "argued about astronomy, law and medicine. Wars, fires and floods destroyed parts of it more than once, "
          "but each time the inhabitants rebuilt their houses in the same narrow streets, so that a visitor today "
          "can still follow the medieval plan from the old harbour to the hill where the castle stood. In the "
          "nineteenth century railways and factories arrived, the population tripled within a generation, and new "
          "districts of apartment blocks spread over the fields beyond the walls. The twentieth century brought "
          "occupation, resistance and reconstruction, and later a slow change from heavy industry to services, "
          "tourism and software.")  # Gemma 3 270M goes on from here for more than 256 tokens, greedily
N_CTX = 2048

# tokens, arrival times (from the request), forward passes, CPU seconds in all and outside the engine's thread
Result = tuple[list[int], list[float], int, float, float]


class CpuMeter:
    """CPU seconds spent between start() and stop(): this process's (in-process: all of it the
    engine's; over a transport: the client's) and the server's threads (pid), the engine's thread
    being the server's busiest."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid

    def start(self) -> None:
        self.client, self.server = time.process_time(), thread_cpu_seconds(self.pid) if self.pid else {}

    def stop(self) -> tuple[float, float]:
        client = time.process_time() - self.client
        if not self.pid:
            return client, 0.0
        after = thread_cpu_seconds(self.pid)
        spent = [after[t] - self.server.get(t, 0.0) for t in after]
        return client + sum(spent), client + sum(spent) - max(spent)


def in_process(model: Model, history: list[int], tokens: int, threads: int) -> Iterator[Callable[[], Result]]:
    meter = CpuMeter(None)
    with Context(model, n_ctx=N_CTX, n_threads=threads) as ctx, ctx.session() as session:
        session.append(history)

        def run() -> Result:
            session.sync(history)
            passes = session.stats.forward_passes
            meter.start()
            start, ids, times = time.perf_counter(), [], []
            for token in session.generate(tokens, temperature=0):
                times.append(time.perf_counter() - start)
                ids.append(token.id)
            return ids, times, session.stats.forward_passes - passes, *meter.stop()

        yield run


class HttpSession:
    """The session protocol's HTTP routes, a connection per request (the server closes idle ones
    after 5 s; connecting is not part of the time per token)."""

    def __init__(self, url: str, history: list[int]) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname, parts.port
        self.id = self.call("POST", "/v1/sessions", {"tokens": history})["session_id"]

    def _send(self, method: str, path: str, body: object) -> http.client.HTTPResponse:
        connection = http.client.HTTPConnection(self.host or "127.0.0.1", self.port, timeout=120)
        connection.request(method, path, body=None if body is None else json.dumps(body),
                           headers={"content-type": "application/json"})
        return connection.getresponse()

    def call(self, method: str, path: str, body: object = None) -> dict:
        response = self._send(method, path, body)
        data = response.read()
        if response.status >= 300:
            raise SystemExit(f"{method} {path}: {response.status} {data!r}")
        return json.loads(data) if data else {}

    def generate(self, tokens: int) -> tuple[list[int], list[float]]:
        start = time.perf_counter()
        response = self._send("POST", f"/v1/sessions/{self.id}/generate",
                              {"max_tokens": tokens, "temperature": 0, "stream": True})
        ids, times = [], []
        for line in response:
            if line.startswith(b"data: "):
                event = json.loads(line[6:])
                if "token" in event:
                    times.append(time.perf_counter() - start)
                    ids.append(event["token"])
        return ids, times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--memo", action="store_true", help="keep the memo on (drafted tokens arrive in bursts)")
    args = parser.parse_args()
    if not args.memo:
        os.environ["LLAMA_OPT_MEMO_ENABLED"] = "0"  # this process's Context and the server's

    model = Model(args.model)
    history = model.tokenize(PROMPT)[:PROMPT_TOKENS]
    with tempfile.TemporaryDirectory() as tmp, \
            serve(args.model, "--threads", str(args.threads), "--n-ctx", str(N_CTX), log=Path(tmp) / "server.log") as server, \
            Client(server.address, timeout=120) as client:
        remote = client.create_session(history)
        over_http = HttpSession(server.url, history)

        meter = CpuMeter(server.process.pid)

        def grpc_run() -> Result:
            remote.sync(history)
            passes = remote.info().stats["forward_passes"]
            meter.start()
            start, ids, times = time.perf_counter(), [], []
            for token in remote.generate(args.tokens, temperature=0):
                times.append(time.perf_counter() - start)
                ids.append(token.id)
            cpu = meter.stop()
            return ids, times, remote.info().stats["forward_passes"] - passes, *cpu

        def http_run() -> Result:
            over_http.call("POST", f"/v1/sessions/{over_http.id}/sync", {"tokens": history})
            passes = over_http.call("GET", f"/v1/sessions/{over_http.id}")["stats"]["forward_passes"]
            meter.start()
            ids, times = over_http.generate(args.tokens)
            cpu = meter.stop()
            return ids, times, over_http.call("GET", f"/v1/sessions/{over_http.id}")["stats"]["forward_passes"] - passes, *cpu

        for local_run in in_process(model, history, args.tokens, args.threads):
            modes = {"in-process": local_run, "HTTP stream": http_run, "gRPC stream": grpc_run}
            for run in modes.values():  # warm-up: first-use costs out of the figures
                run()
            per_token: dict[str, list[float]] = {m: [] for m in modes}
            cpu: dict[str, list[float]] = {m: [] for m in modes}
            transport: dict[str, list[float]] = {m: [] for m in modes}
            first: dict[str, list[float]] = {m: [] for m in modes}
            passes: dict[str, list[int]] = {m: [] for m in modes}
            reference: list[int] | None = None
            for _ in range(args.rounds):
                for mode, run in modes.items():
                    ids, times, n_passes, seconds, outside = run()
                    reference = reference or ids
                    if len(ids) != args.tokens:
                        raise SystemExit(f"{mode}: the generation ended after {len(ids)} tokens; choose fewer --tokens")
                    if ids != reference:
                        raise SystemExit(f"{mode} generated other tokens: {ids[:8]}... vs {reference[:8]}...")
                    per_token[mode].append(times[-1] / len(times))
                    cpu[mode].append(seconds / len(times))
                    transport[mode].append(outside / len(times))
                    first[mode].append(times[0])
                    passes[mode].append(n_passes)

    base, base_cpu = statistics.median(per_token["in-process"]), statistics.median(cpu["in-process"])
    print(f"{model.description}, {args.threads} thread(s), history {len(history)} tokens, {args.tokens} tokens "
          f"generated (greedy, memo {'on' if args.memo else 'off'}), {args.rounds} rounds interleaved; "
          f"load average after: {load_average():.1f}")
    print(f"{'':<12} {'wall':-^60} {'CPU':-^50}")
    print(f"{'mode':<12} {'ms/token':>9} {'tokens/s':>9} {'÷ in-process':>13} {'spread':>13} {'first ms':>9} "
          f"{'ms/token':>9} {'÷ in-process':>13} {'transport ms':>13} {'share':>7} {'passes/token':>12}")
    for mode in per_token:
        median, median_cpu = statistics.median(per_token[mode]), statistics.median(cpu[mode])
        outside = statistics.median(transport[mode])
        spread = f"{min(per_token[mode]) * 1e3:.2f}-{max(per_token[mode]) * 1e3:.2f}"
        print(f"{mode:<12} {median * 1e3:9.2f} {1 / median:9.1f} {median / base:13.3f} {spread:>13} "
              f"{statistics.median(first[mode]) * 1e3:9.1f} {median_cpu * 1e3:9.2f} {median_cpu / base_cpu:13.3f} "
              f"{outside * 1e3:13.2f} {outside / base_cpu:7.1%} {statistics.mean(passes[mode]) / args.tokens:12.3f}")


if __name__ == "__main__":
    main()
