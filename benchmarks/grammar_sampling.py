#!/usr/bin/env python3
"""Sampling under a JSON Schema on Gemma 3 270M: the grammar's time per token, side by side in one
run, for the reference (schema_full_mask: every token of the vocabulary checked each step) and
the fast path (the top-k allowed tokens taken from the model's 256 favourites when they hold k,
else from every allowed token), with and without schema_fit_max_tokens. The same seeds give the
same tokens in both paths (tests/test_structured.py::test_seeded_sampling_draws_from_what_full_masking_gives):
checked here too.

    python benchmarks/grammar_sampling.py [--seeds 6] [--max-tokens 48] [--temperature 0.9]
"""
from __future__ import annotations

import argparse
import sys
import time

from pyllamaopt import Context, Model, OptConfig, models

SCHEMA = {"type": "object", "required": ["summary", "files"],
          "properties": {"summary": {"type": "string"}, "files": {"type": "array", "items": {"type": "string"}}}}
PROMPT = "Write a long JSON summary of the repository and list every file in it:\n"


def run(model: Model, seeds: int, max_tokens: int, temperature: float, top_k: int, **config: bool) -> dict:
    out = {"tokens": [], "valid": 0, "check_us": 0, "seconds": 0.0}
    with Context(model, n_ctx=2048, n_threads=2, config=OptConfig(env={}, **config)) as ctx:
        for seed in range(seeds):
            s = ctx.session()
            s.append_text(PROMPT)
            before, start = s.stats, time.perf_counter()
            g = s.generate(max_tokens, json_schema=SCHEMA, temperature=temperature, top_k=top_k, seed=seed)
            out["tokens"].append([t.id for t in g])
            out["seconds"] += time.perf_counter() - start
            out["check_us"] += (s.stats - before).schema_check_us
            out["valid"] += bool(g.schema_valid)
            s.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--temperature", type=float, default=0.9)
    args = ap.parse_args()
    model = Model(models.resolve("gemma3-270m"), progress=False)
    print(f"{model.description}; {args.seeds} seeds, max_tokens {args.max_tokens}, temperature {args.temperature}\n")
    print("| top_k | fit max_tokens | path | valid | tokens | grammar µs / token | tok/s | × reference grammar time | same tokens |")
    print("|---|---|---|---|---|---|---|---|---|")
    for top_k in (40, 0):
        for fit in (False, True):
            ref = run(model, args.seeds, args.max_tokens, args.temperature, top_k,
                      schema_full_mask=True, schema_fit_max_tokens=fit)
            fast = run(model, args.seeds, args.max_tokens, args.temperature, top_k, schema_fit_max_tokens=fit)
            for path, r in (("reference", ref), ("fast", fast)):
                n = sum(map(len, r["tokens"]))
                print(f"| {top_k} | {'on' if fit else 'off'} | {path} | {r['valid']}/{args.seeds} | {n} | "
                      f"{r['check_us'] / n:.0f} | {n / r['seconds']:.1f} | {r['check_us'] / ref['check_us']:.3f} | "
                      f"{'yes' if r['tokens'] == ref['tokens'] else 'NO'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
