#!/usr/bin/env python3
"""Prompt processing (pp) and generation (tg) speed of pyllamaopt against upstream llama-bench
built from the same pinned llama.cpp source with the same CPU flags, in one run.

    python benchmarks/bench_pp_tg.py [--model PATH] [--threads 2] [--reps 5]

Both sides: Gemma 3 270M, flash attention on (llama-bench's CPU default), 512-token batches,
random prompt tokens (as llama-bench uses). Upstream's tg decodes without sampling; ours
samples greedily over the 262k vocabulary, as real generation does.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import build_upstream  # noqa: E402

from pyllamaopt import Context, Model, models  # noqa: E402


def upstream(bench: Path, model: Path, n_prompt: int, n_gen: int, threads: int, reps: int) -> dict[str, float]:
    out = subprocess.run([str(bench), "-m", str(model), "-p", str(n_prompt), "-n", str(n_gen), "-t", str(threads),
                          "-r", str(reps), "-fa", "1", "-o", "json"], capture_output=True, text=True, check=True)
    rows = json.loads(out.stdout)
    return {"pp": next(r["avg_ts"] for r in rows if r["n_prompt"]), "tg": next(r["avg_ts"] for r in rows if r["n_gen"])}


def ours(model: Model, n_prompt: int, n_gen: int, threads: int, reps: int) -> tuple[dict[str, float], dict]:
    rng = random.Random(0)
    pp, tg = [], []
    with Context(model, n_ctx=n_prompt + n_gen + 64, n_batch=512, n_threads=threads, flash_attn=True) as ctx:
        warm = ctx.session()
        warm.append([model.bos_token] + [rng.randrange(model.n_vocab) for _ in range(63)])
        warm.close()
        for _ in range(reps):
            session = ctx.session()
            prompt = [model.bos_token] + [rng.randrange(model.n_vocab) for _ in range(n_prompt - 1)]
            start = time.perf_counter()
            session.append(prompt)
            pp.append(n_prompt / (time.perf_counter() - start))
            session.close()
        for _ in range(reps):
            session = ctx.session()
            session.append([model.bos_token])
            start = time.perf_counter()
            generated = sum(1 for _ in session.generate(n_gen))
            tg.append(generated / (time.perf_counter() - start))
            session.close()
        counters = ctx.stats.as_dict()
    return {"pp": statistics.mean(pp), "tg": statistics.mean(tg)}, counters


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--n-prompt", type=int, default=512)
    parser.add_argument("--n-gen", type=int, default=128)
    args = parser.parse_args()

    path = models.resolve(args.model)
    bench = build_upstream.build(("llama-bench",)) / "llama-bench"
    model = Model(path, progress=False)
    theirs = upstream(bench, path, args.n_prompt, args.n_gen, args.threads, args.reps)
    mine, counters = ours(model, args.n_prompt, args.n_gen, args.threads, args.reps)

    print(f"model {model.description}, {args.threads} threads, {args.reps} repetitions each\n")
    print(f"{'test':<8} {'llama-bench tok/s':>18} {'pyllamaopt tok/s':>17} {'ratio':>7}")
    for test, n in (("pp", args.n_prompt), ("tg", args.n_gen)):
        print(f"{test}{n:<6} {theirs[test]:>18.1f} {mine[test]:>17.1f} {mine[test] / theirs[test]:>7.3f}")
    print(f"\npyllamaopt work counters: tokens_prefilled={counters['tokens_prefilled']} "
          f"tokens_decoded={counters['tokens_decoded']} tokens_generated={counters['tokens_generated']} "
          f"forward_passes={counters['forward_passes']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
