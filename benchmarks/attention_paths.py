#!/usr/bin/env python3
"""Our attention and weight paths against llama.cpp's, side by side in one run: the same bits, the time.

    python benchmarks/attention_paths.py [--path swa-view|shared-kv-tiles|q5_0-as-q8_0|q4_1-rows] [--tokens 11264]
                                         [--points 1024,4096,8192,10240] [--gen 48] [--repeats 2]
                                         [--threads 2]

--path swa-view: the sliding-window view (patches/0013, the default of a canonical context)
against `_set_swa_view(False)` (every sliding-window layer given the whole cache).
--path shared-kv-tiles: flash attention's tiled prefill with each K/V tile converted once for the
query heads that read it (patches/0014, on by default) against upstream's loop
(`ggml_cpu_set_flash_attn_shared_kv_tiles(0)`).
--path q5_0-as-q8_0: Q5_0 weights held as Q8_0 blocks (patches/0016, on by default) against Q5_0
as llama.cpp holds it (a second copy of the model loaded after `_set_q5_0_widened(False)`).
--path q4_1-rows (with `--model smollm2-135m`): Q4_1 batches beyond 16 rows by the multi-row vec_dot
(patches/0020, on by default) against upstream's vec_dot per output (`ggml_cpu_set_q4_1_rows(0)`).

A session appends random tokens in 512-token chunks up to --tokens, then generates --gen tokens
greedily; once with our path and once with llama.cpp's, alternating, --repeats times. Printed: the
forward time per token of the chunks starting at --points, of the whole prefill, and of a
generation pass at the end (a decode step, or a batch checking a memo draft), each the median over
the repeats, with the ratio llama.cpp's ÷ ours; and whether both gave the same logits and tokens
(they must: tests/integration/test_swa_view_gemma.py, tests/test_flash_attn_shared_kv.py,
tests/test_q5_0_as_q8_0.py, tests/integration/test_numerics.py)."""
from __future__ import annotations

import argparse
import ctypes
import random
import statistics

import numpy as np

from pyllamaopt import Context, Model, _core

CHUNK = 512


def run(model: Model, path: str, ours: bool, tokens: list[int], gen: int, threads: int) -> dict:
    with Context(model, n_ctx=len(tokens) + gen + CHUNK, n_batch=CHUNK, n_threads=threads) as ctx:
        if path == "swa-view":
            ctx._core._set_swa_view(ours)
        elif path == "shared-kv-tiles":  # a process-wide ggml setting
            ctypes.CDLL(_core.__file__).ggml_cpu_set_flash_attn_shared_kv_tiles(int(ours))
        elif path == "q4_1-rows":  # a process-wide ggml setting
            ctypes.CDLL(_core.__file__).ggml_cpu_set_q4_1_rows(int(ours))
        s = ctx.session()
        per_chunk = {}
        for pos in range(0, len(tokens), CHUNK):
            chunk = tokens[pos:pos + CHUNK]
            before = s.stats.forward_us
            s.append(chunk)
            per_chunk[pos] = (s.stats.forward_us - before) / 1000 / len(chunk)
        prefill_s = s.stats.forward_us / 1e6
        logits = s.logits().copy()
        before, passes = s.stats.forward_us, s.stats.forward_passes
        generated = [t.id for t in s.generate(gen)]
        step_ms = (s.stats.forward_us - before) / 1000 / max(1, s.stats.forward_passes - passes)
    return {"chunk_ms": per_chunk, "prefill_s": prefill_s, "step_ms": step_ms, "logits": logits, "tokens": generated}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", choices=("swa-view", "shared-kv-tiles", "q5_0-as-q8_0", "q4_1-rows"),
                        default="swa-view")
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--tokens", type=int, default=11264)
    parser.add_argument("--points", default="1024,4096,8192,10240")
    parser.add_argument("--gen", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    models = {True: Model(args.model)}
    if args.path == "q5_0-as-q8_0":  # decided when a model's weights are placed
        _core._set_q5_0_widened(False)
        models[False] = Model(args.model)
        _core._set_q5_0_widened(True)
    else:
        models[False] = models[True]
    model = models[True]
    rng = random.Random(1)
    tokens = [model.bos_token] + [rng.randrange(1000, min(200000, model.n_vocab)) for _ in range(args.tokens - 1)]
    runs: dict[bool, list[dict]] = {True: [], False: []}
    for _ in range(args.repeats):
        for ours in (True, False):
            runs[ours].append(run(models[ours], args.path, ours, tokens, args.gen, args.threads))

    def median(ours: bool, pick) -> float:
        return statistics.median(pick(r) for r in runs[ours])

    same = all(np.array_equal(a["logits"], b["logits"]) and a["tokens"] == b["tokens"]
               for a in runs[True] for b in runs[False])
    print(f"{model.description}; {args.threads} threads; {args.tokens} tokens in {CHUNK}-token chunks, "
          f"{args.gen} generated; medians of {args.repeats}; {args.path}")
    print(f"  {'':<32} {'ours':>9} {'llama.cpp':>12} {'theirs ÷ ours':>13}")
    rows = [(f"chunk at {p}, ms per token", lambda r, p=p: r["chunk_ms"][p]) for p in map(int, args.points.split(","))]
    rows += [(f"prefill of {args.tokens}, s", lambda r: r["prefill_s"]),
             (f"generation pass at {args.tokens}, ms", lambda r: r["step_ms"])]
    for label, pick in rows:
        on, off = median(True, pick), median(False, pick)
        print(f"  {label:<32} {on:>9.3f} {off:>12.3f} {off / on:>13.3f}")
    print(f"  same logits and generated tokens on both paths: {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
