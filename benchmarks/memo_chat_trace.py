#!/usr/bin/env python3
"""The chat route's agent trace in process: what the memo's drafts and the small batches' kernels
cost the answers' generation (issue 47: on SmolLM2 the server's decode was slower with the memo on;
on Qwen2.5-Coder a check's multi-row kernels cost more than row by row on this CPU).

Each turn renders the conversation as the server does (benchmarks/server_chat.py's messages, the
GGUF's template through pyllamaopt.chat), syncs one session of each engine to it and generates
--gen tokens greedily; the answer, detokenized, is the next turn's assistant message. Engines, one
context each, taking each turn in turn: a memo setting

  gate       the defaults: drafts checked where methods/memo-gate expects them to pay
  no-gate    every draft checked (memo_gate off)
  no-memo    no drafts (memo_enabled off)

for each of --row-kernels (LLAMA_OPT_ROW_KERNELS: 0 row by row, 1 multi-row kernels, 2 the faster
per weight type and row count, the default), named like "no-gate/2".

Printed per turn and in total: the generation's time (--clock wall, or cpu: the process's, all
threads, which a loaded machine stretches less), its forward passes and rows (tokens_decoded:
confirmed and unconfirmed drafted rows included), drafts checked and drafted tokens confirmed; each
row_kernels=2 engine's choices at the end; and whether every engine generated the same tokens (they
must: the gate and the kernels decide how fast, never what).

    python benchmarks/memo_chat_trace.py [--model smollm2-135m] [--shape append] [--turns 16] [--gen 32]
                                         [--engines gate,no-gate,no-memo] [--row-kernels 2]
                                         [--threads 2] [--clock wall]
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from server_chat import CHAT_SHAPES, N_CTX, ChatReply, messages_at  # noqa: E402

from pyllamaopt import Context, Model, OptConfig, models  # noqa: E402
from pyllamaopt.chat import ChatTemplate, prompt_tokens  # noqa: E402

ENGINES = {"gate": {}, "no-gate": {"memo_gate": False}, "no-memo": {"memo_enabled": False}}
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


@dataclass
class Generation:
    tokens: list[int]
    seconds: float  # from the first step to the last token, on --clock
    passes: int
    rows: int       # tokens_decoded
    checked: int    # memo_hits
    confirmed: int  # memo_tokens_skipped


def generate(session, prompt: list[int], gen: int, clock) -> Generation:
    session.sync(prompt)
    session.logits()  # the prompt's pass: not the generation's work
    before, start = session.stats, clock()
    tokens = [t.id for t in session.generate(gen)]
    seconds = clock() - start
    spent = session.stats - before
    return Generation(tokens, seconds, spent.forward_passes, spent.tokens_decoded, spent.memo_hits,
                      spent.memo_tokens_skipped)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--shape", default="append", choices=CHAT_SHAPES)
    parser.add_argument("--turns", type=int, default=16)
    parser.add_argument("--gen", type=int, default=32)
    parser.add_argument("--engines", default="gate,no-gate,no-memo")
    parser.add_argument("--row-kernels", default="2", help="comma-separated LLAMA_OPT_ROW_KERNELS values")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--clock", default="wall", choices=CLOCKS)
    args = parser.parse_args()
    if unknown := [e for e in args.engines.split(",") if e not in ENGINES]:
        raise SystemExit(f"unknown engines {unknown}: choose from {', '.join(ENGINES)}")
    kernels = [int(k) for k in args.row_kernels.split(",")]
    engines = [f"{e}/{k}" for e in args.engines.split(",") for k in kernels]
    clock = CLOCKS[args.clock]
    model = Model(models.resolve(args.model))
    template = ChatTemplate.for_model(model)
    contexts = {e: Context(model, n_ctx=N_CTX, n_seq_max=16, n_threads=args.threads,
                           config=OptConfig(env={}, row_kernels=int(e.split("/")[1]), **ENGINES[e.split("/")[0]]))
                for e in engines}
    sessions = {e: c.session() for e, c in contexts.items()}
    runs: dict[str, list[Generation]] = {e: [] for e in engines}
    answers: list[ChatReply] = []  # (their text only: what the next turn re-sends)
    print(f"{args.model}, chat route in process, shape {args.shape}, {args.turns} turns x {args.gen} tokens, "
          f"{args.threads} thread(s); per turn: {args.clock} ms per generated token, passes/rows, drafts checked/tokens "
          f"confirmed")
    print(f"{'turn':>4} {'prompt':>6} " + " ".join(f"{e:>30}" for e in engines))
    for turn in range(args.turns):
        messages = messages_at(args.shape, turn, answers)
        prompt = prompt_tokens(model, template, messages, template.render(messages))
        for i in range(len(engines)):  # the first engine rotates: drift weighs on each alike
            engine = engines[(turn + i) % len(engines)]
            runs[engine].append(generate(sessions[engine], prompt, args.gen, clock))
        answers.append(ChatReply(model.detokenize(runs[engines[0]][-1].tokens), 0.0, 0.0, 0, 0, 0))
        cells = [runs[e][-1] for e in engines]
        print(f"{turn:>4} {len(prompt):>6} " + " ".join(
            f"{g.seconds / max(1, len(g.tokens)) * 1000:>9.1f} {g.passes:>4}/{g.rows:<4} {g.checked:>4}/{g.confirmed:<4}"
            for g in cells))
    print(f"totals ({args.clock} s of generation, tokens, passes, rows, drafts checked, tokens confirmed):")
    for e in engines:
        gens = runs[e]
        print(f"  {e:11} {sum(g.seconds for g in gens):7.2f} s {sum(len(g.tokens) for g in gens):5} "
              f"{sum(g.passes for g in gens):5} {sum(g.rows for g in gens):5} {sum(g.checked for g in gens):5} "
              f"{sum(g.confirmed for g in gens):5}")
    for e in engines:
        if e.endswith("/2"):
            chosen = ", ".join(f"{c['type']}@{c['rows']}:{'multi' if c['multi'] else 'one'} "
                               f"({c['multi_ns_per_element'] / c['one_ns_per_element']:.2f}; "
                               f"{c['multi_samples']}/{c['one_samples']})"
                               for c in contexts[e].row_kernels() if c["multi_samples"] and c["one_samples"])
            print(f"  {e} chose (type@rows: next arm (multi-row / row-by-row time; samples)): {chosen}")
    same = all(runs[e][t].tokens == runs[engines[0]][t].tokens for e in engines for t in range(args.turns))
    print(f"same tokens in every engine: {same}")
    for c in contexts.values():
        c.close()
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
