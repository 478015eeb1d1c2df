#!/usr/bin/env python3
"""`pyllamaopt serve` restarted after a crash, with the disk tier written behind (issue 42), on
Gemma 3 270M, in one run:

  restart     an agent's request (its history: the agent trace's first turn with at least --tokens
              tokens, streamed, greedy) sent to a server on an empty directory (cold); the server
              killed with SIGKILL once the history is on disk (how long after the first token it
              got there is reported), started again on the directory, and the same request sent
              again (the client's retry): its time to first token ÷ the cold one (goal <= 0.05).
              Then the same with write-behind off (LLAMA_OPT_PERSIST_WRITE_BEHIND=0, the behaviour
              before: nothing is on disk after the kill) and, for comparison, a clean restart
              (SIGTERM: the drain saves the sessions). Server start-up (to /health) is reported
              apart; the entry's pages stay in the page cache, as after a process crash.
  cost        the agent trace (benchmarks/server.py's append shape, --turns turns) through a server
              with write-behind on and one with it off, each on an empty directory, in the order
              on, off, off, on (linear drift of the machine's speed cancels): wall time on ÷ off
              (goal <= 1.02); the bytes the server wrote to files (/proc/PID/io write_bytes) per
              prompt token it computed; the directory's size at the end; answers equal across runs.

    python benchmarks/restart.py [--tokens 8192] [--turns 22] [--gen 16] [--parts restart,cost]
"""
from __future__ import annotations

import argparse
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import server as bench  # noqa: E402  (the server benchmark's client, prompts and process start)
from served import load_average, stop  # noqa: E402

import pyllamaopt  # noqa: E402
from pyllamaopt import Model, PersistStore, models  # noqa: E402

BLOCK = 64
ON_DISK_TIMEOUT = 120.0


@dataclass
class Running:
    """One server process on a persist directory."""
    process: subprocess.Popen
    server: bench.Server
    ready_s: float     # from the process start to its first answer

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def written(self) -> int:
        """Bytes the process has written to files so far (the page cache's dirtied bytes)."""
        fields = dict(line.split(": ") for line in Path(f"/proc/{self.process.pid}/io").read_text().splitlines())
        return int(fields["write_bytes"])


def start(model: Model, directory: Path, write_behind: bool, n_ctx: int) -> Running:
    port = bench.free_port()
    command, env = bench.server_command("pyllamaopt", Path(model.path), None, port, n_ctx, 1)
    env.update(LLAMA_OPT_PERSIST_ENABLED="1", LLAMA_OPT_PERSIST_DIR=str(directory),
               LLAMA_OPT_PERSIST_WRITE_BEHIND="1" if write_behind else "0")
    log = directory.parent / f"server-{directory.name}.log"
    began = time.perf_counter()
    # outside the checkout: its pyllamaopt/ (without the built extension) must not shadow the installed one
    process = subprocess.Popen(command, stdout=log.open("a"), stderr=subprocess.STDOUT, cwd=directory.parent, env=env)
    server = bench.Server("pyllamaopt", port, model.kv_bytes_per_token)
    bench.wait_ready(process, server, log)
    return Running(process, server, time.perf_counter() - began)


def ask(running: Running, prompt: list[int], gen: int) -> tuple[bench.Reply, float]:
    """The reply, and when (perf_counter) its first token arrived."""
    sent = time.perf_counter()
    reply = bench.ask(running.server.client(), prompt, gen)
    return reply, sent + reply.ttft


def seconds_to_disk(directory: Path, n_tokens: int, since: float) -> float:
    """Seconds from `since` until an entry holds at least `n_tokens` tokens."""
    deadline = time.perf_counter() + ON_DISK_TIMEOUT
    while not any(e.n_tokens >= n_tokens for e in PersistStore(directory).entries()):
        if time.perf_counter() > deadline:
            raise SystemExit(f"no entry of {n_tokens} tokens in {directory} after {ON_DISK_TIMEOUT:.0f} s")
        time.sleep(0.02)
    return time.perf_counter() - since


def history_prompt(model: Model, n_tokens: int) -> list[int]:
    """The agent trace's first turn whose prompt has at least n_tokens tokens."""
    n_turns = 22
    while True:
        prompts = bench.trace_prompts(model, "append", n_turns)
        longer = [p for p in prompts if len(p) >= n_tokens]
        if longer:
            return longer[0]
        n_turns *= 2


