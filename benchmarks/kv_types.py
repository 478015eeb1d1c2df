#!/usr/bin/env python3
"""Quantized KV caches (kv_type, issue 46) against F16: what a type saves and what it costs.

    python benchmarks/kv_types.py [--types f16,q8_0,q4_0,q8_0/q4_0] [--lengths 1024,4096,8192 ('': none)]
        [--depths 10,50,90] [--variants passkey,code,multi] [--trace-turns 12] [--threads 2]
        [--budget-gib 1] [--session-tokens 8192] [--no-llama-server] [--no-llama-perplexity] [--json out.json]

A type is one for K and V ("q8_0") or a pair, K's then V's ("q8_0/q4_0": kv_type_k and kv_type_v,
llama-server's --cache-type-k q8_0 --cache-type-v q4_0). For each, in a context of its own (the same
inputs as benchmarks/quality.py):
  capacity     KV bytes per token (Context.kv_bytes_per_token) and how many sessions of
               --session-tokens tokens a KV budget of --budget-gib GiB keeps warm
  needle grid  quality.py's needles by length × depth × variant: recall of the greedy answer,
               the prefill's tokens per second, decode tokens per second, and KL(f16 || type) /
               top-1 agreement of the answer's first token
  agent trace  quality.py's conversation appended message by message: at every third turn from
               the fourth, KL(f16 || type) and top-1 agreement of the next-token distribution,
               greedy agreement of the generated tokens, and the perplexity of the scripted answer
  llama-server llama.cpp's own server (tools/build_upstream.py: the same tree and CPU flags) with
               --cache-type-k/-v of the types, flash attention, 2 threads: the same needles, each
               prompt computed whole (cache_prompt false): recall, its answers against its own
               f16's and against pyllamaopt's with the type, prefill and decode speed from its own
               timings
  llama-perplexity llama.cpp's own KL tool from the same tree (benchmarks/llama_perplexity.py) with
               -ctk/-ctv of the types, flash attention: the agent trace's text (the tokens our trace
               appends, as text), every token of its second half scored with all before it:
               perplexity, KL and top-1 agreement against its own f16, beside our trace's figures
               (skipped with --no-llama-server as well)
Each type's figures are compared with f16's from the same run and the same engine (ratios side by
side); the machine's load average is printed before and after (wall times under load say little:
only the ratios).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))

import llama_perplexity  # noqa: E402
import quality  # noqa: E402

from pyllamaopt import Context, Model, OptConfig, models  # noqa: E402


def needle_cases(model: Model, lengths: list[int], depths: list[int], variants: list[str]) -> dict[tuple, quality.Case]:
    return {(n, d, v): quality.needle_case(model, n, d, v, 0) for n in lengths for d in depths for v in variants}


def needle_runs(ctx: Context, model: Model, cases: dict[tuple, quality.Case], answer_tokens: int) -> dict[tuple, dict]:
    out = {}
    for key, case in cases.items():
        session = ctx.session()
        start = time.perf_counter()
        session.append(case.context + case.question)
        prefill = time.perf_counter() - start
        logits = session.logits()
        tokens, decode = quality.generate(session, answer_tokens)
        session.discard()
        out[key] = dict(logits=logits, tokens=tokens, recall=case.expected in model.detokenize(tokens),
                        prefill_tok_s=(len(case.context) + len(case.question)) / prefill, decode_tok_s=decode)
    return out


def cache_types(kv_type: str) -> tuple[str, str]:
    """K's and V's types of a --types entry: "q8_0" (both) or "q8_0/q4_0" (K/V)."""
    k, _, v = kv_type.partition("/")
    return k, v or k


def llama_server_needles(model: Model, kv_type: str, cases: dict[tuple, quality.Case], n_ctx: int,
                         answer_tokens: int) -> dict[tuple, dict]:
    """The needles on llama-server with --cache-type-k/-v of kv_type, each prompt computed whole."""
    import build_upstream
    from server import running

    server_bin = build_upstream.build(("llama-server",)) / "llama-server"
    k, v = cache_types(kv_type)
    out = {}
    with running("llama-server", model, server_bin, n_ctx, extra=("--cache-type-k", k, "--cache-type-v", v)) as server:
        for key, case in cases.items():
            body = {"prompt": case.context + case.question, "n_predict": answer_tokens, "temperature": 0,
                    "cache_prompt": False, "return_tokens": True}
            request = urllib.request.Request(f"http://127.0.0.1:{server.port}/completion", json.dumps(body).encode(),
                                             {"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=1800) as response:
                reply = json.loads(response.read())
            timings = reply["timings"]
            out[key] = dict(tokens=reply["tokens"], recall=case.expected in model.detokenize(reply["tokens"]),
                            prefill_tok_s=timings["prompt_per_second"], decode_tok_s=timings["predicted_per_second"])
    return out


def speed_ratios(runs: dict[tuple, dict], base: dict[tuple, dict], lengths: list[int]) -> tuple[dict[int, float], float]:
    """Prefill speed × f16's per length (mean of the needles' ratios), decode speed × f16's: the
    ratio of the mean speeds (a needle's answer is a few tokens, and where a type's answer differs
    the memo drafts differently: per-needle decode ratios swing by 2 ×)."""
    prefill = {n: quality.mean(runs[k]["prefill_tok_s"] / base[k]["prefill_tok_s"] for k in runs if k[0] == n)
               for n in lengths}
    return prefill, (quality.mean(runs[k]["decode_tok_s"] for k in runs)
                     / quality.mean(base[k]["decode_tok_s"] for k in runs))


def pass_figures(r: dict, base: dict, served: dict | None) -> str:
    """One type's figures as soon as its pass ends (a run stopped midway keeps what it measured);
    the needles' and the trace's only where they ran."""
    parts = [needle_figures(r["needles"])] if r["needles"] else []
    turns = list(zip(base["trace"], r["trace"]))
    if turns:
        parts.append(f"trace KL vs f16 {quality.mean(quality.kl(b.logits, t.logits) for b, t in turns):.4f}, top-1 "
                     f"{quality.mean(float(b.logits.argmax() == t.logits.argmax()) for b, t in turns):.2f}")
    if served:
        parts.append(f"llama-server {needle_figures(served)}")
    return "; ".join(parts)


def needle_figures(runs: dict[tuple, dict]) -> str:
    needles = runs.values()
    return (f"recall {quality.mean(float(v['recall']) for v in needles):.2f}, prefill tok/s "
            f"{quality.mean(v['prefill_tok_s'] for v in needles):.0f}, decode tok/s "
            f"{quality.mean(v['decode_tok_s'] for v in needles):.1f}")


def trace_text(model: Model, n_turns: int) -> str:
    """The agent trace's conversation as text: exactly the tokens quality.trace_turns appends (BOS aside)
    when tokenized with special tokens."""
    tokens = [t for _, segments, answer in quality.trace_segments(model, n_turns)
              for t in [*(x for part, _ in segments for x in part), *answer]]
    return model.detokenize(tokens[1:], special=True)


def agreement(a: list[int], b: list[int]) -> float:
    """Share of the generated tokens equal up to the first difference."""
    same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return same / max(1, len(a))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--types", default="f16,q8_0,q4_0")
    parser.add_argument("--lengths", type=numbers, default="1024,4096,8192",
                        help="the needles' prompt lengths ('': no needle grid, and no needle columns)")
    parser.add_argument("--depths", type=numbers, default="10,50,90")
    parser.add_argument("--variants", default=",".join(quality.VARIANTS))
    parser.add_argument("--answer-tokens", type=int, default=quality.ANSWER_TOKENS)
    parser.add_argument("--trace-turns", type=int, default=12, help="agent-trace turns (0: none)")
    parser.add_argument("--gen", type=int, default=16, help="generated tokens per measured trace turn")
    parser.add_argument("--ppl-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--budget-gib", type=float, default=1.0)
    parser.add_argument("--session-tokens", type=int, default=8192)
    parser.add_argument("--no-llama-server", dest="llama_server", action="store_false",
                        help="neither llama-server nor llama-perplexity")
    parser.add_argument("--no-llama-perplexity", dest="llama_perplexity", action="store_false")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    lengths, depths, variants = args.lengths, args.depths, [v for v in args.variants.split(",") if v]
    if not (lengths and depths and variants) and args.trace_turns < 4:
        parser.error("nothing to measure: give needles (--lengths, --depths, --variants) or --trace-turns 4 or more "
                     "(the trace measures every third turn from the fourth)")

    types = args.types.split(",")
    if types[0] != "f16":
        types.insert(0, "f16")  # everything is compared with it
    model = Model(models.resolve(args.model), progress=False)
    n_ctx = max(lengths + [8192 if args.trace_turns else 0]) + 256
    cases = needle_cases(model, lengths, depths, variants)
    print(f"model {model.description}; {args.threads} threads; n_ctx {n_ctx}; load {os.getloadavg()[0]:.1f}", flush=True)

    results, served = {}, {}
    for kv_type in types:  # each type on both engines before the next: drift of the machine hits both alike
        t0 = time.perf_counter()
        k, v = cache_types(kv_type)
        with Context(model, n_ctx=n_ctx, n_seq_max=2, n_threads=args.threads,
                     config=OptConfig(env={}, kv_type_k=k, kv_type_v=v)) as ctx:
            needles = needle_runs(ctx, model, cases, args.answer_tokens)
            trace = (quality.trace_turns(quality.EXACT, ctx, model, args.trace_turns, args.gen, args.ppl_tokens)
                     if args.trace_turns else [])  # (trace_turns(0) would still append the first turn)
            bytes_per_token = ctx.kv_bytes_per_token
        results[kv_type] = dict(bytes_per_token=bytes_per_token, needles=needles, trace=trace)
        if args.llama_server and cases:
            served[kv_type] = llama_server_needles(model, kv_type, cases, n_ctx, args.answer_tokens)
        print(f"{kv_type}: {time.perf_counter() - t0:.0f} s, load {os.getloadavg()[0]:.1f}; "
              f"{pass_figures(results[kv_type], results['f16'], served.get(kv_type))}", flush=True)
    scored = {}
    if args.llama_server and args.llama_perplexity and args.trace_turns:
        for kv_type, s in llama_perplexity.scores(model, trace_text(model, args.trace_turns),
                                                  {t: cache_types(t) for t in types}, args.threads):
            scored[kv_type] = s
            print(f"llama-perplexity {kv_type}: load {os.getloadavg()[0]:.1f}; ppl {s.ppl:.3f}, KL vs its f16 "
                  f"{s.kl:.4f}, top-1 {s.top1:.3f}", flush=True)

    base = results["f16"]
    budget = int(args.budget_gib * 2**30)
    rows = []
    for kv_type in types:
        r = results[kv_type]
        sessions = budget // (args.session_tokens * r["bytes_per_token"])
        row = dict(kv_type=kv_type, bytes_per_token=r["bytes_per_token"], sessions=sessions,
                   sessions_vs_f16=sessions / max(1, budget // (args.session_tokens * base["bytes_per_token"])))
        if cases:
            pairs = [(base["needles"][k], v) for k, v in r["needles"].items()]
            prefill, decode = speed_ratios(r["needles"], base["needles"], lengths)
            row.update(recall=quality.mean(float(v["recall"]) for _, v in pairs),
                       needle_kl=quality.mean(quality.kl(b["logits"], v["logits"]) for b, v in pairs),
                       needle_top1=quality.mean(float(b["logits"].argmax() == v["logits"].argmax()) for b, v in pairs),
                       prefill_vs_f16=prefill, decode_vs_f16=decode)
        if base["trace"]:
            turns = list(zip(base["trace"], r["trace"]))
            row.update(trace_kl=quality.mean(quality.kl(b.logits, t.logits) for b, t in turns),
                       trace_top1=quality.mean(float(b.logits.argmax() == t.logits.argmax()) for b, t in turns),
                       trace_greedy=quality.mean(agreement(t.generated, b.generated) for b, t in turns),
                       trace_ppl=math.exp(quality.mean(x for t in r["trace"] for x in t.nll)))
        rows.append(row)
    needles_said = f"lengths {lengths} × depths {depths} × {variants}" if cases else "none"
    print(f"\nKV budget {args.budget_gib:g} GiB, sessions of {args.session_tokens} tokens; needles: {needles_said}; "
          f"agent trace: {len(base['trace'])} measured turns; load after the run {os.getloadavg()[0]:.1f}\n")
    print("pyllamaopt (KL, top-1 and greedy agreement against its f16)\n")
    print_table(rows, our_columns(lengths if cases else None, bool(base["trace"])))
    ours = {row["kv_type"]: row for row in rows}
    rows += served_table(served, results, lengths)
    rows += perplexity_table(scored, ours)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


Column = tuple[str, Callable[[dict], str]]


def our_columns(lengths: list[int] | None, trace: bool) -> list[Column]:
    """The table's columns: capacity, then the needles' (lengths None: no needle grid) and the trace's
    where they ran."""
    columns: list[Column] = [("kv_type", lambda r: r["kv_type"]), ("bytes/token", lambda r: f"{r['bytes_per_token']}"),
                             ("sessions", lambda r: f"{r['sessions']}"),
                             ("× f16", lambda r: f"{r['sessions_vs_f16']:.2f}")]
    if lengths is not None:
        columns += [("needle recall", lambda r: f"{r['recall']:.2f}"), ("needle KL", lambda r: f"{r['needle_kl']:.4f}"),
                    ("needle top-1", lambda r: f"{r['needle_top1']:.2f}")]
        columns += [(f"prefill {n} × f16", lambda r, n=n: f"{r['prefill_vs_f16'][n]:.2f}") for n in lengths]
        columns += [("decode × f16", lambda r: f"{r['decode_vs_f16']:.2f}")]
    if trace:
        columns += [("trace KL", lambda r: f"{r['trace_kl']:.4f}"), ("trace top-1", lambda r: f"{r['trace_top1']:.2f}"),
                    ("greedy agreement", lambda r: f"{r['trace_greedy']:.2f}"),
                    ("trace ppl", lambda r: f"{r['trace_ppl']:.3f}")]
    return columns


def print_table(rows: list[dict], columns: list[Column]) -> None:
    print("| " + " | ".join(name for name, _ in columns) + " |")
    print("|---" * len(columns) + "|")
    for row in rows:
        print("| " + " | ".join(cell(row) for _, cell in columns) + " |")


def numbers(text: str) -> list[int]:
    """A comma-separated list of integers ('': none), as an argparse type."""
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None


def served_table(served: dict[str, dict], results: dict[str, dict], lengths: list[int]) -> list[dict]:
    """llama-server's needles: recall, its answers against its f16's and pyllamaopt's, speed × its f16."""
    if not served:
        return []
    print("\nllama-server, same tree, --cache-type-k/-v (answers' greedy agreement: the share of tokens equal up "
          "to the first difference)\n")
    print("| kv_type | needle recall | answers vs its f16 | answers vs pyllamaopt's | "
          + " | ".join(f"prefill {n} × f16" for n in lengths) + " | decode × f16 |")
    print("|---" * (5 + len(lengths)) + "|")
    rows = []
    for kv_type, runs in served.items():
        prefill, decode = speed_ratios(runs, served["f16"], lengths)
        row = dict(engine="llama-server", kv_type=kv_type, recall=quality.mean(float(v["recall"]) for v in runs.values()),
                   vs_f16=quality.mean(agreement(v["tokens"], served["f16"][k]["tokens"]) for k, v in runs.items()),
                   vs_pyllamaopt=quality.mean(agreement(v["tokens"], results[kv_type]["needles"][k]["tokens"])
                                              for k, v in runs.items()),
                   prefill_vs_f16=prefill, decode_vs_f16=decode)
        print(f"| {kv_type} | {row['recall']:.2f} | {row['vs_f16']:.2f} | {row['vs_pyllamaopt']:.2f} | "
              + " | ".join(f"{prefill[n]:.2f}" for n in lengths) + f" | {decode:.2f} |")
        rows.append(row)
    return rows


