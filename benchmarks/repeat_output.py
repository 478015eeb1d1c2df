#!/usr/bin/env python3
"""Output that repeats earlier output: an agent asked to write a file again with one change
(the common "write_file" way of applying an edit). Gemma 3 270M, greedy, side by side in one run:

  no-memo           pyllamaopt, every token its own decode step
  memo              pyllamaopt defaults: drafts of what followed earlier checked in one pass
  llama-cpp-python  0.3.36 (same llama.cpp), plain decoding

    python benchmarks/repeat_output.py [--max-tokens 256] [--engines no-memo,memo,llama-cpp-python]

Reported per engine: generated tokens, decode tokens/s (after the first token), forward passes
per generated token, share of tokens confirmed from drafts, and outputs token-identical to
no-memo (the memo is exact: all of them).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import agent_trace_data as data  # noqa: E402

from pyllamaopt import Context, Model, OptConfig, models  # noqa: E402

TASKS = [
    ("geometry", 6, 2, "The function geometry_op_2 subtracts instead of adding. Write the whole corrected file."),
    ("parsing", 5, 4, "Fix the bug in parsing_op_4 (it uses - instead of +) and write the complete file again."),
    ("units", 7, None, "Rename every 'variant' in the docstrings to 'form' and write the whole file."),
    ("stats", 4, 1, "Write the file again with stats_op_1 fixed: it must add, not subtract."),
    ("io", 6, None, "Add the type hint '-> float' where it is missing (it is not) and write the file back unchanged."),
    ("matrix", 5, 3, "matrix_op_3 has a wrong operator. Output the full fixed file, nothing else."),
]


def prompt_text(name: str, n: int, bug: int | None, request: str) -> str:
    return (f"<start_of_turn>user\nHere is mathkit/{name}.py:\n```python\n{data.python_file(name, n, bug_in=bug)}\n```\n"
            f"{request}<end_of_turn>\n<start_of_turn>model\n")


def run_pyllamaopt(model: Model, prompts: list[list[int]], max_tokens: int, memo: bool):
    outputs, decode_s, passes, drafted = [], 0.0, 0, 0
    with Context(model, n_ctx=4096, n_threads=2, config=OptConfig(env={}, memo_enabled=memo)) as ctx:
        for prompt in prompts:
            s = ctx.session()
            s.append(prompt)
            before = s.stats
            generation = s.generate(max_tokens)
            tokens = [next(generation).id]
            start = time.perf_counter()
            tokens += [t.id for t in generation]
            decode_s += time.perf_counter() - start
            spent = s.stats - before
            passes += spent.forward_passes
            drafted += spent.memo_tokens_skipped
            outputs.append(tokens)
            s.close()
    return outputs, decode_s, passes, drafted


def run_llama_cpp_python(path: Path, prompts: list[list[int]], max_tokens: int):
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), n_ctx=4096, n_batch=512, n_threads=2, flash_attn=True, verbose=False)
    outputs, decode_s = [], 0.0
    for prompt in prompts:
        tokens, start = [], None
        for token in llm.generate(prompt, temp=0.0, reset=True):
            if start is None:
                start = time.perf_counter()
            tokens.append(token)
            if token == llm.token_eos() or len(tokens) >= max_tokens:
                break
        decode_s += time.perf_counter() - start
        outputs.append(tokens)
    llm.close()
    return outputs, decode_s, None, 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--engines", default="no-memo,memo,llama-cpp-python")
    args = parser.parse_args()

    path = models.resolve(args.model)
    model = Model(path, progress=False)
    prompts = [model.tokenize(prompt_text(*task), special=True) for task in TASKS]
    runs = {
        "no-memo": lambda: run_pyllamaopt(model, prompts, args.max_tokens, memo=False),
        "memo": lambda: run_pyllamaopt(model, prompts, args.max_tokens, memo=True),
        "llama-cpp-python": lambda: run_llama_cpp_python(path, prompts, args.max_tokens),
    }
    print(f"model {model.description}; 2 threads; {len(TASKS)} rewrite-the-file tasks, "
          f"prompts {min(map(len, prompts))}..{max(map(len, prompts))} tokens; greedy, up to {args.max_tokens} tokens\n")
    run_pyllamaopt(model, prompts[:1], 64, memo=False)  # warm-up: the first run's timing is off otherwise
    results = {}
    for name in args.engines.split(","):
        try:
            results[name] = runs[name]()
        except ImportError as exc:
            print(f"  {name}: not available ({exc})")
    reference = results.get("no-memo")
    print(f"  {'engine':<17} {'tokens':>7} {'decode tok/s':>12} {'passes/token':>12} {'from drafts':>11} {'same tokens as no-memo':>23}")
    for name, (outputs, decode_s, passes, drafted) in results.items():
        n = sum(map(len, outputs))
        same = sum(a == b for a, b in zip(outputs, reference[0])) if reference else 0
        per_pass = f"{passes / n:.3f}" if passes is not None else "-"
        print(f"  {name:<17} {n:>7} {(n - len(outputs)) / decode_s:>12.1f} {per_pass:>12} {drafted / n:>11.1%} "
              f"{f'{same}/{len(outputs)}':>23}")
    if "memo" in results and "no-memo" in results:
        speed = {k: (sum(map(len, v[0])) - len(v[0])) / v[1] for k, v in results.items()}
        print(f"\n  decode speed memo / no-memo: {speed['memo'] / speed['no-memo']:.2f}")
        if "llama-cpp-python" in speed:
            print(f"  decode speed memo / llama-cpp-python: {speed['memo'] / speed['llama-cpp-python']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
