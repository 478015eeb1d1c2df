#!/usr/bin/env python3
"""Prefill time of H2O chunked sparse prefill (Tier 2, docs/h2o.md) against exact prefill, side by
side in one run, on the same prompts.

    python benchmarks/h2o_prefill.py [--model gemma3-270m] [--lengths 4096,8192,16384]
                                     [--window 256] [--heavy 256] [--chunk 512] [--threads 2] [--reps 1]

For each length and repetition: a fresh context with H2O off and one with it on (same n_batch =
the chunk, flash attention on, the canonical schedule; fresh, so that no cell of an earlier prompt
is in the cache), each appending the same prompt (prose-like text, another one each repetition),
timed; repetitions alternate the two. Prints wall seconds, the process's CPU seconds (user + system: less sensitive to
other processes on a loaded machine than wall time; with --threads 1 no thread spins at a barrier
either), the ratios exact / H2O, and H2O's counters (chunks, memory-set entries, host time in
selection) and top-1 agreement of the last token's logits with exact; then two bounds from one more
exact prefill timed chunk by chunk (chunk_seconds): the ratio an H2O without overhead would reach,
and the one no change to the full-attention layers' attention can pass. A speed program, not a
test: only the ratios inside one run mean much on a shared machine.
"""
from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np

from pyllamaopt import Context, Model, OptConfig, models


def prompt(model: Model, n: int, variant: int = 0) -> list[int]:
    """Prose-like text; another variant differs from its first line on, so that no block of one
    is reused (pooled) by the exact context for the next."""
    text = " ".join(f"Line {i}: the value of item {i} is {(i * 7 + variant) % 101}." for i in range(n))
    tokens = model.tokenize(text, add_bos=True)
    assert len(tokens) >= n, "the generated text is too short"
    return tokens[:n]


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def timed_append(ctx: Context, tokens: list[int]) -> tuple[float, float, np.ndarray, dict]:
    s = ctx.session()
    start, cpu = time.perf_counter(), cpu_seconds()
    s.append(tokens)
    seconds, cpu = time.perf_counter() - start, cpu_seconds() - cpu
    logits, stats = s.logits(), s.stats.as_dict()
    s.close()
    return seconds, cpu, logits, stats


def chunk_seconds(make_context: Callable[[], Context], prompts: list[list[int]], chunk: int) -> list[float]:
    """Exact prefill chunk by chunk (the batches it computes anyway), each chunk timed: the first
    prompt whole, the others' first two chunks only, whose medians replace the first's two timings,
    on which the bounds rest. Each prompt in a fresh context (the cells another prompt left in the
    pool would lengthen every chunk's attention, which reads the mask of every cell in use). What bounds any speed-up of H2O, which changes only the full-attention layers' attention
    and leaves the rest of a chunk's work as it is: an ideal H2O chunk after the first costs what
    chunk 1 does (its full-attention layers see at most 2 S keys, which is S + M at M = S), the first
    is exact's chunk 0, and no chunk costs less than chunk 0 (the least attention of all, in every
    layer). So exact / (chunk 0 + (chunks - 1) × chunk 1) is the ratio of an H2O without overhead,
    exact / (chunks × chunk 0) one no method on those layers can pass."""
    timings: list[list[float]] = []
    for k, tokens in enumerate(prompts):
        with make_context() as ctx:
            s = ctx.session()
            timings.append([])
            for start in range(0, len(tokens) if k == 0 else 2 * chunk, chunk):
                t0 = time.perf_counter()
                s.append(tokens[start:start + chunk])
                timings[-1].append(time.perf_counter() - t0)
    seconds = timings[0]
    for i in (0, 1):
        seconds[i] = statistics.median(t[i] for t in timings)
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--lengths", default="4096,8192,16384")
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--heavy", type=int, default=256)
    parser.add_argument("--chunk", type=int, default=512)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=1)
    args = parser.parse_args()

    model = Model(models.resolve(args.model), progress=False)
    lengths = [int(x) for x in args.lengths.split(",")]
    h2o = dict(h2o_enabled=True, h2o_local_window=args.window, h2o_heavy_budget=args.heavy,
               h2o_chunk_size=args.chunk)
    print(f"model {model.description}; L = {args.window}, H = {args.heavy}, S = {args.chunk}; "
          f"{args.threads} threads, {args.reps} repetition(s), exact and H2O alternating\n")
    print("| tokens | exact s | H2O s | exact / H2O | exact CPU s | H2O CPU s | CPU exact / H2O | H2O chunks "
          "| memory entries | selection s | same top-1 | bound: ideal H2O | bound: free full-attention layers |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|")
    for n in lengths:
        common = dict(n_ctx=n + 256, n_batch=args.chunk, n_seq_max=2, n_threads=args.threads, flash_attn=True)
        exact_s, h2o_s, exact_cpu, h2o_cpu = [], [], [], []
        exact_context = lambda: Context(model, config=OptConfig(env={}), **common)  # noqa: E731
        for rep in range(args.reps):
            tokens = prompt(model, n, rep)
            order = [("exact", exact_context), ("h2o", lambda: Context(model, config=OptConfig(env={}, **h2o), **common))]
            for name, make in (order if rep % 2 == 0 else order[::-1]):
                with make() as ctx:
                    seconds, cpu, logits, stats = timed_append(ctx, tokens)
                if name == "exact":
                    assert stats["tokens_prefilled"] == n, "the exact context reused an earlier prompt"
                    exact_s.append(seconds)
                    exact_cpu.append(cpu)
                    exact_logits = logits
                else:
                    h2o_s.append(seconds)
                    h2o_cpu.append(cpu)
                    h2o_logits, h2o_stats = logits, stats
        chunks = chunk_seconds(exact_context, [prompt(model, n, args.reps + k) for k in range(5)], args.chunk)
        e, h = statistics.median(exact_s), statistics.median(h2o_s)
        ec, hc = statistics.median(exact_cpu), statistics.median(h2o_cpu)
        same = bool(np.argmax(exact_logits) == np.argmax(h2o_logits))
        ideal = sum(chunks) / (chunks[0] + (len(chunks) - 1) * chunks[1])
        free = sum(chunks) / (len(chunks) * chunks[0])
        print(f"| {n} | {e:.1f} | {h:.1f} | {e / h:.2f} | {ec:.1f} | {hc:.1f} | {ec / hc:.2f} "
              f"| {h2o_stats['h2o_chunks']} | {h2o_stats['h2o_tokens_kept']} | {h2o_stats['h2o_select_us'] / 1e6:.2f} "
              f"| {same} | {ideal:.2f} | {free:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