def perplexity_table(scored: dict[str, llama_perplexity.Scores], ours: dict[str, dict]) -> list[dict]:
    """llama-perplexity's figures against its own f16, beside pyllamaopt's trace figures."""
    if not scored:
        return []
    print(f"\nllama-perplexity, same tree, -ctk/-ctv, on the agent trace's text: its {next(iter(scored.values())).scored} "
          "tokens of the text's second half (plain tokenization), ours the measured turns' next token (KL, top-1) "
          "and scripted answers (ppl)\n")
    print("| kv_type | KL vs f16 (ours / its) | top-1 (ours / its) | ppl (ours / its) | ppl × f16 (ours / its) |")
    print("|---" * 5 + "|")
    rows = []
    for kv_type, s in scored.items():
        mine = ours[kv_type]
        print(f"| {kv_type} | {mine['trace_kl']:.4f} / {s.kl:.4f} | {mine['trace_top1']:.2f} / {s.top1:.3f} | "
              f"{mine['trace_ppl']:.3f} / {s.ppl:.3f} | {mine['trace_ppl'] / ours['f16']['trace_ppl']:.4f} / "
              f"{s.ppl / scored['f16'].ppl:.4f} |")
        rows.append(dict(engine="llama-perplexity", kv_type=kv_type, ppl=s.ppl, kl=s.kl, top1=s.top1, scored=s.scored))
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
