#!/usr/bin/env python3
"""Replays a scripted coding-agent conversation on Gemma 3 270M and compares, in one run:

  off               pyllamaopt with every reuse optimization off: full prefill every turn
  exact             pyllamaopt defaults: exact prefix reuse (diff), shared blocks (dedup) and
                    drafts of repeated output checked in one pass (memo)
  exact-no-memo     exact without memo
  exact-no-gate     exact with every memo draft checked (memo_gate off: docs/memo.md)
  exact-own-memo    exact with drafts from each session's own history only (memo_shared off), not
                    also from the context's recent outputs of every session
  tier2[@SHARE]     exact + Tier-2 post-edit reuse (diff_reuse_shifted; SHARE for every edit, else the
                    default shares): approximate, its quality is reported against the reference
  keep-generated    exact + Tier-2 reuse of generated tokens' KV (diff_reuse_generated): the
                    answer's one-token-step rows are kept, as llama.cpp's prefix reuse keeps them
  llama-cpp-python  0.3.36 (same llama.cpp) with its automatic prefix reuse
  llama-server      llama.cpp's own server from the same pinned tree and CPU flags
                    (tools/build_upstream.py), one slot, its prompt cache, token ids over HTTP
  llama-server-ngram  the same, drafting from n-grams of its context (--spec-type ngram-mod)

    python benchmarks/agent_trace.py [--shapes append,reasoning,workspace,edits,header,shared,fresh] [--turns 22]
                                     [--engines off,exact,exact-no-memo,exact-no-gate,exact-own-memo,tier2,tier2@0.1,
                                                 keep-generated,
                                                 llama-cpp-python,llama-server,llama-server-ngram]
                                     [--n-ctx 16384] [--per-turn]

Shapes (benchmarks/agent_trace_data.py): append-only history; re-rendered history whose earlier
answers lose their reasoning block; a workspace file after the system prompt, edited every
3 turns; three workspace files whose edits every 3 turns change line lengths at several places
(everything after each edit shifts); a per-request header as the system prompt's first line
(every request differs a few tokens after its start: llama.cpp #19494; the server benchmark's
(b)); 8 sessions sharing the system prompt, interleaved; unrelated
fresh prompts (no reuse possible: the overhead check). Every turn the client re-sends the whole
conversation and the engine generates up to --gen tokens (greedy); the script's own answers
continue the history, so all engines see the same prompts. --n-ctx sets the KV cells of each
engine's context (Tier-2 post-edit reuse must work however full it gets: the edits shape at 22
turns ends at 11.9k tokens, 97 % of --n-ctx 12288); --per-turn prints, for each Tier-2 engine,
every turn's tokens computed beside exact mode's, tokens reused shifted, plans refused, and the
quality against the reference.

Reported per shape and engine: prompt tokens computed (against the tokens never seen before in
any earlier prompt, the limit of exact reuse), wall time (split into prefill = the sum of the
times to first token, and decode = the rest), time to first token per turn, peak KV
cells and bytes, and whether the generated tokens equal those of the reference ("off", else
"exact", which equals "off" token for token); for pyllamaopt engines also the mean and max KL
divergence of each turn's next-token distribution from the reference's. Then where the time
went: the prompt and generation each split into the forward passes and the rest (ours: the C++
around llama_decode and Python), per computed and per generated token.

llama-cpp-python must be built without AMX on these machines, e.g.
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \\
    -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON" \\
    pip install llama-cpp-python==0.3.36
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))

import agent_trace_data as data  # noqa: E402

import numpy as np  # noqa: E402

from pyllamaopt import Context, Model, OptConfig, models  # noqa: E402


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@dataclass
class Turn:
    computed: int
    ttft: float
    wall: float
    generated: list[int]
    first_logits: np.ndarray | None = None  # the next-token logits after the prompt
    drafted: int = 0  # generated tokens confirmed from a checked draft (memo): no pass of their own
    shifted: int = 0  # Tier 2: prompt tokens whose KV was reused at a new position
    refused: int = 0  # Tier 2: post-edit reuse plans refused (exact mode's work instead)
    # seconds in the forward passes of the prompt / of generation (pyllamaopt: Stats.forward_us;
    # llama-server: its own prompt_ms / predicted_ms, which include its sampling and bookkeeping)
    forward_prefill: float = 0.0
    forward_decode: float = 0.0
    decode_passes: int = 0  # forward passes of the generation (pyllamaopt)
    decode_rows: int = 0  # tokens they computed: generated ones and checked drafts (pyllamaopt)


@dataclass
class Result:
    turns: list[Turn] = field(default_factory=list)
    peak_cells: int = 0

    def total(self, attr: str) -> float:
        return sum(getattr(t, attr) for t in self.turns)


class Pyllamaopt:
    def __init__(self, model: Model, name: str, n_ctx: int, **config: bool | float) -> None:
        self.name, self.model = name, model
        self.ctx = Context(model, n_ctx=n_ctx, n_seq_max=16, n_threads=2, config=OptConfig(env={}, **config))
        self.sessions: dict[int, object] = {}

    def turn(self, session_id: int, prompt: list[int], n_gen: int) -> Turn:
        session = self.sessions.get(session_id) or self.sessions.setdefault(session_id, self.ctx.session())
        before = session.stats
        start = time.perf_counter()
        session.sync(prompt)
        peek = time.perf_counter()
        logits = session.logits()  # already computed; peeking does not change the generation
        start += time.perf_counter() - peek  # (the copy is not the engine's time)
        synced = session.stats
        generation = session.generate(n_gen)
        first = next(generation, None)
        ttft = time.perf_counter() - start
        drafted_before = session.stats.memo_tokens_skipped
        generated = ([first.id] if first else []) + [t.id for t in generation]
        wall = time.perf_counter() - start
        spent, generating = session.stats - before, session.stats - synced
        return Turn(spent.tokens_prefilled, ttft, wall, generated, logits,
                    session.stats.memo_tokens_skipped - drafted_before, spent.diff_tokens_shifted,
                    spent.diff_shift_fallbacks_unsupported + spent.diff_shift_fallbacks_shared
                    + spent.diff_shift_fallbacks_room,
                    (synced - before).forward_us / 1e6, generating.forward_us / 1e6,
                    generating.forward_passes, generating.tokens_decoded)

    def kv_cells(self) -> int:
        return self.ctx.kv_cells_used

    def close(self) -> None:
        self.ctx.close()


class LlamaCppPython:
    name = "llama-cpp-python"

    def __init__(self, path: Path, n_ctx: int) -> None:
        from llama_cpp import Llama

        self.llm = Llama(model_path=str(path), n_ctx=n_ctx, n_batch=512, n_threads=2, flash_attn=True,
                         verbose=False)

    def turn(self, session_id: int, prompt: list[int], n_gen: int) -> Turn:
        llm = self.llm
        cached = common_prefix(list(llm.input_ids[: llm.n_tokens]), prompt)
        computed = len(prompt) - min(cached, len(prompt) - 1)  # it always evaluates the last token
        start = time.perf_counter()
        generated, ttft = [], None
        # generate() is where llama-cpp-python reuses the longest common prefix of its cache
        for token in llm.generate(prompt, temp=0.0, reset=True):
            ttft = ttft or time.perf_counter() - start
            generated.append(token)
            if llm.token_eos() == token or len(generated) >= n_gen:
                break
        return Turn(computed, ttft or time.perf_counter() - start, time.perf_counter() - start, generated)

    def kv_cells(self) -> int:
        return self.llm.n_tokens

    def close(self) -> None:
        self.llm.close()


def workload(model: Model, shape: str, n_turns: int) -> list[tuple[int, list[int]]]:
    """(session id, prompt tokens) in the order a client sends them."""
    system = data.system_prompt()
    tok = lambda text: model.tokenize(text, special=True)  # noqa: E731
    if shape in ("append", "reasoning", "workspace", "edits", "header"):
        turns = data.turns(n_turns)
        return [(0, tok(data.render(system, turns[:i], turns[i], shape=shape, workspace_version=i // 3)))
                for i in range(n_turns)]
    if shape == "shared":
        tasks = [data.session_task(i) for i in range(8)]
        return [(s, tok(data.render(system, tasks[s][:step], tasks[s][step], shape="append")))
                for step in range(3) for s in range(8)]
    if shape == "fresh":  # unrelated prompts, each in its own session: nothing to reuse
        return [(i, tok(f"<start_of_turn>user\nDocument {i}:\n" + data.python_file(f"m{i}", 6 + i % 4)
                        + f"\nSummarize document {i}.<end_of_turn>\n<start_of_turn>model\n")) for i in range(12)]
    raise SystemExit(f"unknown shape {shape}")


def never_seen(prompts: list[list[int]]) -> int:
    total, earlier = 0, []
    for p in prompts:
        total += len(p) - max((common_prefix(p, e) for e in earlier), default=0)
        earlier.append(p)
    return total


def kl_divergence(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    """KL(P || Q) of the softmax distributions, in nats."""
    p = p_logits.astype(np.float64) - p_logits.max()
    q = q_logits.astype(np.float64) - q_logits.max()
    log_p = p - math.log(np.exp(p).sum())
    log_q = q - math.log(np.exp(q).sum())
    return float((np.exp(log_p) * (log_p - log_q)).sum())


class LlamaServer:
    """llama.cpp's own llama-server (tools/build_upstream.py: the same tree and CPU flags), one
    slot with its prompt cache, driven with token ids over its native /completion route (its
    reply has the generated token ids and its own timings). With `ngram`: --spec-type ngram-mod."""

    def __init__(self, name: str, model: Model, n_ctx: int) -> None:
        import build_upstream
        from server import running

        self.name = name
        self._stack = contextlib.ExitStack()
        server_bin = build_upstream.build(("llama-server",)) / "llama-server"
        self.url = f"http://127.0.0.1:{self._stack.enter_context(running(name, model, server_bin, n_ctx)).port}"
        self.cells = 0

    def turn(self, session_id: int, prompt: list[int], n_gen: int) -> Turn:
        body = {"prompt": prompt, "n_predict": n_gen, "temperature": 0, "cache_prompt": True, "return_tokens": True}
        request = urllib.request.Request(f"{self.url}/completion", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
        start = time.perf_counter()
        with urllib.request.urlopen(request, timeout=600) as response:
            reply = json.loads(response.read())
        wall = time.perf_counter() - start
        timings = reply["timings"]
        self.cells = len(prompt) + len(reply["tokens"])
        return Turn(timings["prompt_n"], timings["prompt_ms"] / 1000, wall, reply["tokens"],
                    forward_prefill=timings["prompt_ms"] / 1000, forward_decode=timings["predicted_ms"] / 1000)

    def kv_cells(self) -> int:
        return self.cells

    def close(self) -> None:
        self._stack.close()


def run(engines: dict, work, n_gen: int) -> dict[str, Result]:
    """Turn by turn, every engine in turn, so that the machine's speed drifts alike for all."""
    results = {name: Result() for name in engines}
    for session_id, prompt in work:
        for name, engine in engines.items():
            results[name].turns.append(engine.turn(session_id, prompt, n_gen))
            results[name].peak_cells = max(results[name].peak_cells, engine.kv_cells())
    for engine in engines.values():
        engine.close()
    return results


