#!/usr/bin/env python3
"""Speculative prefill's time to first token (TTFT) against exact prefill, side by side in one run.

    python benchmarks/spec_prefill_ttft.py [--lengths 2048,4096,8192,16384] [--keeps 0.1,0.2,0.3,0.5]
        [--layers 6] [--settings KEEP/LAYERS[/WINDOW],...] [--repeats 2] [--threads 2] [--json out.json]

Each prompt is a needle input of benchmarks/quality.py (passkey at 50 % depth, with its question),
computed in a new session: exact prefill (speculative prefill off), then the same prompt with
spec_prefill_enabled at each keep fraction and scorer size (the model's first --layers layers).
TTFT = append of the prompt + its logits, scoring included. The runs of one length alternate
(exact, keep 0.1, 0.2, ..., exact, ...) and each figure is the median over --repeats, so that the
ratios compare timings taken side by side. Also printed: the tokens the model computed, the
scorer's share of the TTFT, and whether the first token is exact prefill's."""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from quality import needle_case  # noqa: E402

from pyllamaopt import Context, Model, OptConfig, models  # noqa: E402


def ttft(ctx: Context, prompt: list[int], tier2: dict) -> dict:
    session = ctx.session()
    try:
        session.configure_tier2(**tier2)
        start = time.perf_counter()
        session.append(prompt)
        logits = session.logits()
        elapsed = time.perf_counter() - start
        stats = session.stats
        return {"ttft_s": elapsed, "first": int(np.argmax(logits)), "tokens_prefilled": stats.tokens_prefilled,
                "tokens_scored": stats.spec_prefill_tokens_scored, "score_s": stats.spec_prefill_score_us / 1e6}
    finally:
        session.discard()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--lengths", default="2048,4096,8192")
    parser.add_argument("--keeps", default="0.1,0.2,0.3,0.5")
    parser.add_argument("--layers", default="6", help="scorer sizes (the model's first N layers), comma list")
    parser.add_argument("--settings", default="",
                        help="instead of --keeps × --layers: KEEP/LAYERS[/WINDOW], e.g. 0.1/2,0.3/2,0.3/6/1 "
                             "(WINDOW: spec_prefill_window; the engine's default without it)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    defaults = OptConfig(env={})
    pairs = [(float(k), int(n), int(w[0]) if w else defaults.spec_prefill_window)
             for k, n, *w in (s.split("/") for s in args.settings.split(",") if s)] or \
        [(float(k), int(n), defaults.spec_prefill_window)
         for n in args.layers.split(",") for k in args.keeps.split(",")]

    model = Model(models.resolve(args.model), progress=False)
    ctx = Context(model, n_ctx=max(lengths) + 256, n_seq_max=2, n_threads=args.threads,
                  config=OptConfig(env={}, dedup_enabled=False, diff_enabled=False, spec_prefill_enabled=True))
    print(f"model {model.description}; {args.threads} threads; {model.n_layer} layers", flush=True)
    settings = [("exact", None, None, None)] + [(f"keep {k:g} / {n} layers / window {w}", k, n, w) for k, n, w in pairs]
    rows = []
    for n_tokens in lengths:
        case = needle_case(model, n_tokens, 50, "passkey", 0)
        prompt = case.context + case.question
        runs: dict[str, list[dict]] = {label: [] for label, *_ in settings}
        for _ in range(args.repeats):
            for label, keep, layers, window in settings:
                tier2 = {"spec_prefill_enabled": False} if keep is None else {
                    "spec_prefill_enabled": True, "spec_prefill_keep": keep, "spec_prefill_layers": layers,
                    "spec_prefill_window": window, "spec_prefill_min_tokens": 256}
                runs[label].append(ttft(ctx, prompt, tier2))
        exact_s = statistics.median(r["ttft_s"] for r in runs["exact"])
        exact_first = runs["exact"][0]["first"]
        for label, keep, layers, _ in settings:
            mine = runs[label]
            median = statistics.median(r["ttft_s"] for r in mine)
            rows.append({"n_tokens": len(prompt), "setting": label, "keep": keep, "layers": layers, "ttft_s": median,
                         "speedup": exact_s / median, "score_s": statistics.median(r["score_s"] for r in mine),
                         "tokens_prefilled": mine[0]["tokens_prefilled"], "tokens_scored": mine[0]["tokens_scored"],
                         "first_token_exact": mine[0]["first"] == exact_first})
            r = rows[-1]
            print(f"  {r['n_tokens']:>6} {label:<33} TTFT {median:7.2f}s  x{r['speedup']:.2f}  "
                  f"scorer {r['score_s']:.2f}s  computed {r['tokens_prefilled']}  first token = exact: "
                  f"{r['first_token_exact']}", flush=True)
    ctx.close()
    print("\n| prompt tokens | setting | TTFT s (median) | speedup vs exact | scorer s | tokens computed by the model "
          "| first token = exact's |\n|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['n_tokens']} | {r['setting']} | {r['ttft_s']:.2f} | {r['speedup']:.2f}x | {r['score_s']:.2f} | "
              f"{r['tokens_prefilled']} | {'yes' if r['first_token_exact'] else 'no'} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
