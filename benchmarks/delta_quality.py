#!/usr/bin/env python3
"""Quality and runtime cost of delta-decomposed models (pyllamaopt.delta) against the original.

    python benchmarks/delta_quality.py quality  [--settings "rank=64;rank=128 matrices=attn_q"]
    python benchmarks/delta_quality.py finetune [--rank 8] [--scale 0.05]
    python benchmarks/delta_quality.py runtime  [--setting "rank=64"]

quality   for each setting: decompose the model, rebuild a standard GGUF, then against the
          original: greedy tokens on PROMPTS (prompts whose N tokens are all the same, mean
          tokens before the first difference), perplexity of both on TEXT and the mean / max KL
          divergence of their next-token distributions, teacher-forced on the same tokens.
finetune  the specification's test 4 on the real model: a synthetic fine-tune (every decomposed
          matrix plus a random rank-R change of relative size SCALE, stored F16), decomposed
          against its parent with --parent at rank R; errors, size ratio, and the rebuilt
          fine-tune's greedy tokens against the fine-tune's own.
runtime   Model(delta file): first load (rebuild + load) and cached load, resident memory,
          each in a fresh process; prompt and generation tokens/s against the original,
          interleaved in one process.

Settings are decompose options: "rank=64", "target_error=0.05", "rank=64 bases=3",
"rank=128 matrices=attn_q,ffn_up". Default model: Gemma 3 270M. Set OPENBLAS_NUM_THREADS=1 on
a busy machine: OpenBLAS's threads spin against other processes (a 2048 x 640 SVD took 9.7 s
with 2 threads under load, 0.6 s with 1).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gguf
import numpy as np

from pyllamaopt import Context, Model, models
from pyllamaopt.delta import DecomposeOptions, DeltaError, decompose, reconstruct

PROMPTS = [
    "What is the capital of France?",
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Q: What is the boiling point of water at sea level?\nA:",
    "<start_of_turn>user\nWrite a haiku about the sea.<end_of_turn>\n<start_of_turn>model\n",
    "Once upon a time, in a small village by the mountains,",
    "The three primary colors are",
    "To make a cup of tea, first",
]

# the opening of Lewis Carroll's "Alice's Adventures in Wonderland" (1865, public domain)
TEXT = (
    "Alice was beginning to get very tired of sitting by her sister on the bank, and of having nothing to do: "
    "once or twice she had peeped into the book her sister was reading, but it had no pictures or conversations "
    "in it, 'and what is the use of a book,' thought Alice 'without pictures or conversations?' So she was "
    "considering in her own mind (as well as she could, for the hot day made her feel very sleepy and stupid), "
    "whether the pleasure of making a daisy-chain would be worth the trouble of getting up and picking the "
    "daisies, when suddenly a White Rabbit with pink eyes ran close by her. There was nothing so very remarkable "
    "in that; nor did Alice think it so very much out of the way to hear the Rabbit say to itself, 'Oh dear! "
    "Oh dear! I shall be late!' (when she thought it over afterwards, it occurred to her that she ought to have "
    "wondered at this, but at the time it all seemed quite natural); but when the Rabbit actually took a watch "
    "out of its waistcoat-pocket, and looked at it, and then hurried on, Alice started to her feet, for it "
    "flashed across her mind that she had never before seen a rabbit with either a waistcoat-pocket, or a watch "
    "to take out of it, and burning with curiosity, she ran across the field after it."
)


def parse_setting(text: str) -> DecomposeOptions:
    kwargs: dict[str, object] = {}
    for item in text.split():
        key, _, value = item.partition("=")
        if key == "rank":
            kwargs["rank"] = int(value)
        elif key == "target_error":
            kwargs["target_error"] = float(value)
        elif key == "bases":
            kwargs["n_bases"] = int(value)
        elif key == "matrices":
            kwargs["matrices"] = tuple(value.split(","))
        else:
            raise SystemExit(f"unknown setting {item!r}")
    return DecomposeOptions(**kwargs)


def greedy(model: Model, prompt: str, n: int, threads: int) -> list[int]:
    with Context(model, n_ctx=512, n_threads=threads) as ctx:
        session = ctx.session()
        session.append_text(prompt, special=True)
        return [t.id for t in session.generate(n)]


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x -= x.max()
    return x - math.log(np.exp(x).sum())


def teacher_forced(reference: Model, other: Model, tokens: list[int], threads: int) -> dict[str, float]:
    """Perplexity of both models on `tokens` and KL(reference || other) of each next-token
    distribution; one token per step, so both see exactly the same history."""
    nll_ref, nll_other, kls = [], [], []
    with Context(reference, n_ctx=1024, n_threads=threads) as a, Context(other, n_ctx=1024, n_threads=threads) as b:
        sa, sb = a.session(), b.session()
        for i, token in enumerate(tokens[:-1]):
            sa.append([token])
            sb.append([token])
            p, q = log_softmax(sa.logits()), log_softmax(sb.logits())
            nll_ref.append(-p[tokens[i + 1]])
            nll_other.append(-q[tokens[i + 1]])
            kls.append(float((np.exp(p) * (p - q)).sum()))
    return {"ppl_reference": math.exp(np.mean(nll_ref)), "ppl": math.exp(np.mean(nll_other)),
            "kl_mean": float(np.mean(kls)), "kl_max": float(np.max(kls)), "n_tokens": len(tokens) - 1}


def compare(reference: Model, rebuilt: Model, n_gen: int, threads: int) -> dict[str, float]:
    same, before_difference = 0, []
    for prompt in PROMPTS:
        a, b = greedy(reference, prompt, n_gen, threads), greedy(rebuilt, prompt, n_gen, threads)
        same += a == b
        before_difference.append(next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), len(a)))
    out = {"same_prompts": same, "n_prompts": len(PROMPTS),
           "tokens_before_difference": float(np.mean(before_difference))}
    out.update(teacher_forced(reference, rebuilt, reference.tokenize(TEXT), threads))
    return out


def quality(args: argparse.Namespace) -> None:
    source = models.resolve(args.model)
    reference = Model(source)
    rows = []
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        for setting in args.settings.split(";"):
            delta, rebuilt = Path(tmp) / "model.delta.gguf", Path(tmp) / "model.rebuilt.gguf"
            try:
                report = decompose(source, delta, parse_setting(setting))
            except DeltaError as exc:
                rows.append({"setting": setting, "error": str(exc)})
                print(f"{setting}: {exc}", flush=True)
                continue
            reconstruct(delta, rebuilt)
            row = {"setting": setting, "ratio": report.totals["ratio"],
                   "decomposed_ratio": report.totals["decomposed_ratio"],
                   "streamed_per_layer": report.totals["streamed_bytes_per_layer"],
                   "source_per_layer": report.totals["source_bytes_per_layer"],
                   # over the decomposed matrices (those stored whole have none)
                   "mean_error": float(np.mean([m.rel_error for m in report.matrices if m.rank != -1])),
                   "whole": sum(m.rank == -1 for m in report.matrices), "n_matrices": len(report.matrices),
                   **compare(reference, Model(rebuilt), args.tokens, args.threads)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    print_quality(rows)


def print_quality(rows: list[dict]) -> None:
    print(f"\n{'setting':<26}{'file':>7}{'decomp.':>8}{'MB/layer':>11}{'mean err':>9}{'whole':>8}"
          f"{'same':>6}{'tok<diff':>9}{'ppl':>10}{'ppl ref':>8}{'KL mean':>9}{'KL max':>8}")
    for r in rows:
        if "error" in r:
            print(f"{r['setting']:<32}  {r['error']}")
            continue
        print(f"{r['setting']:<26}{r['ratio']:>7.3f}{r['decomposed_ratio']:>8.3f}"
              f"{r['streamed_per_layer'] / 1e6:>6.2f}/{r['source_per_layer'] / 1e6:<4.2f}{100 * r['mean_error']:>8.1f}%"
              f"{r['whole']:>4}/{r['n_matrices']:<3}{r['same_prompts']:>3}/{r['n_prompts']:<2}"
              f"{r['tokens_before_difference']:>9.1f}{r['ppl']:>10.3g}{r['ppl_reference']:>8.1f}"
              f"{r['kl_mean']:>9.3f}{r['kl_max']:>8.2f}")


def finetune(args: argparse.Namespace) -> None:
    """Parent: the model as it is. Fine-tune: each decomposed matrix, dequantized, plus a random
    rank-R change of relative size SCALE, stored F16; everything else as in the parent."""
    from pyllamaopt.delta.format import copied_fields
    from pyllamaopt.delta.names import DEFAULT_MATRICES, matrix_name
    from pyllamaopt.delta.source import GGUFModel
    from pyllamaopt.delta.writer import OutTensor, write_gguf

    parent_path = models.resolve(args.model)
    parent = GGUFModel(parent_path)
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        child_path = Path(tmp) / "finetune.gguf"
        changed = {matrix_name(layer, m) for layer in range(parent.n_layers) for m in DEFAULT_MATRICES}

        def changed_tensor(name: str) -> OutTensor:
            layer, matrix = int(name.split(".")[1]), name.split(".")[2]
            rows, cols = parent.tensor(name).shape

            def load() -> np.ndarray:
                w = parent.matrix(layer, matrix)
                change = rng.standard_normal((rows, args.rank)) @ rng.standard_normal((args.rank, cols))
                return (w + change * (args.scale * np.linalg.norm(w) / np.linalg.norm(change))).astype(np.float16)

            return OutTensor(name, (rows, cols), np.dtype(np.float16), gguf.GGMLQuantizationType.F16, load)

        tensors = [changed_tensor(t.name) if t.name in changed else OutTensor.copy_of(t) for t in parent.file.tensors]
        write_gguf(child_path, parent.architecture, copied_fields(parent), tensors, alignment=parent.file.alignment)
        delta, rebuilt = Path(tmp) / "finetune.delta.gguf", Path(tmp) / "finetune.rebuilt.gguf"
        report = decompose(child_path, delta, DecomposeOptions(rank=args.rank, parent=parent_path))
        reconstruct(delta, rebuilt)
        errors = [m.rel_error for m in report.matrices]
        print(f"fine-tune: {len(errors)} matrices + rank-{args.rank} change of relative size {args.scale}, F16")
        print(f"recovered at rank {args.rank}: ranks {sorted({m.rank for m in report.matrices})}, relative error "
              f"mean {np.mean(errors):.2e} max {np.max(errors):.2e}")
        print(f"delta file {report.output_bytes / 1e6:.1f} MB for a {report.input_bytes / 1e6:.1f} MB fine-tune "
              f"({report.totals['ratio']:.3f}); the decomposed matrices: "
              f"{report.totals['decomposed_source_bytes'] / 1e6:.1f} MB -> "
              f"{report.totals['decomposed_stored_bytes'] / 1e6:.2f} MB ({report.totals['decomposed_ratio']:.4f})")
        print(json.dumps(compare(Model(child_path), Model(rebuilt), args.tokens, args.threads)))


def measure_load(path: str) -> dict[str, float]:
    """In this (fresh) process: load time and resident memory after loading."""
    import resource

    start = time.perf_counter()
    model = Model(path)
    load = time.perf_counter() - start
    return {"load_s": load, "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "file_bytes": Path(model.path).stat().st_size}


def speed(model: Model, threads: int) -> tuple[float, float]:
    """Prompt (TEXT) and generation (64 tokens) speed in tokens/s."""
    with Context(model, n_ctx=1024, n_threads=threads) as ctx:
        session = ctx.session()
        tokens = model.tokenize(TEXT)
        start = time.perf_counter()
        session.append(tokens)
        pp = len(tokens) / (time.perf_counter() - start)
        start = time.perf_counter()
        n = sum(1 for _ in session.generate(64))
        return pp, n / (time.perf_counter() - start)


def runtime(args: argparse.Namespace) -> None:
    """Load time and memory in fresh processes; speed interleaved in one process (medians), so
    that the machine's load drifts over both models alike."""
    source = models.resolve(args.model)

    def fresh(path: Path) -> dict[str, float]:
        out = subprocess.run([sys.executable, __file__, "measure-load", str(path)],
                             capture_output=True, text=True, check=True, env=os.environ)
        return json.loads(out.stdout.strip().splitlines()[-1])

    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        delta = Path(tmp) / "model.delta.gguf"
        decompose(source, delta, parse_setting(args.setting))
        delta_bytes = delta.stat().st_size
        os.environ["XDG_CACHE_HOME"] = str(Path(tmp) / "cache")
        loads = {"original": fresh(source), "delta, first load (rebuild)": fresh(delta), "delta, cached": fresh(delta)}
        runs: dict[str, list[tuple[float, float]]] = {"original": [], "delta": []}
        loaded = {"original": Model(source), "delta": Model(delta)}
        for _ in range(args.reps):
            for name, model in loaded.items():
                runs[name].append(speed(model, args.threads))
    print(f"{args.setting}: delta file {delta_bytes / 1e6:.0f} MB")
    print(f"{'':<30}{'file MB':>8}{'load s':>8}{'RSS after load':>16}")
    for name, r in loads.items():
        print(f"{name:<30}{r['file_bytes'] / 1e6:>8.0f}{r['load_s']:>8.2f}{r['rss'] / 1e6:>13.0f} MB")
    print(f"\n{args.threads} thread(s), median of {args.reps}: {'pp tok/s':>10}{'tg tok/s':>10}")
    for name, values in runs.items():
        print(f"{name:<30}{np.median([v[0] for v in values]):>10.1f}{np.median([v[1] for v in values]):>10.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["quality", "finetune", "runtime", "measure-load"])
    parser.add_argument("path", nargs="?", help="measure-load: the model file")
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--settings", default="rank=16;rank=64;rank=128;rank=64 bases=3;rank=64 matrices=attn_q;"
                                              "target_error=0.01;target_error=0.05;target_error=0.1")
    parser.add_argument("--setting", default="rank=64", help="runtime: the decomposition to load")
    parser.add_argument("--rank", type=int, default=8, help="finetune: rank of the change")
    parser.add_argument("--scale", type=float, default=0.05, help="finetune: ‖change‖ / ‖W‖")
    parser.add_argument("--tokens", type=int, default=32, help="greedy tokens per prompt")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5, help="runtime: speed measurements per model")
    parser.add_argument("--workdir", default=None, help="where the temporary model files go")
    args = parser.parse_args()
    if args.mode == "measure-load":
        print(json.dumps(measure_load(args.path)))
    else:
        {"quality": quality, "finetune": finetune, "runtime": runtime}[args.mode](args)


if __name__ == "__main__":
    main()