def time_split(results: dict[str, Result]) -> str:
    """Where each engine's time went: the prompt (up to the first token) and generation, each
    split into the forward passes and the rest (pyllamaopt: our C++ around llama_decode and
    Python; llama-server: HTTP, its server loop, and its sampling, which its timings count as
    generation), per computed prompt token and per generated token."""
    lines = [f"  {'engine':<19} {'prompt s':>8} {'in fwd':>7} {'outside':>7} {'ms/computed':>11} "
             f"{'gen s':>7} {'in fwd':>7} {'outside':>7} {'ms/token':>8} {'outside ms/token':>16}"]
    for name, r in results.items():
        if not r.total("forward_prefill"):
            continue
        computed, generated = r.total("computed"), sum(len(t.generated) for t in r.turns)
        prompt, gen = r.total("ttft"), r.total("wall") - r.total("ttft")
        lines.append(f"  {name:<19} {prompt:>8.2f} {r.total('forward_prefill'):>7.2f} "
                     f"{prompt - r.total('forward_prefill'):>7.2f} {prompt / max(1, computed) * 1000:>11.3f} "
                     f"{gen:>7.2f} {r.total('forward_decode'):>7.2f} {gen - r.total('forward_decode'):>7.2f} "
                     f"{gen / max(1, generated) * 1000:>8.2f} "
                     f"{(gen - r.total('forward_decode')) / max(1, generated) * 1000:>16.3f}")
    return "\n".join(lines)


