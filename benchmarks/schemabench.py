#!/usr/bin/env python3
"""JSONSchemaBench (Geng et al. 2025, 10 datasets of real-world JSON Schemas): how many schemas
each converter takes, and how many outputs are valid.

Compile coverage, every schema of every dataset:
  ours strict       pyllamaopt.grammar.compile_json_schema(strict=True): the grammar enforces
                    the whole schema (else UnenforceableSchemaError / GrammarError)
  ours              strict=False: enforces what a grammar can, the rest checked afterwards
  exact             of those, grammars that left nothing out
  llama.cpp         llama-cpp-python's llama_grammar.json_schema_to_gbnf (llama.cpp's Python
                    converter, as llama-cpp-python 0.3.36 ships it): returns a grammar that
                    llama.cpp's grammar parser accepts. It never refuses a keyword; what it
                    does not understand it ignores.
  + conversion time (median, max) of each; every grammar of ours is also run through llama.cpp's
  parser (it must accept all of them).

Empirical coverage (--generate), a seeded random sample of --sample schemas per dataset, on
Gemma 3 270M (greedy, a short instruction prompt, max 512 tokens): the output is parsed and
checked against the schema (jsonschema, formats checked, multipleOf on decimals:
pyllamaopt/grammar/validation.py, the same check for both engines): valid / invalid /
truncated (max_tokens reached) / refused (no grammar), for ours (strict=False), ours-fit (the
same with schema_fit_max_tokens: the output closed within max_tokens instead of cut off) and
llama-cpp-python's grammar path; time to first token and grammar time per token.

    python benchmarks/schemabench.py PATH [--generate] [--sample 10] [--seed 0] [--datasets A,B]
                                          [--engines ours,ours-fit,llama-cpp-python]

PATH: the JSONSchemaBench data directory (PATH/<Dataset>/*.json).

llama-cpp-python 0.3.36 (the llama.cpp tree pyllamaopt pins), built without AMX, e.g. into a
directory of its own:
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON" \
    pip install --no-deps --target DIR llama-cpp-python==0.3.36 diskcache
  PYTHONPATH=.:DIR python benchmarks/schemabench.py PATH
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import random
import signal
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent))

from structured_output import LlamaCppPython, Pyllamaopt, Run  # noqa: E402

from pyllamaopt import GrammarError, Model, UnenforceableSchemaError, models  # noqa: E402
from pyllamaopt.grammar import SchemaGrammar, compile_json_schema  # noqa: E402

TIMEOUT_S = 30
OURS = {"ours": {}, "ours-fit": {"schema_fit_max_tokens": True}}  # our engines: their configurations


class _Timeout(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: int) -> Iterator[None]:
    def fire(*_: Any) -> None:
        raise _Timeout()

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@contextlib.contextmanager
def quiet_stderr() -> Iterator[None]:
    """llama.cpp prints grammar parse errors on fd 2."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


class LlamaParser:
    """llama.cpp's own grammar parser (llama_sampler_init_grammar on the model's vocabulary)."""

    def __init__(self, path: Path) -> None:
        import llama_cpp

        self.llama_cpp = llama_cpp
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        with quiet_stderr():
            self.model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)

    def accepts(self, gbnf: str) -> bool | None:
        """Whether llama.cpp parses the grammar; None if its (recursive) parser crashed on it. Run
        in a forked child: a deeply nested grammar overflows the parser's stack."""
        pid = os.fork()
        if pid == 0:  # the child: parse, answer with the exit status
            code = 2
            try:
                with quiet_stderr():
                    sampler = self.llama_cpp.llama_sampler_init_grammar(self.vocab, gbnf.encode(), b"root")
                code = 0 if sampler else 1
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            return None
        return os.WEXITSTATUS(status) == 0


def llama_cpp_converter(schema_text: str) -> str:
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    return json_schema_to_gbnf(schema_text)


@dataclass
class Compiled:
    ok: bool
    seconds: float
    grammar: Any = None  # SchemaGrammar (ours) or GBNF text (llama.cpp)
    why: str = ""


def timed(convert: Callable[[], Any]) -> Compiled:
    start = time.perf_counter()
    try:
        with time_limit(TIMEOUT_S):
            out = convert()
    except _Timeout:
        return Compiled(False, time.perf_counter() - start, why=f"timeout ({TIMEOUT_S} s)")
    except UnenforceableSchemaError as e:
        return Compiled(False, time.perf_counter() - start, why=f"unenforceable: {e.keyword}")
    except GrammarError as e:
        return Compiled(False, time.perf_counter() - start, why=f"refused: {str(e)[:60]}")
    except Exception as e:  # noqa: BLE001 - llama.cpp's converter raises whatever it meets
        return Compiled(False, time.perf_counter() - start, why=f"{type(e).__name__}: {str(e)[:60]}")
    return Compiled(True, time.perf_counter() - start, out)


