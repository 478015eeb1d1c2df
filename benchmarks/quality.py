#!/usr/bin/env python3
"""One quality harness for every approximate (Tier-2) method: what a method costs in quality
for the KV it saves, beside the exact baseline and a plain sink + recent window at the same
KV budget, on the same inputs.

    python benchmarks/quality.py [--methods exact,sink-window,attn-prune,sparse-tool,spec-prefill,keep-last]
        [--lengths 1024,2048,4096,8192,16384] [--depths 0,10,25,50,75,90,100]
        [--budgets 0.5,0.25,0.125] [--variants passkey,code,multi] [--answer-tokens 12] [--blind-tail 0]
        [--trace-turns 12] [--threads 2] [--json out.json] [--markdown out.md]

Methods (each off by default in the engine; here each set on its own session, configure_tier2):
  exact        pyllamaopt defaults: the baseline every other method is compared with
  sink-window  StreamingLLM: the first 64 tokens (attention sinks, one block) and the most
               recent ones, the rest dropped (Session.drop_span), at budget·n tokens
  attn-prune   attention-sink pruning (000 §4.1): attn_prune_enabled, attn_prune_budget
  sparse-tool  sparse attention over tool results (000 §4.2): the context is appended as a tool
               result, the question drops its irrelevant spans; sparse_attn_budget = budget: a
               share of each tool result (the rest of a session, e.g. a system prompt, stays)
  h2o          H2O chunked sparse prefill (004, docs/h2o.md): the context is a fresh prompt in a
               context of its own (h2o_enabled), its full-attention layers attend per chunk to a
               memory set of budget·n tokens (L = H = half of it, S = max(512, L + H)); every
               token's KV is kept and the question and answer see all of it (kv_fraction 1: the
               budget is the prefill's attention, not the KV). On the agent trace (a fresh
               prompt's method) the first turn's messages, system prompt included, are one
               prompt computed by H2O (budget·n of that prompt), and every later message is
               appended exactly onto its KV.
  spec-prefill speculative prefill (001): spec_prefill_enabled, spec_prefill_keep = budget; the
               needle's context and question are one prompt in a new session (the scorer's last
               query is the question's), scored by the model's first 6 layers, all averaged,
               unpooled: 001 as written ("spec-prefill/K": K layers; "spec-prefill/K/N/P[/W]": the
               last N of them averaged, pooling kernel P, the last W tokens' queries scoring and
               always kept; the engine's defaults are 6/1/13/32); on the agent trace every
               message of 256 tokens or more is scored
  keep-last    the baseline of speculative prefill: only the prompt's last budget·n tokens (and
               its first, BOS) are computed, as a prompt of their own; not run on the agent trace

Measures:
  needle grid  a key (5 digits, or a code identifier) hidden at each depth of deterministic
               filler (prose, or code) of each length, and a multi-needle variant (3 keys, one
               asked); greedy answer; recall per cell = share of the variants answered.
               The exact baseline comes first: a cell whose exact recall is below 0.9 says
               little about a method (Gemma 3 270M is small) and is marked so.
  agent trace  benchmarks/agent_trace_data.py's conversation appended message by message
               (system prompt, user messages, tool results, answers); at every third turn
               from the fourth: KL(exact || method) and top-1 agreement of the next-token
               distributions, greedy agreement of --gen generated tokens, and the perplexity of
               the scripted answer after the (compressed) context.
  cost         KV cells kept and their fraction, prefill time (the context's, shared by all
               methods, plus the method's own: the question and, for attn-prune, scoring; for
               spec-prefill and keep-last the whole prompt's, scoring included),
               decode tok/s and attention scoring time (at the longest length), the process's
               peak RSS.

Output: one JSON record per method × setting × length × depth (recall, kv_cells, kv_fraction,
prefill_s, decode_tok_s, kl_mean, top1_agree of the answer's first token) and a summary record
per method × setting; a markdown table for docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import resource
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import agent_trace_data as trace_data  # noqa: E402

import numpy as np  # noqa: E402

from pyllamaopt import Context, Model, OptConfig, models  # noqa: E402
from pyllamaopt.session import Session  # noqa: E402

SINK = 64             # tokens kept at the start by the sink + window baseline (one block, as attn-prune guards)
ANSWER_TOKENS = 12    # generated for a needle answer (default of --answer-tokens)
MEANINGFUL = 0.9      # exact recall from which a cell says something about a method
SPEC_MIN_TOKENS = 256  # spec-prefill: shorter prompts (messages of the agent trace) are computed whole

# ---------------------------------------------------------------------------------------------
# inputs

SUBJECTS = ["The committee", "A traveller", "The old library", "Our neighbour", "The river", "A small company",
            "The orchestra", "Every gardener", "The museum", "A young pilot", "The village council", "The chef"]
VERBS = ["discussed", "painted", "carried", "forgot", "described", "repaired", "visited", "measured", "collected",
         "borrowed", "ignored", "celebrated"]
OBJECTS = ["the wooden bridge", "a quiet afternoon", "the annual report", "three blue lanterns", "the northern road",
           "a box of letters", "the winter market", "an unfinished song", "the harbour lights", "a list of names",
           "the broken clock", "the autumn festival"]
CLAUSES = ["before the rain started", "while the bells were ringing", "without saying a word", "after a long debate",
           "as the sun went down", "because nobody else would", "during the spring fair", "in the early morning"]
COLORS = ["red", "green", "blue", "yellow", "white", "black"]


def prose_sentence(rng: random.Random) -> str:
    return f" {rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} {rng.choice(CLAUSES)}."


def code_sentence(rng: random.Random) -> str:
    name, i = rng.choice(["core", "stats", "io", "util", "net"]), rng.randrange(100)
    return rng.choice([
        f"\ndef {name}_op_{i}(a: float, b: float) -> float:\n    return a + b * {rng.randrange(1, 9)}\n",
        f"\n# {name}: keep the cache of op {i} small\nCACHE_{i} = {{}}\n",
        f"\nclass {name.title()}Helper{i}:\n    limit = {rng.randrange(1000)}\n",
        f"\nassert {name}_op_{i}(1, 2) >= 0\n"])


@dataclass
class Case:
    """One needle input: the context (to be appended), the question, the expected answer."""
    context: list[int]
    question: list[int]
    expected: str


def needle_case(model: Model, n_tokens: int, depth: int, variant: str, seed: int) -> Case:
    """Deterministic filler of about n_tokens tokens with the needle(s) at `depth` percent."""
    rng = random.Random(f"{variant}/{n_tokens}/{depth}/{seed}")
    tok = lambda text: model.tokenize(text, add_bos=False)  # noqa: E731
    intro = model.tokenize("Below is a long text. Somewhere in it is an important piece of information. "
                           "Remember it: you will be asked about it.\n", add_bos=True)
    if variant == "passkey":
        key = f"{rng.randrange(10000, 99999)}"
        needles = [(depth, f" The pass key is {key}. Remember it. {key} is the pass key.")]
        question = "\nWhat is the pass key? The pass key is"
    elif variant == "code":
        key = f"{rng.choice(['zq', 'kx', 'vw', 'pj'])}_{rng.choice(['merge', 'split', 'fold', 'scan'])}_{rng.randrange(10, 99)}"
        needles = [(depth, f"\n# NOTE: the secret function is named {key}. Remember: {key}.\n")]
        question = "\n# QUESTION: what is the secret function named? ANSWER: the secret function is named"
    else:  # multi: three keys, one asked
        colors = rng.sample(COLORS, 3)
        keys = [f"{rng.randrange(10000, 99999)}" for _ in colors]
        needles = [((depth + 33 * i) % 101, f" The pass key of the {c} door is {k}.") for i, (c, k) in
                   enumerate(zip(colors, keys))]
        key = keys[0]
        question = f"\nWhat is the pass key of the {colors[0]} door? The pass key of the {colors[0]} door is"
    sentence = code_sentence if variant == "code" else prose_sentence
    question_tokens = tok(question)
    needle_tokens = [(d, tok(text)) for d, text in needles]
    budget = n_tokens - len(intro) - len(question_tokens) - sum(len(t) for _, t in needle_tokens)
    filler: list[list[int]] = []
    total = 0
    while total < budget:
        filler.append(tok(sentence(rng)))
        total += len(filler[-1])
    # each needle goes at the sentence boundary nearest its depth
    at: dict[int, list[list[int]]] = {}
    for d, t in needle_tokens:
        target, acc, index = d / 100 * total, 0, 0
        while index < len(filler) and acc + len(filler[index]) / 2 < target:
            acc += len(filler[index])
            index += 1
        at.setdefault(index, []).append(t)
    context = list(intro)
    for i in range(len(filler) + 1):
        for t in at.get(i, []):
            context += t
        if i < len(filler):
            context += filler[i]
    return Case(context, question_tokens, key)


VARIANTS = ("passkey", "code", "multi")


def trace_segments(model: Model, n_turns: int) -> Iterator[tuple[int, list[tuple[list[int], str]], list[int]]]:
    """The agent trace appended message by message: for each turn, the segments to append
    (tokens, kind) before the model answers, and the scripted answer that follows."""
    turns = trace_data.turns(n_turns)
    tok = lambda text, bos=False: model.tokenize(text, add_bos=bos, special=True)  # noqa: E731
    first = [(tok(f"<start_of_turn>system\n{trace_data.system_prompt()}<end_of_turn>\n", True), "system")]
    for i, turn in enumerate(turns):
        kind = "tool" if turn.user.startswith("Tool result") else "text"
        segments = first + [(tok(f"<start_of_turn>user\n{turn.user}<end_of_turn>\n"), kind),
                            (tok("<start_of_turn>model\n"), "text")]
        first = []
        yield i, segments, tok(f"<think>{turn.reasoning}</think>\n{turn.answer}<end_of_turn>\n")


# ---------------------------------------------------------------------------------------------
# methods


@dataclass
class Method:
    name: str
    setting: str
    budget: float | None  # KV fraction kept; None: no compression (exact)
    recent: int = SINK    # attn-prune: the most recent tokens never pruned ("attn-prune/512" on the command line)
    layers: int = 6       # spec-prefill: the scorer's layers ("spec-prefill/2" on the command line),
    last_layers: int = 0  # the last of them averaged ("spec-prefill/6/1": layer 6 only; 0: all)
    pool: int = 1         # the pooling kernel ("spec-prefill/6/1/13")
    window: int = 1       # the observation window ("spec-prefill/6/1/13/32")

    @property
    def fresh(self) -> bool:
        """Computes the whole needle prompt itself (a new session), instead of going on from the
        shared context."""
        return self.name in ("spec-prefill", "keep-last")

    @property
    def label(self) -> str:
        return self.name if self.budget is None else f"{self.name}@{self.setting}"

    def tier2(self) -> dict:
        """The session's Tier-2 settings (Session.configure_tier2): every method runs in one
        context made with attn_prune_enabled (observing the queries changes no bit)."""
        off = dict(attn_prune_enabled=False, sparse_attn_enabled=False, spec_prefill_enabled=False)
        if self.name == "attn-prune":
            # the threshold is left to the budget: blocks go weakest first until the budget holds
            return {**off, "attn_prune_enabled": True, "attn_prune_budget": self.budget, "attn_prune_window": 1,
                    "attn_prune_threshold": 0.0, "attn_prune_recent": self.recent}
        if self.name == "sparse-tool":
            # the budget is a share of each tool result: the rest of a session is always kept
            return {**off, "sparse_attn_enabled": True, "sparse_relevance_threshold": 0.0,
                    "sparse_attn_budget": self.budget}
        if self.name == "spec-prefill":
            return {**off, "spec_prefill_enabled": True, "spec_prefill_keep": self.budget,
                    "spec_prefill_layers": self.layers, "spec_prefill_last_layers": self.last_layers,
                    "spec_prefill_pool": self.pool, "spec_prefill_window": self.window,
                    "spec_prefill_min_tokens": SPEC_MIN_TOKENS}
        return off

    def h2o_config(self, n_tokens: int) -> tuple[dict, int]:
        """h2o's settings for a prompt of n_tokens, and the chunk (n_batch of its context)."""
        memory = max(2, int(self.budget * n_tokens))
        chunk = max(512, (memory + 63) // 64 * 64)
        return dict(h2o_enabled=True, h2o_local_window=memory - memory // 2, h2o_heavy_budget=memory // 2,
                    h2o_chunk_size=chunk), chunk

    def prompt(self, tokens: list[int]) -> list[int]:
        """What a fresh method computes of a prompt: keep-last its first token (BOS) and the
        last ones, budget·n in all."""
        if self.name != "keep-last" or self.budget is None:
            return tokens
        n = max(2, math.ceil(self.budget * len(tokens)))
        return tokens[:1] + tokens[len(tokens) - (n - 1):]

    def before_query(self, session: Session, n_query: int) -> None:
        """What the baseline does when the context is in and the query is about to come (the
        engine's methods act by themselves, inside append)."""
        if self.name == "sink-window" and self.budget is not None:
            total = session.n_tokens + n_query
            window = max(1, int(self.budget * total) - SINK)
            session.drop_span(SINK, max(SINK, total - window))


EXACT = Method("exact", "-", None)


def parse_methods(names: list[str], budgets: list[float]) -> list[Method]:
    out = []
    for name in names:
        if name == "exact":
            out.append(EXACT)
        elif name in ("sink-window", "attn-prune", "sparse-tool", "h2o", "spec-prefill", "keep-last"):
            out += [Method(name, f"{b:g}", b) for b in budgets]
        elif name.startswith("spec-prefill/") and name.partition("/")[2].replace("/", "").isdigit():
            layers, last, pool, window = ([int(x) for x in name.split("/")[1:]] + [0, 1, 1])[:4]
            out += [Method("spec-prefill", f"{b:g}/layers={layers}" + (f"/last={last}" if last else "") +
                           (f"/pool={pool}" if pool > 1 else "") + (f"/window={window}" if window > 1 else ""), b,
                           layers=layers, last_layers=last, pool=pool, window=window)
                    for b in budgets]
        elif name.startswith("attn-prune/") and name.partition("/")[2].isdigit():
            recent = int(name.partition("/")[2])
            out += [Method("attn-prune", f"{b:g}/recent={recent}", b, recent) for b in budgets]
        else:
            raise SystemExit(f"unknown method {name!r} (exact, sink-window, attn-prune[/RECENT], sparse-tool, h2o, "
                             "spec-prefill[/LAYERS[/LAST[/POOL[/WINDOW]]]], keep-last)")
    return out


def kv_cells(session: Session) -> int:
    return session.n_tokens - sum(b - a for a, b in session.holes)


# ---------------------------------------------------------------------------------------------
# measures


def mean(values: Iterator[float] | list[float]) -> float:
    """The mean, NaN when there is nothing (a part of the harness that was not run)."""
    values = list(values)
    return statistics.mean(values) if values else math.nan


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x = x - x.max()
    return x - math.log(np.exp(x).sum())


def kl(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    """KL(P || Q) of the softmax distributions, in nats."""
    lp, lq = log_softmax(p_logits), log_softmax(q_logits)
    return float((np.exp(lp) * (lp - lq)).sum())


def generate(session: Session, n: int) -> tuple[list[int], float]:
    """Greedy tokens and the decode speed after the first token (tok/s)."""
    generation = session.generate(n)
    first = next(generation, None)
    start = time.perf_counter()
    rest = [t.id for t in generation]
    elapsed = time.perf_counter() - start
    return ([first.id] if first else []) + rest, (len(rest) / elapsed if rest and elapsed > 0 else 0.0)


@dataclass
class NeedleRun:
    answer: str
    first_logits: np.ndarray
    kv_cells: int
    n_tokens: int
    prefill_s: float
    decode_tok_s: float
    score_ms: float  # attention scoring (attn_score_us; spec-prefill's scorer: spec_prefill_score_us), part of prefill_s


def run_needle(methods: list[Method], ctx: Context, case: Case, answer_tokens: int, blind_tail: int,
               threads: int) -> list[NeedleRun]:
    """The context is computed once (a tool result, for sparse-tool) in a base session; each
    method goes on from a fork of it (sharing its complete blocks; bitwise a fresh session).
    With blind_tail, the context's last blind_tail tokens are a turn of their own on each fork:
    attn-prune prunes after it, scoring with queries that do not know the question (without it,
    after the question, with the question's own queries). Fresh methods (spec-prefill, keep-last)
    compute the whole prompt in a new session first, before the base session exists: with dedup on,
    they would otherwise take the base's blocks from the pool instead of computing them."""
    fresh: dict[str, NeedleRun] = {}
    for method in methods:
        if method.fresh:
            session = ctx.session()
            try:
                session.configure_tier2(**method.tier2())
                start = time.perf_counter()
                session.append(method.prompt(case.context + case.question))
                fresh[method.label] = finish_needle(ctx, session, case, answer_tokens, time.perf_counter() - start)
            finally:
                session.discard()  # nothing of it pooled
    base = ctx.session()
    base.configure_tier2(**EXACT.tier2())
    head, tail = case.context[:len(case.context) - blind_tail], case.context[len(case.context) - blind_tail:]
    start = time.perf_counter()
    base.append(head, kind="tool")
    base_prefill = time.perf_counter() - start
    runs = []
    try:
        for method in methods:
            if method.name == "h2o":
                runs.append(run_h2o_needle(method, ctx.model, case, answer_tokens, threads))
                continue
            if method.fresh:
                runs.append(fresh[method.label])
                continue
            session = base.fork()
            try:
                session.configure_tier2(**method.tier2())
                start = time.perf_counter()
                if tail:
                    session.append(tail, kind="tool")
                method.before_query(session, len(case.question))
                session.append(case.question)
                prefill = base_prefill + time.perf_counter() - start
                runs.append(finish_needle(ctx, session, case, answer_tokens, prefill))
            finally:
                session.discard()
    finally:
        base.discard()
    return runs


def run_h2o_needle(method: Method, model: Model, case: Case, answer_tokens: int, threads: int) -> NeedleRun:
    """The context as a fresh prompt computed by H2O in a context of its own, then the question."""
    config, chunk = method.h2o_config(len(case.context))
    with Context(model, n_ctx=len(case.context) + len(case.question) + answer_tokens + 64, n_batch=chunk,
                 n_seq_max=1, n_threads=threads, config=OptConfig(env={}, **config)) as own:
        session = own.session()
        start = time.perf_counter()
        session.append(case.context)
        session.append(case.question)
        prefill = time.perf_counter() - start
        logits, cells = session.logits(), session.n_tokens  # every token's KV is kept
        tokens, speed = generate(session, answer_tokens)
        return NeedleRun(model.detokenize(tokens), logits, cells, len(case.context) + len(case.question), prefill,
                         speed, 0.0)


def finish_needle(ctx: Context, session: Session, case: Case, answer_tokens: int, prefill: float) -> NeedleRun:
    """The answer to the prompt the session holds, and what it cost."""
    logits = session.logits()
    cells = kv_cells(session)
    tokens, speed = generate(session, answer_tokens)
    stats = session.stats
    return NeedleRun(ctx.model.detokenize(tokens), logits, cells, len(case.context) + len(case.question), prefill,
                     speed, (stats.attn_score_us + stats.spec_prefill_score_us) / 1000)


@dataclass
class TraceTurn:
    logits: np.ndarray
    generated: list[int]
    nll: list[float]
    kv_cells: int
    n_tokens: int


def run_trace(method: Method, ctx: Context, model: Model, n_turns: int, n_gen: int, n_ppl: int,
              threads: int) -> list[TraceTurn]:
    """The conversation appended message by message; measured at every third turn from the fourth.
    h2o: in a context of its own, the first turn's messages as one fresh prompt (H2O applies to
    nothing else), the later ones as for every method."""
    if method.name == "keep-last":
        return []  # a baseline for one prompt, not for a conversation
    if method.name != "h2o":
        return trace_turns(method, ctx, model, n_turns, n_gen, n_ppl)
    first_prompt = [t for tokens, _ in next(trace_segments(model, 1))[1] for t in tokens]
    config, chunk = method.h2o_config(len(first_prompt))
    with Context(model, n_ctx=ctx.n_ctx, n_batch=chunk, n_seq_max=1, n_threads=threads,
                 config=OptConfig(env={}, **config)) as own:
        return trace_turns(method, own, model, n_turns, n_gen, n_ppl, first_whole=True)


def trace_turns(method: Method, ctx: Context, model: Model, n_turns: int, n_gen: int, n_ppl: int,
                first_whole: bool = False) -> list[TraceTurn]:
    session = ctx.session()
    session.configure_tier2(**method.tier2())
    out = []
    try:
        for i, segments, answer in trace_segments(model, n_turns):
            measured = i >= 3 and i % 3 == 0
            if first_whole and i == 0:
                session.append([t for tokens, _ in segments for t in tokens])
                assert session.stats.h2o_chunks > 0, "the first prompt fits one chunk: H2O did nothing"
                segments = []
            for k, (tokens, kind) in enumerate(segments):
                if k == len(segments) - 2 and measured:  # the last message is the query
                    method.before_query(session, sum(len(t) for t, _ in segments[k:]))
                session.append(tokens, kind=kind)
            if not measured:
                session.append(answer)
                continue
            prompt = session.tokens
            logits = session.logits()
            cells = kv_cells(session)
            generated, _ = generate(session, n_gen)
            session.sync(prompt)  # back to the prompt: the scripted answer follows
            nll = []
            for t in answer[:n_ppl]:
                nll.append(-float(log_softmax(session.logits())[t]))
                session.append([t])
            session.append(answer[n_ppl:])
            out.append(TraceTurn(logits, generated, nll, cells, len(prompt)))
    finally:
        session.discard()
    return out


# ---------------------------------------------------------------------------------------------
# report


def markdown(records: list[dict], summaries: list[dict], lengths: list[int], depths: list[int]) -> str:
    exact = {(r["n_ctx"], r["depth"]): r["recall"] for r in records if r["method"] == "exact"}
    meaningful = {cell for cell, recall in exact.items() if recall >= MEANINGFUL}
    lines = ["Recall per cell (length × depth); cells where exact recall < "
             f"{MEANINGFUL:g} are in parentheses: they say little about a method.", ""]
    cells = [(n, d) for n in lengths for d in depths]
    lines.append("| method | " + " | ".join(f"{n // 1024}k@{d}" for n, d in cells) + " |")
    lines.append("|---|" + "---|" * len(cells))
    for s in summaries:
        by_cell = {(r["n_ctx"], r["depth"]): r["recall"] for r in records
                   if r["method"] == s["method"] and r["setting"] == s["setting"]}
        row = [f"{by_cell[c]:.2f}" if c in meaningful else f"({by_cell[c]:.2f})" for c in cells if c in by_cell]
        lines.append(f"| {s['label']} | " + " | ".join(row) + " |")
    lines += ["", "| method | KV fraction | recall (meaningful cells) | Δ vs exact | worst cell Δ | recall where exact is right "
              "| beats sink-window? "
              "| needle KL | needle top-1 | trace KL mean | trace top-1 | trace greedy agree | trace PPL "
              "| trace KV fraction | prefill s | decode tok/s (longest) | scoring ms (longest) |", "|---|" + "---|" * 16]
    for s in summaries:
        lines.append(
            f"| {s['label']} | {s['kv_fraction']:.3f} | {s['recall']:.3f} | {s['recall_delta']:+.3f} | "
            f"{s['worst_cell_delta']:+.2f} | {s['recall_given_exact']:.3f} | {s['beats_sink_window']} | {s['needle_kl_mean']:.4f} | "
            f"{s['needle_top1_agree']:.3f} | {s['kl_mean']:.4f} | {s['top1_agree']:.3f} | "
            f"{s['greedy_agree']:.3f} | {s['ppl']:.2f} | {s['trace_kv_fraction']:.3f} | {s['prefill_s']:.2f} | "
            f"{s['decode_tok_s']:.1f} | {s['score_ms']:.0f} |")
    return "\n".join(lines) + "\n"


def compare_with_sink_window(summaries: list[dict]) -> None:
    """Sets each method's "beats_sink_window": a method pays only if it beats the sink + window
    baseline at the same budget. The budget is what a method aims at; where it kept over a tenth
    more KV than the baseline (its guards: first block, system prompt, current turn, recent
    tokens), being better is no win, and the verdict says so."""
    for s in summaries:
        base = next((b for b in summaries if b["method"] == "sink-window" and b["budget"] == s["budget"]), None)
        if base is None or s["method"] in ("exact", "sink-window"):
            s["beats_sink_window"] = "-"
            continue
        kl_of = lambda x: x["needle_kl_mean"] if math.isnan(x["kl_mean"]) else x["kl_mean"]  # noqa: E731
        recall, kl_ = s["recall_given_exact"] - base["recall_given_exact"], kl_of(s) - kl_of(base)
        verdict = ("yes" if (recall > 0 and kl_ <= 0) or (recall >= 0 and kl_ < 0) else
                   "recall only" if recall > 0 else "KL only" if kl_ < 0 else "no")
        more = [f"{s[k]:.2f} vs {base[k]:.2f}" for k in ("kv_fraction", "trace_kv_fraction")
                if s[k] > 1.1 * base[k]]  # (NaN, a part not run, compares false)
        s["beats_sink_window"] = f"{verdict}, with more KV ({'; '.join(more)})" if more and verdict != "no" else verdict


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--methods", default="exact,sink-window,attn-prune,sparse-tool")
    parser.add_argument("--lengths", default="1024,2048,4096,8192,16384", help="'' : no needle grid")
    parser.add_argument("--depths", default="0,10,25,50,75,90,100")
    parser.add_argument("--budgets", default="0.5,0.25,0.125", help="KV fractions kept")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--trials", type=int, default=1, help="inputs per variant and cell")
    parser.add_argument("--answer-tokens", type=int, default=ANSWER_TOKENS,
                        help="generated per needle answer (a 5-digit key is 6 tokens on Gemma)")
    parser.add_argument("--blind-tail", type=int, default=0,
                        help="the needle context's last N tokens as a turn of their own before the question: "
                             "attn-prune prunes blind to the question, as in a conversation")
    parser.add_argument("--trace-turns", type=int, default=12, help="agent-trace turns (0: none)")
    parser.add_argument("--gen", type=int, default=16, help="generated tokens per measured trace turn")
    parser.add_argument("--ppl-tokens", type=int, default=16, help="scripted answer tokens scored for perplexity")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, help="write the records here")
    parser.add_argument("--markdown", type=Path, help="write the tables here")
    args = parser.parse_args()

    lengths = [int(x) for x in args.lengths.split(",") if x]
    depths = [int(x) for x in args.depths.split(",")]
    budgets = [float(x) for x in args.budgets.split(",")]
    variants = args.variants.split(",")
    names = args.methods.split(",")
    if "exact" not in names:
        names.insert(0, "exact")  # everything is measured against it
    methods = parse_methods(names, budgets)
    model = Model(models.resolve(args.model), progress=False)
    n_ctx = max(lengths + [8192 if args.trace_turns else 0]) + 256
    if args.blind_tail:  # a fork's restored blocks take cells of their own beside the base's shared ones
        n_ctx += max(lengths, default=0)
    print(f"model {model.description}; {args.threads} threads; n_ctx {n_ctx}; KV {model.kv_bytes_per_token} "
          f"bytes/token; variants {variants} × {args.trials} trial(s) per cell", flush=True)

    ctx = Context(model, n_ctx=n_ctx, n_seq_max=4, n_threads=args.threads,
                  config=OptConfig(env={}, attn_prune_enabled=True))  # its queries' observer also serves spec-prefill
    records: list[dict] = []
    t0 = time.perf_counter()
    for n in lengths:
        for d in depths:
            runs: dict[str, list[tuple[bool, NeedleRun, NeedleRun]]] = {m.label: [] for m in methods}
            for variant in variants:
                for trial in range(args.trials):
                    case = needle_case(model, n, d, variant, trial)
                    results = run_needle(methods, ctx, case, args.answer_tokens, args.blind_tail,  # methods[0] is exact
                                         args.threads)
                    for method, run in zip(methods, results):
                        runs[method.label].append((case.expected in run.answer, run, results[0]))
            for method in methods:
                mine = runs[method.label]
                records.append({
                    "method": method.name, "setting": method.setting, "n_ctx": n, "depth": d,
                    "recall": statistics.mean(float(ok) for ok, _, _ in mine),
                    # on the inputs the exact baseline answers: what the method loses of what exact knows
                    "recall_given_exact": mean(float(ok) for (ok, _, _), (exact_ok, _, _) in
                                               zip(mine, runs[EXACT.label]) if exact_ok),
                    "exact_right": sum(ok for ok, _, _ in runs[EXACT.label]),
                    "kv_cells": statistics.mean(r.kv_cells for _, r, _ in mine),
                    "kv_fraction": statistics.mean(r.kv_cells / r.n_tokens for _, r, _ in mine),
                    "prefill_s": statistics.mean(r.prefill_s for _, r, _ in mine),
                    "decode_tok_s": statistics.mean(r.decode_tok_s for _, r, _ in mine),
                    "score_ms": statistics.mean(r.score_ms for _, r, _ in mine),
                    "kl_mean": statistics.mean(kl(ref.first_logits, r.first_logits) for _, r, ref in mine),
                    "top1_agree": statistics.mean(float(np.argmax(ref.first_logits) == np.argmax(r.first_logits))
                                                  for _, r, ref in mine)})
                print(f"  {method.label:<18} {n:>6} @{d:>3}%: recall {records[-1]['recall']:.2f} "
                      f"kv {records[-1]['kv_fraction']:.3f} prefill {records[-1]['prefill_s']:.2f}s "
                      f"KL {records[-1]['kl_mean']:.3f}", flush=True)
    print(f"needle grid in {time.perf_counter() - t0:.0f}s", flush=True)

    trace: dict[str, list[TraceTurn]] = {}
    if args.trace_turns:
        for method in methods:
            t0 = time.perf_counter()
            trace[method.label] = run_trace(method, ctx, model, args.trace_turns, args.gen, args.ppl_tokens,
                                            args.threads)
            print(f"{method.label}: agent trace in {time.perf_counter() - t0:.0f}s", flush=True)
    ctx.close()

    exact_cells = {(r["n_ctx"], r["depth"]): r["recall"] for r in records if r["method"] == "exact"}
    meaningful = [c for c, v in exact_cells.items() if v >= MEANINGFUL]
    summaries: list[dict] = []
    for method in methods:
        mine = [r for r in records if r["method"] == method.name and r["setting"] == method.setting]
        recall = {(r["n_ctx"], r["depth"]): r["recall"] for r in mine}
        cells = meaningful or list(recall)
        turns, ref_turns = trace.get(method.label, []), trace.get("exact", [])
        pairs = list(zip(ref_turns, turns))
        longest = [r for r in mine if r["n_ctx"] == max(lengths, default=0)]
        summary = {
            "method": method.name, "setting": method.setting, "label": method.label, "summary": True,
            "budget": method.budget,
            "meaningful_cells": len(meaningful),
            "recall": mean(recall[c] for c in cells),
            "recall_delta": mean(recall[c] - exact_cells[c] for c in cells),
            "worst_cell_delta": min((recall[c] - exact_cells[c] for c in cells), default=math.nan),
            # pooled over every input the exact baseline answers, in every cell
            "recall_given_exact": (sum(r["recall_given_exact"] * r["exact_right"] for r in mine
                                       if r["exact_right"]) / max(1, sum(r["exact_right"] for r in mine))),
            "needle_kl_mean": mean(r["kl_mean"] for r in mine),
            "needle_top1_agree": mean(r["top1_agree"] for r in mine),
            "kv_fraction": mean(r["kv_fraction"] for r in mine),
            "prefill_s": mean(r["prefill_s"] for r in mine),
            "decode_tok_s": mean(r["decode_tok_s"] for r in longest),
            "score_ms": mean(r["score_ms"] for r in longest),
            "kl_mean": mean(kl(a.logits, b.logits) for a, b in pairs),
            "top1_agree": mean(float(np.argmax(a.logits) == np.argmax(b.logits)) for a, b in pairs),
            "greedy_agree": mean(float(a.generated == b.generated) for a, b in pairs),
            "ppl": math.exp(mean(x for t in turns for x in t.nll)),
            "trace_kv_fraction": mean(t.kv_cells / t.n_tokens for t in turns),
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }
        summaries.append(summary)
    compare_with_sink_window(summaries)
    table = markdown(records, summaries, lengths, depths)
    print("\n" + table)
    print(f"peak RSS of the process: {summaries[-1]['peak_rss_mib']:.0f} MiB")
    if args.json:
        args.json.write_text(json.dumps(records + summaries, indent=1))
    if args.markdown:
        args.markdown.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