def ms_per_computed(turn: Turn) -> str:
    """The prompt's forward time per token it computed, in ms."""
    return f"{1e3 * turn.forward_prefill / turn.computed:.3f}" if turn.computed else "-"


def report_tier2(name: str, r: Result, exact: Result, prompts: list[list[int]], baseline: Result | None,
                 reference: str, per_turn: bool) -> None:
    """A Tier-2 engine against exact mode: the work over the trace and on every turn, the time, and
    (per turn, with per_turn) the quality against the reference."""
    computed = r.total("computed") / max(1, exact.total("computed"))
    prefill = r.total("ttft") / exact.total("ttft")
    worse = [i for i, (a, b) in enumerate(zip(r.turns, exact.turns)) if a.computed > b.computed]
    print(f"  {name} / exact: tokens computed {computed:.3f}, wall time {r.total('wall') / exact.total('wall'):.3f}, "
          f"prefill time {prefill:.3f}; turns computing more than exact: {len(worse)} {worse or ''}; "
          f"plans refused: {int(r.total('refused'))}; tokens reused shifted: {int(r.total('shifted'))}")
    if not per_turn:
        return
    print(f"    {'turn':>4} {'prompt':>7} {'exact':>7} {name:>9} {'shifted':>8} {'refused':>7} "
          f"{'agreeing tokens':>15} {'top-1':>5} {'KL':>9} {'ms/computed, exact':>18} {name:>9}")
    for i, (a, b) in enumerate(zip(r.turns, exact.turns)):
        ref = baseline.turns[i] if baseline else None
        # greedy agreement: the generated tokens equal to the reference's before the first that differs
        agreeing = "-" if ref is None else f"{common_prefix(a.generated, ref.generated)}/{len(ref.generated)}"
        compared = ref is not None and ref.first_logits is not None and a.first_logits is not None
        top1 = "-" if not compared else "yes" if a.first_logits.argmax() == ref.first_logits.argmax() else "no"
        kl = f"{kl_divergence(ref.first_logits, a.first_logits):.2e}" if compared else "-"
        print(f"    {i:>4} {len(prompts[i]):>7} {b.computed:>7} {a.computed:>9} {a.shifted:>8} {a.refused:>7} "
              f"{agreeing:>15} {top1:>5} {kl:>9} {ms_per_computed(b):>18} {ms_per_computed(a):>9}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--shapes", default="append,reasoning,workspace,shared,fresh")
    parser.add_argument("--n-ctx", type=int, default=16384, help="KV cells of each engine's context")
    parser.add_argument("--per-turn", action="store_true", help="every turn of the Tier-2 engines beside the reference")
    parser.add_argument("--turns", type=int, default=22)
    parser.add_argument("--gen", type=int, default=32)
    parser.add_argument("--engines", default="off,exact,llama-cpp-python")
    args = parser.parse_args()

    path = models.resolve(args.model)
    n_ctx = args.n_ctx
    model = Model(path, progress=False)
    cell_bytes = model.kv_bytes_per_token
    factories = {
        "off": lambda: Pyllamaopt(model, "off", n_ctx, dedup_enabled=False, diff_enabled=False, memo_enabled=False),
        "exact": lambda: Pyllamaopt(model, "exact", n_ctx),
        "exact-no-memo": lambda: Pyllamaopt(model, "exact-no-memo", n_ctx, memo_enabled=False),
        "exact-no-gate": lambda: Pyllamaopt(model, "exact-no-gate", n_ctx, memo_gate=False),
        "exact-own-memo": lambda: Pyllamaopt(model, "exact-own-memo", n_ctx, memo_shared=False),
        "keep-generated": lambda: Pyllamaopt(model, "keep-generated", n_ctx, diff_reuse_generated=True),
        "llama-cpp-python": lambda: LlamaCppPython(path, n_ctx),
        "llama-server": lambda: LlamaServer("llama-server", model, n_ctx),
        "llama-server-ngram": lambda: LlamaServer("llama-server-ngram", model, n_ctx),
    }
    engines = args.engines.split(",")
    for name in engines:
        if name.startswith("tier2"):
            share = name.partition("@")[2]
            shares = {"diff_recompute_share": float(share), "diff_recompute_share_head": float(share)} if share else {}
            factories[name] = lambda name=name, shares=shares: Pyllamaopt(
                model, name, n_ctx, diff_reuse_shifted=True, **shares)
    print(f"model {model.description}; 2 threads; {args.gen} generated tokens per turn; KV {cell_bytes} bytes/cell; "
          f"n_ctx {n_ctx}\n")
    for shape in args.shapes.split(","):
        work = workload(model, shape, args.turns)
        prompts = [p for _, p in work]
        seen = never_seen(prompts)
        shared = common_prefix(prompts[0], prompts[1]) if shape == "shared" else 0
        print(f"## shape {shape}: {len(work)} turns, prompts {len(prompts[0])}..{max(map(len, prompts))} tokens, "
              f"{sum(map(len, prompts))} sent, {seen} never seen before")
        available = {}
        for name in engines:
            try:
                available[name] = factories[name]()
            except ImportError as exc:
                print(f"  {name}: not available ({exc})")
        results = run(available, work, args.gen)
        reference = "off" if "off" in results else "exact"
        baseline = results.get(reference)
        print(f"  {'engine':<17} {'computed':>9} {'/never-seen':>11} {'wall s':>8} {'prefill s':>9} {'decode s':>8} "
              f"{'TTFT med ms':>11} "
              f"{'TTFT max ms':>11} {'peak KV MiB':>11} {'same tokens as ' + reference:>20} {'KL mean':>9} {'KL max':>9}")
        for name, r in results.items():
            ttfts = [t.ttft * 1000 for t in r.turns]
            same = sum(a.generated == b.generated for a, b in zip(r.turns, baseline.turns)) if baseline else 0
            kls = [kl_divergence(b.first_logits, a.first_logits) for a, b in zip(r.turns, baseline.turns)
                   if baseline and a.first_logits is not None and b.first_logits is not None]
            kl = f"{statistics.mean(kls):>9.2e} {max(kls):>9.2e}" if kls else f"{'-':>9} {'-':>9}"
            print(f"  {name:<17} {int(r.total('computed')):>9} {r.total('computed') / seen:>11.3f} "
                  f"{r.total('wall'):>8.1f} {r.total('ttft'):>9.2f} {r.total('wall') - r.total('ttft'):>8.2f} "
                  f"{statistics.median(ttfts):>11.0f} {max(ttfts):>11.0f} "
                  f"{r.peak_cells * cell_bytes / 2**20:>11.1f} {f'{same}/{len(r.turns)}':>20} {kl}")
        print(time_split(results))
        for name in results:
            if name.startswith("tier2") and "exact" in results:
                report_tier2(name, results[name], results["exact"], prompts, baseline, reference, args.per_turn)
        for name, r in results.items():
            if r.total("drafted"):
                print(f"  {name}: {int(r.total('drafted'))} of {sum(len(t.generated) for t in r.turns)} generated "
                      f"tokens confirmed from drafts (memo); generation: {int(r.total('decode_passes'))} forward "
                      f"passes, {int(r.total('decode_rows'))} rows, {r.total('forward_decode'):.2f} s in them")
        for other in ("exact-no-memo", "exact-no-gate", "exact-own-memo"):
            if "exact" in results and other in results:
                decode = {name: results[name].total("wall") - results[name].total("ttft") for name in ("exact", other)}
                print(f"  decode time {other} / exact: {decode[other] / decode['exact']:.3f}")
        for name in ("exact", "keep-generated"):
            for peer in ("llama-cpp-python", "llama-server", "llama-server-ngram"):
                if name in results and peer in results:
                    print(f"  wall time {name} / {peer}: {results[name].total('wall') / results[peer].total('wall'):.3f}")
        if "exact" in results and "off" in results:
            print(f"  wall time exact / off: {results['exact'].total('wall') / results['off'].total('wall'):.3f}")
        if shape == "shared" and "exact" in results:
            last = {s: len(p) for s, p in work}
            ideal = shared + sum(n - shared for n in last.values())
            print(f"  KV cells: exact peak {results['exact'].peak_cells} vs shared prefix + suffixes {ideal} "
                  f"= {results['exact'].peak_cells / ideal:.3f}")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