def bench_restart(model: Model, work: Path, n_tokens: int, gen: int) -> None:
    prompt = history_prompt(model, n_tokens)
    n_ctx = len(prompt) + gen + 256
    restorable = (len(prompt) - BLOCK) // BLOCK * BLOCK  # the last chunk is always computed
    print(f"\n## restart: a {len(prompt)}-token agent history (n_ctx {n_ctx}), {gen} tokens, greedy, streamed")
    rows: list[tuple[str, bench.Reply, float, bench.Reply]] = []  # label, reply, ready s, its cold reply

    on = work / "write-behind-on"
    first = start(model, on, True, n_ctx)
    cold_on, first_token = ask(first, prompt, gen)
    to_disk = seconds_to_disk(on, restorable, first_token)
    first.kill()
    again = start(model, on, True, n_ctx)
    rows += [("cold, write-behind on", cold_on, first.ready_s, cold_on),
             ("kill -9, restart (write-behind on)", ask(again, prompt, gen)[0], again.ready_s, cold_on)]
    stop(again.process)

    off = work / "write-behind-off"
    first = start(model, off, False, n_ctx)
    cold_off = ask(first, prompt, gen)[0]
    first.kill()
    again = start(model, off, False, n_ctx)
    rows += [("cold, write-behind off", cold_off, first.ready_s, cold_off),
             ("kill -9, restart (write-behind off)", ask(again, prompt, gen)[0], again.ready_s, cold_off)]
    stop(again.process)  # the drain saves the session
    clean = start(model, off, False, n_ctx)
    rows.append(("SIGTERM, restart (write-behind off)", ask(clean, prompt, gen)[0], clean.ready_s, cold_off))
    stop(clean.process)

    print(f"  the history on disk {to_disk:.2f} s after its first token (write-behind on); load {load_average():.1f}")
    print(f"  {'run':38} {'TTFT ms':>8} {'/ cold':>7} {'restored':>8} {'computed':>8} {'ready s':>7} "
          f"{'answer = cold':>13}")
    for label, reply, ready, cold in rows:
        print(f"  {label:38} {reply.ttft * 1000:>8.0f} {reply.ttft / cold.ttft:>7.3f} {reply.restored:>8} "
              f"{reply.computed:>8} {ready:>7.1f} {'yes' if reply.text == cold.text else 'NO':>13}")


@dataclass
class TraceRun:
    write_behind: bool
    replies: list[bench.Reply]
    wall: float
    written: int     # bytes the server wrote to files during the trace
    on_disk: int     # the directory's entries at the end, before the server stops


def run_trace(model: Model, directory: Path, write_behind: bool, prompts: list[list[int]], gen: int) -> TraceRun:
    running = start(model, directory, write_behind, bench.N_CTX)
    try:
        written = running.written()
        began = time.perf_counter()
        replies = bench.run_turns(running.server.client(), prompts, gen)
        wall = time.perf_counter() - began
        return TraceRun(write_behind, replies, wall, running.written() - written, PersistStore(directory).size)
    finally:
        stop(running.process)


def bench_cost(model: Model, work: Path, n_turns: int, gen: int) -> None:
    prompts = bench.trace_prompts(model, "append", n_turns)
    print(f"\n## cost: the agent trace, {n_turns} turns, prompts {len(prompts[0])}..{len(prompts[-1])} tokens, "
          f"{gen} tokens each; runs in the order on, off, off, on")
    runs = [run_trace(model, work / f"trace-{i}", write_behind, prompts, gen)
            for i, write_behind in enumerate((True, False, False, True))]
    reference = [r.text for r in runs[1].replies]
    print(f"  {'write-behind':12} {'wall s':>7} {'computed':>8} {'written MB':>10} {'bytes/computed':>14} "
          f"{'on disk MB':>10} {'answers = off':>13}")
    for run in runs:
        computed = sum(r.computed for r in run.replies)
        same = sum(r.text == t for r, t in zip(run.replies, reference))
        print(f"  {'on' if run.write_behind else 'off':12} {run.wall:>7.1f} {computed:>8} {run.written / 2**20:>10.1f} "
              f"{run.written / max(1, computed):>14.0f} {run.on_disk / 2**20:>10.1f} {same:>10}/{len(reference)}")
    wall_on = statistics.fmean(r.wall for r in runs if r.write_behind)
    wall_off = statistics.fmean(r.wall for r in runs if not r.write_behind)
    print(f"  wall on / off: {wall_on / wall_off:.3f} (goal <= 1.02); load {load_average():.1f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--tokens", type=int, default=8192, help="the restart's agent history: at least this long")
    parser.add_argument("--turns", type=int, default=22, help="turns of the agent trace (cost)")
    parser.add_argument("--gen", type=int, default=16)
    parser.add_argument("--parts", default="restart,cost")
    args = parser.parse_args()
    model = Model(models.resolve(args.model))
    print(f"model {model.description}; 2 threads; pyllamaopt from {Path(pyllamaopt.__file__).parent}")
    with tempfile.TemporaryDirectory(prefix="bench-restart-") as tmp:
        work = Path(tmp)
        for part in args.parts.split(","):
            if part == "restart":
                bench_restart(model, work, args.tokens, args.gen)
            elif part == "cost":
                bench_cost(model, work, args.turns, args.gen)
            else:
                raise SystemExit(f"unknown part {part}: restart or cost")
    return 0


if __name__ == "__main__":
    sys.exit(main())