@dataclass
class DatasetStats:
    n: int = 0
    ok: dict[str, int] = field(default_factory=lambda: collections.Counter())
    seconds: dict[str, list[float]] = field(default_factory=lambda: collections.defaultdict(list))
    ours_unparsed: int = 0


def load(path: Path) -> tuple[str, Any]:
    text = path.read_text(encoding="utf-8")
    return text, json.loads(text)


def compile_coverage(files: dict[str, list[Path]], parser: LlamaParser) -> tuple[dict[str, DatasetStats], Any, Any]:
    stats: dict[str, DatasetStats] = {}
    relaxed: collections.Counter = collections.Counter()
    refused: collections.Counter = collections.Counter()
    for dataset, paths in files.items():
        st = stats[dataset] = DatasetStats()
        for path in paths:
            st.n += 1
            try:
                text, schema = load(path)
            except (ValueError, UnicodeDecodeError):
                continue
            strict = timed(lambda: compile_json_schema(schema, strict=True))
            loose = timed(lambda: compile_json_schema(schema, strict=False))
            theirs = timed(lambda: llama_cpp_converter(text))
            st.ok["ours strict"] += strict.ok
            st.ok["ours"] += loose.ok
            st.seconds["ours"].append(loose.seconds)
            st.seconds["llama.cpp"].append(theirs.seconds)
            if loose.ok:
                st.ok["exact"] += loose.grammar.exact
                relaxed.update({r.keyword for r in loose.grammar.relaxed})
                st.ours_unparsed += parser.accepts(loose.grammar.gbnf) is not True
            else:
                refused[loose.why] += 1
            if not strict.ok and loose.ok:
                refused["strict: " + strict.why] += 1
            if theirs.ok:
                parsed = parser.accepts(theirs.grammar)
                st.ok["llama.cpp"] += parsed is True
                if parsed is not True:
                    refused["llama.cpp: " + ("grammar crashed llama.cpp's parser" if parsed is None
                                             else "grammar refused by llama.cpp's parser")] += 1
            else:
                refused["llama.cpp: " + theirs.why.split(":")[0]] += 1
        print(f"  {dataset}: {dict(st.ok)} of {st.n}", file=sys.stderr)
    return stats, relaxed, refused


def pct(k: int, n: int) -> str:
    return f"{100 * k / n:.1f} %" if n else "-"


def print_compile_table(stats: dict[str, DatasetStats], relaxed: Any, refused: Any) -> None:
    cols = ["ours strict", "ours", "exact", "llama.cpp"]
    print("\nCompile coverage (share of the dataset's schemas)\n")
    print("| dataset | schemas | " + " | ".join(cols) + " | ours ms (median / max) | llama.cpp ms (median / max) |")
    print("|---|---|" + "---|" * len(cols) + "---|---|")
    total = DatasetStats()
    for dataset, st in stats.items():
        total.n += st.n
        for c in cols:
            total.ok[c] += st.ok[c]
        for k, v in st.seconds.items():
            total.seconds[k] += v
        total.ours_unparsed += st.ours_unparsed
        print(row(dataset, st, cols))
    print(row("**all**", total, cols))
    print(f"\nour grammars llama.cpp's parser refused: {total.ours_unparsed}")
    print("\nleft to the check after generation (strict=False), schemas per keyword: "
          + ", ".join(f"{k} {v}" for k, v in relaxed.most_common(15)))
    print("not compiled, most common reasons: " + "; ".join(f"{v} × {k}" for k, v in refused.most_common(25)))


def row(name: str, st: DatasetStats, cols: list[str]) -> str:
    def ms(xs: list[float]) -> str:
        return f"{1000 * statistics.median(xs):.1f} / {1000 * max(xs):.0f}" if xs else "-"

    return (f"| {name} | {st.n} | " + " | ".join(pct(st.ok[c], st.n) for c in cols)
            + f" | {ms(st.seconds['ours'])} | {ms(st.seconds['llama.cpp'])} |")


def prompt_for(schema: Any) -> str:
    about = ""
    if isinstance(schema, dict):
        about = str(schema.get("title") or schema.get("description") or "").strip().splitlines()[0][:120] \
            if (schema.get("title") or schema.get("description")) else ""
    return f"Write an example JSON document{' for: ' + about if about else ''}.\nJSON:\n"


@dataclass
class Outcomes:
    counts: collections.Counter = field(default_factory=collections.Counter)
    runs: list[Run] = field(default_factory=list)
    invalid_enforced: int = 0  # invalid outputs of grammars that claimed to enforce everything


def classify(run: Run, check: Callable[[str], Any]) -> str:
    if run.finish == "length":
        return "truncated"
    valid = check(run.text).valid
    return "valid" if valid else "invalid" if valid is False else "unchecked"


