"""A long session workload in fast-forward through pyllamaopt.client, the server's memory watched.

    python benchmarks/soak.py [--model gemma3-270m] [--turns 600] [--threads 1] [--sample-every 25]

An agent's conversation, turn after turn with no pause (a turn every ~3 s is 30 minutes for 600
turns): each turn appends APPEND new tokens to one session and generates GENERATE tokens (greedy);
when the history would no longer fit the context the session is closed and the conversation goes
on in a new one, as an application would. Around it, every turn, a short-lived session is created
(a shared preamble and a few tokens of its own), generates a little, and is closed; every tenth
turn the long session is forked and the fork closed. Every --sample-every turns the server
process's resident memory, threads and open file descriptors are read from /proc, with the KV
cells in use and the sessions open (/health). At the end: RSS after the warm-up (the first
sample after the first long session was replaced) vs the last and the highest sample (target:
within 5 %), threads and descriptors vs the warm-up's (target: no growth), the median turn time
of each complete long session (each covers the same history lengths: a slowdown over the run
shows as a drift), and the invariant-violation counters (must be 0).
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from served import load_average, process_status, serve  # noqa: E402

from pyllamaopt.client import Client  # noqa: E402

APPEND = 40      # tokens a turn appends
GENERATE = 8     # tokens a turn generates
N_CTX = 4096
PREAMBLE = 128   # tokens every short-lived session starts with (shared: found in the block pool)
TEXT = ("The committee met on a grey morning to review the quarterly figures, the state of the new warehouse, "
        "the complaints about late deliveries and a proposal to replace the old accounting software. After two "
        "hours of discussion it agreed to hire another driver, postpone the software decision and ask the "
        "architects for a cheaper design of the loading bay, then adjourned until the first week of next month.")


def server_state(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/health", timeout=60) as r:
        health = json.load(r)
    with urllib.request.urlopen(url + "/metrics", timeout=60) as r:
        metrics = r.read().decode()
    violations = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                     if line.startswith("cache_invariant_violations_total{"))
    return {"kv_cells": health["kv_cells_used"], "sessions": health["sessions"], "violations": violations}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--turns", type=int, default=600)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--sample-every", type=int, default=25)
    args = parser.parse_args()

    rng = random.Random(0)
    samples: list[dict[str, float]] = []
    turn_seconds: list[float] = []
    per_session: list[list[float]] = [[]]  # turn times of each long session
    created = replaced = 0
    warm_sample: int | None = None
    with tempfile.TemporaryDirectory() as tmp, \
            serve(args.model, "--threads", str(args.threads), "--n-ctx", str(N_CTX), log=Path(tmp) / "server.log") as server, \
            Client(server.address, timeout=300) as client:
        pid = server.process.pid
        vocabulary = client.tokenize(TEXT)  # the ids of ordinary text, whatever the model
        words = lambda n: [rng.choice(vocabulary) for _ in range(n)]  # noqa: E731
        preamble = words(PREAMBLE)
        session = client.create_session(words(APPEND))
        history = session.n_tokens
        started = time.monotonic()
        for turn in range(1, args.turns + 1):
            begin = time.perf_counter()
            if history + APPEND + GENERATE > N_CTX - 2 * PREAMBLE:  # room for the short-lived sessions
                session.close()
                session = client.create_session(words(APPEND))
                history, replaced = session.n_tokens, replaced + 1
                per_session.append([])
            session.append(words(APPEND))
            generation = session.generate(GENERATE, temperature=0)
            for _ in generation:
                pass
            history = history + APPEND + len(generation.tokens)
            with client.create_session(preamble + words(16)) as short:
                short.generate_text(2)
            created += 1
            if turn % 10 == 0:
                session.fork().close()
                created += 1
            turn_seconds.append(time.perf_counter() - begin)
            per_session[-1].append(turn_seconds[-1])
            if turn % args.sample_every == 0:
                sample = {"turn": turn, **process_status(pid), **server_state(server.url),
                          "turn_ms": statistics.median(turn_seconds[-args.sample_every:]) * 1e3}
                samples.append(sample)
                if warm_sample is None and replaced > 0:
                    warm_sample = len(samples) - 1
                print(f"turn {turn:5d}: RSS {sample['rss'] / 2**20:7.1f} MiB, threads {sample['threads']:3d}, "
                      f"fds {sample['fds']:3d}, KV cells {sample['kv_cells']:5.0f}, sessions open "
                      f"{sample['sessions']:2.0f}, history {history:5d}, median turn {sample['turn_ms']:6.0f} ms",
                      flush=True)
        session.close()
        elapsed = time.monotonic() - started
        final = server_state(server.url)

    warm = samples[warm_sample if warm_sample is not None else len(samples) // 2]
    after = samples[samples.index(warm):]
    last, peak = after[-1], max(after, key=lambda s: s["rss"])
    print(f"\n{args.model}, {args.threads} thread(s), n_ctx {N_CTX}: {args.turns} turns in {elapsed / 60:.1f} min "
          f"(append {APPEND}, generate {GENERATE}); long sessions {replaced + 1}, short-lived sessions and forks "
          f"{created}; load average after: {load_average():.1f}")
    print(f"RSS after warm-up (turn {warm['turn']}) {warm['rss'] / 2**20:.1f} MiB, last {last['rss'] / 2**20:.1f} MiB "
          f"({(last['rss'] / warm['rss'] - 1) * 100:+.1f} %), highest {peak['rss'] / 2**20:.1f} MiB "
          f"({(peak['rss'] / warm['rss'] - 1) * 100:+.1f} %); target within 5 %: "
          f"{'met' if peak['rss'] <= warm['rss'] * 1.05 else 'NOT met'}")
    print(f"threads {warm['threads']} -> {last['threads']} (highest {max(s['threads'] for s in after)}), "
          f"fds {warm['fds']} -> {last['fds']} (highest {max(s['fds'] for s in after)})")
    whole = [f"{statistics.median(times) * 1e3:.0f}" for times in per_session[:-1]] or ["-"]
    print(f"median turn of each long session (the same history lengths, turn after turn): {', '.join(whole)} ms; "
          f"invariant violations: {final['violations']:.0f}; sessions open at the end: {final['sessions']:.0f}")


if __name__ == "__main__":
    main()
