#!/usr/bin/env python3
"""What an echo with logprobs costs (issue 43 item 4): a prompt's own log-probabilities
(Session.score: every position computed afresh with its output row) against the same prompt
computed plainly, cold (nothing cached) and warm (its prefix cached by another session), side by
side in one process; medians of --reps runs, and the work counters.

    python benchmarks/echo_logprobs.py [--lengths 64,256,1024] [--reps 3] [--threads 2]
"""
from __future__ import annotations

import argparse
import statistics
import time

from pyllamaopt import Context, Model

TEXT = " ".join(f"Line {i}: the quick brown fox number {i} jumps over the lazy dog." for i in range(400))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3-270m", help="a path or a model name (pyllamaopt.models)")
    parser.add_argument("--lengths", default="64,256,1024")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    model = Model(args.model)
    all_tokens = model.tokenize(TEXT)
    print("| prompt tokens | plain cold (s) | plain warm (s) | score (s) | score / cold | computed: cold, warm, score |")
    print("|---|---|---|---|---|---|")
    for n in (int(x) for x in args.lengths.split(",")):
        tokens = all_tokens[:n]
        times: dict[str, list[float]] = {"cold": [], "warm": [], "score": []}
        computed: dict[str, int] = {}
        for _ in range(args.reps):
            with Context(model, n_ctx=max(2048, n + 256), n_threads=args.threads) as ctx:
                # the context's one-time costs (graph allocation, the buffer of every row's logits) first
                ctx.session().score(all_tokens[-64:])
                for kind in ("cold", "warm", "score"):  # warm: the cold session's blocks are cached
                    session = ctx.session()
                    before = session.stats
                    start = time.perf_counter()
                    if kind == "score":
                        session.score(tokens)
                    else:
                        session.append(tokens)
                        session.logits()
                    times[kind].append(time.perf_counter() - start)
                    computed[kind] = (session.stats - before).tokens_prefilled
                    if kind != "cold":
                        session.close()
        median = {k: statistics.median(v) for k, v in times.items()}
        print(f"| {n} | {median['cold']:.3f} | {median['warm']:.3f} | {median['score']:.3f} | "
              f"{median['score'] / median['cold']:.2f} | {computed['cold']}, {computed['warm']}, {computed['score']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