def empirical(files: dict[str, list[Path]], sample: int, seed: int, max_tokens: int, model_name: str,
              engines: list[str]) -> None:
    path = models.resolve(model_name)
    model = Model(path, progress=False)
    ours = {name: Pyllamaopt(model, True, **config) for name, config in OURS.items() if name in engines}
    theirs = LlamaCppPython(path) if "llama-cpp-python" in engines else None
    parser = LlamaParser(path)
    results: dict[str, dict[str, Outcomes]] = {}
    for dataset, paths in files.items():
        chosen = random.Random(f"{seed}:{dataset}").sample(paths, min(sample, len(paths)))
        res = results[dataset] = {e: Outcomes() for e in engines}
        for p in chosen:
            text, schema = load(p)
            prompt = prompt_for(schema)
            mine = timed(lambda: compile_json_schema(schema, strict=False))
            outcomes = []
            for name, engine in ours.items():
                if mine.ok:
                    grammar: SchemaGrammar = mine.grammar
                    run = engine.run(grammar, prompt, max_tokens)
                    outcome = classify(run, grammar.check)
                    res[name].runs.append(run)
                    res[name].invalid_enforced += outcome == "invalid" and grammar.exact
                else:
                    outcome = "refused"
                res[name].counts[outcome] += 1
                outcomes.append(f"{name} {outcome}")
            if theirs is None:
                print(f"  {dataset}/{p.name}: " + ", ".join(outcomes), file=sys.stderr)
                continue
            theirs_gbnf = timed(lambda: llama_cpp_converter(text))
            if theirs_gbnf.ok and parser.accepts(theirs_gbnf.grammar) is True:  # (else it could crash)
                check = SchemaGrammar(schema, "", False, ()).check
                run2 = theirs.run_grammar(theirs_gbnf.grammar, prompt, max_tokens)
                outcome2 = classify(run2, check)
                res["llama-cpp-python"].runs.append(run2)
            else:
                outcome2 = "refused"
            res["llama-cpp-python"].counts[outcome2] += 1
            print(f"  {dataset}/{p.name}: " + ", ".join(outcomes) + f", llama-cpp-python {outcome2}", file=sys.stderr)
    print(f"\nEmpirical coverage: {sample} schemas per dataset (seed {seed}), {model.description}, greedy, "
          f"max_tokens {max_tokens}\n")
    kinds = ["valid", "invalid", "truncated", "refused", "unchecked"]
    print("| dataset | engine | " + " | ".join(kinds) + " | invalid where enforced | first token ms (median) "
          "| grammar µs / token | tok/s |")
    print("|---|---|" + "---|" * len(kinds) + "---|---|---|---|")
    totals: dict[str, Outcomes] = {e: Outcomes() for e in engines}
    for dataset, res in results.items():
        for engine, o in res.items():
            totals[engine].counts.update(o.counts)
            totals[engine].runs += o.runs
            totals[engine].invalid_enforced += o.invalid_enforced
            print(outcome_row(dataset, engine, o, kinds))
    for engine, o in totals.items():
        print(outcome_row("**all**", engine, o, kinds))


def outcome_row(dataset: str, engine: str, o: Outcomes, kinds: list[str]) -> str:
    n = sum(o.counts.values())
    tokens = sum(len(r.tokens) for r in o.runs)
    seconds = sum(r.seconds for r in o.runs)
    first = statistics.median([r.first_token_seconds for r in o.runs]) * 1000 if o.runs else 0.0
    check = f"{sum(r.check_us for r in o.runs) / max(1, tokens):.0f}" if engine in OURS else "-"
    return (f"| {dataset} | {engine} | " + " | ".join(f"{o.counts[k]}/{n}" for k in kinds)
            + f" | {o.invalid_enforced if engine in OURS else '-'} | {first:.0f} | {check} | "
              f"{tokens / seconds if seconds else 0:.1f} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path", type=Path, help="JSONSchemaBench data directory: PATH/<Dataset>/*.json")
    ap.add_argument("--datasets", default="", help="comma-separated (default: all)")
    ap.add_argument("--generate", action="store_true", help="also the empirical coverage (slow)")
    ap.add_argument("--no-compile", action="store_true", help="skip the compile coverage")
    ap.add_argument("--sample", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--engines", default="ours,llama-cpp-python",
                    help="for --generate: ours, ours-fit, llama-cpp-python (comma-separated)")
    args = ap.parse_args()
    if not args.path.is_dir():
        ap.error(f"{args.path} is not a directory")
    names = args.datasets.split(",") if args.datasets else sorted(d.name for d in args.path.iterdir() if d.is_dir())
    files = {name: sorted((args.path / name).glob("*.json")) for name in names}
    if not args.no_compile:
        stats, relaxed, refused = compile_coverage(files, LlamaParser(models.resolve(args.model)))
        print_compile_table(stats, relaxed, refused)
    if args.generate:
        engines = args.engines.split(",")
        if not set(engines) & set(OURS) or not set(engines) <= {*OURS, "llama-cpp-python"}:
            ap.error("--engines: ours and/or ours-fit, optionally with llama-cpp-python")
        empirical(files, args.sample, args.seed, args.max_tokens, args.model, engines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
