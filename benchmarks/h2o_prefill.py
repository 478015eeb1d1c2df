#!/usr/bin/env python3
"""Prefill time of H2O chunked sparse prefill (Tier 2, docs/h2o.md) against exact prefill, side by
side in one run, on the same prompts.

    python benchmarks/h2o_prefill.py [--model gemma3-270m] [--lengths 4096,8192,16384]
                                     [--window 256] [--heavy 256] [--chunk 512] [--threads 2] [--reps 1]

For each length: one context with H2O off and one with it on (same n_batch = the chunk, flash
attention on, the canonical schedule), a fresh session appending the same prompt (prose-like text),
timed; repetitions alternate the two. Prints wall seconds, the process's CPU seconds (user +
system: less sensitive to other processes on a loaded machine than wall time; with --threads 1 no
thread spins at a barrier either), the ratios exact / H2O, and H2O's counters (chunks, memory-set
entries, host time in selection) and top-1 agreement of the last token's logits with exact. A speed
program, not a test: only the ratios inside one run mean much on a shared machine.
"""
from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time

import numpy as np

from pyllamaopt import Context, Model, OptConfig, models


def prompt(model: Model, n: int) -> list[int]:
    text = " ".join(f"Line {i}: the value of item {i} is {i * 7 % 101}." for i in range(n))
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
          "| memory entries | selection s | same top-1 |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for n in lengths:
        tokens = prompt(model, n)
        common = dict(n_ctx=n + 256, n_batch=args.chunk, n_seq_max=2, n_threads=args.threads, flash_attn=True)
        exact_s, h2o_s, exact_cpu, h2o_cpu = [], [], [], []
        with Context(model, config=OptConfig(env={}), **common) as exact_ctx, \
                Context(model, config=OptConfig(env={}, **h2o), **common) as h2o_ctx:
            for rep in range(args.reps):
                order = [("exact", exact_ctx), ("h2o", h2o_ctx)]
                for name, ctx in (order if rep % 2 == 0 else order[::-1]):
                    seconds, cpu, logits, stats = timed_append(ctx, tokens)
                    if name == "exact":
                        exact_s.append(seconds)
                        exact_cpu.append(cpu)
                        exact_logits = logits
                    else:
                        h2o_s.append(seconds)
                        h2o_cpu.append(cpu)
                        h2o_logits, h2o_stats = logits, stats
        e, h = statistics.median(exact_s), statistics.median(h2o_s)
        ec, hc = statistics.median(exact_cpu), statistics.median(h2o_cpu)
        same = bool(np.argmax(exact_logits) == np.argmax(h2o_logits))
        print(f"| {n} | {e:.1f} | {h:.1f} | {e / h:.2f} | {ec:.1f} | {hc:.1f} | {ec / hc:.2f} "
              f"| {h2o_stats['h2o_chunks']} | {h2o_stats['h2o_tokens_kept']} | {h2o_stats['h2o_select_us'] / 1e6:.2f} "
              f"| {same} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
