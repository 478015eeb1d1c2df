#!/usr/bin/env python3
"""JSON-schema-constrained generation on Gemma 3 270M, greedy, side by side in one run:

  unconstrained     the same prompts without a grammar (the step time to compare with)
  full-mask         pyllamaopt, every token of the vocabulary checked every step (as llama.cpp's
                    grammar sampler does), no skipping
  constrained       pyllamaopt's fast masking (best candidates first), no skipping
  exact-skip        + tokens the grammar forces taken without logits (the default; exact)
  jump-forward      + strings the grammar forces tokenized and taken whole, their KV in one batch
                    (opt-in: changes tokenization)
  llama-cpp-python  0.3.36 with LlamaGrammar.from_json_schema (same llama.cpp)

    python benchmarks/structured_output.py [--engines ...] [--max-tokens 160] [--limit N]
                                           [--whitespace spaced,indented] [--model M] [--chat]

--whitespace: the grammar's layouts (pyllamaopt.grammar.WHITESPACE) to compare, each of our
engines run with each (rows "engine@layout"; "same as constrained" against constrained with the
same layout). --chat: each prompt sent as a user message through the model's chat template (an
instruction-tuned model, e.g. --model smollm2-135m) instead of as raw text.

Schemas and prompts: benchmarks/schemas.py. Reported per engine: outputs valid against their
schema (jsonschema), truncated at max_tokens, failed (the engine could not take the schema),
forward passes per output token, share of tokens
forced (taken without logits), grammar time per token, tokens/s, and outputs token-identical to
"constrained" (exactness of skipping).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from schemas import SCHEMAS  # noqa: E402

from pyllamaopt import Context, Model, OptConfig, models  # noqa: E402
from pyllamaopt.chat import ChatTemplate  # noqa: E402
from pyllamaopt.grammar import WHITESPACE, compile_json_schema  # noqa: E402

N_CTX = 2048


@dataclass
class Run:
    tokens: list[int]
    text: str
    finish: str
    seconds: float
    passes: int = 0
    forced: int = 0
    check_us: int = 0
    first_token_seconds: float = 0.0  # from the call to generate (the grammar set up) to the first token


@dataclass
class Totals:
    runs: list[Run] = field(default_factory=list)

    def sum(self, attr: str) -> float:
        return sum(getattr(r, attr) for r in self.runs)


class Pyllamaopt:
    def __init__(self, model: Model, grammar: bool, **config: bool) -> None:
        self.model, self.grammar = model, grammar
        self.ctx = Context(model, n_ctx=N_CTX, n_threads=2, config=OptConfig(env={}, **config))

    def run(self, schema: object, prompt: str | list[int], max_tokens: int) -> Run:
        s = self.ctx.session()
        s.append_text(prompt) if isinstance(prompt, str) else s.append(prompt)
        before = s.stats
        start = time.perf_counter()
        g = s.generate(max_tokens, json_schema=schema if self.grammar else None)  # (a dict, or compiled)
        tokens, first = [], 0.0
        for t in g:
            first = first or time.perf_counter() - start
            tokens.append(t.id)
        seconds = time.perf_counter() - start
        st = s.stats - before
        s.close()
        return Run(tokens, g.text, g.finish_reason, seconds, st.forward_passes, st.schema_tokens_skipped,
                   st.schema_check_us, first)


class LlamaCppPython:
    def __init__(self, path: Path) -> None:
        from llama_cpp import Llama

        import llama_cpp

        self.llm = Llama(model_path=str(path), n_ctx=N_CTX, n_batch=512, n_threads=2, flash_attn=True, verbose=False)
        vocab = llama_cpp.llama_model_get_vocab(self.llm._model.model)
        self.is_eog = lambda token: llama_cpp.llama_vocab_is_eog(vocab, token)

    def run(self, schema: object, prompt: str | list[int], max_tokens: int) -> Run:
        from llama_cpp.llama_grammar import json_schema_to_gbnf

        return self.run_grammar(json_schema_to_gbnf(json.dumps(schema)), prompt, max_tokens)

    def run_grammar(self, gbnf: str, prompt: str | list[int], max_tokens: int) -> Run:
        from llama_cpp import LlamaGrammar

        grammar = LlamaGrammar.from_string(gbnf, verbose=False)
        tokens = self.llm.tokenize(prompt.encode(), add_bos=True, special=False) if isinstance(prompt, str) else prompt
        self.llm.reset()
        self.llm.eval(tokens)  # the prompt, outside the timed part (as for pyllamaopt)
        start = time.perf_counter()
        out: list[int] = []
        first = 0.0
        # reset=True (the default) finds the evaluated prompt cached and samples at once;
        # reset=False would skip that check and evaluate the prompt a second time after itself
        for token in self.llm.generate(tokens, temp=0.0, grammar=grammar):
            first = first or time.perf_counter() - start
            if self.is_eog(token):
                finish = "eos"
                break
            out.append(token)
            if len(out) >= max_tokens:
                finish = "length"
                break
        else:
            finish = "eos"
        seconds = time.perf_counter() - start
        text = self.llm.detokenize(out).decode("utf-8", "replace")
        return Run(out, text, finish, seconds, passes=len(out), first_token_seconds=first)


def valid(schema: object, text: str) -> bool:
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), schema)
        return True
    except (ValueError, jsonschema.ValidationError):
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--engines", default="unconstrained,full-mask,constrained,exact-skip,jump-forward,llama-cpp-python")
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--limit", type=int, default=0, help="only the first N schemas")
    parser.add_argument("--whitespace", default="spaced", help=f"layouts to compare, of {', '.join(WHITESPACE)}")
    parser.add_argument("--chat", action="store_true", help="prompts through the model's chat template")
    args = parser.parse_args()
    layouts = args.whitespace.split(",")
    if not set(layouts) <= set(WHITESPACE):
        parser.error(f"--whitespace: layouts of {', '.join(WHITESPACE)}")

    path = models.resolve(args.model)
    model = Model(path, progress=False)
    factories = {
        "unconstrained": lambda: Pyllamaopt(model, False),
        "full-mask": lambda: Pyllamaopt(model, True, schema_skip_enabled=False, schema_full_mask=True),
        "constrained": lambda: Pyllamaopt(model, True, schema_skip_enabled=False),
        "exact-skip": lambda: Pyllamaopt(model, True),
        "jump-forward": lambda: Pyllamaopt(model, True, schema_jump_forward=True),
        "llama-cpp-python": lambda: LlamaCppPython(path),
    }
    cases = SCHEMAS[: args.limit] if args.limit else SCHEMAS
    if args.chat:
        template = ChatTemplate.for_model(model)
        cases = [(case, schema, model.tokenize(template.render([{"role": "user", "content": prompt.strip()}]),
                                               add_bos=False, special=True))  # the markup as special tokens
                 for case, schema, prompt in cases]
    engines = {}  # row name -> (engine, layout: None for llama-cpp-python, which takes the schema)
    for name in args.engines.split(","):
        try:
            engine = factories[name]()
        except ImportError as exc:
            print(f"{name}: not available ({exc})")
            continue
        for layout in layouts if isinstance(engine, Pyllamaopt) and engine.grammar else [None]:
            engines[name if layout is None or len(layouts) == 1 else f"{name}@{layout}"] = (engine, layout)
    totals = {name: Totals() for name in engines}
    for case, schema, prompt in cases:
        grammars = {layout: compile_json_schema(schema, whitespace=layout) for layout in layouts}  # fails early
        for name, (engine, layout) in engines.items():  # interleaved: the machine's drift hits all alike
            try:
                totals[name].runs.append(engine.run(schema if layout is None else grammars[layout], prompt,
                                                    args.max_tokens))
            except Exception as exc:  # e.g. a converter that cannot handle the schema: reported
                print(f"  {case}: {name} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
                totals[name].runs.append(Run([], "", "failed", 0.0))
        print(f"  {case}: " + " | ".join(f"{n} {t.runs[-1].finish} {len(t.runs[-1].tokens)}" for n, t in totals.items()),
              file=sys.stderr)

    print(f"model {model.description}; 2 threads; greedy; {len(cases)} schemas; max_tokens {args.max_tokens}; "
          f"{'chat template' if args.chat else 'raw prompts'}\n")
    header = (f"{'engine':<17} {'valid':>7} {'truncated':>9} {'failed':>6} {'tokens':>7} {'passes/tok':>10} {'forced':>7} "
              f"{'grammar us/tok':>14} {'tok/s':>7} {'same as constrained':>19}")
    print(header)
    rates = {}
    for name, t in totals.items():
        layout = engines[name][1]
        reference = totals.get("constrained" if layout is None or len(layouts) == 1 else f"constrained@{layout}")
        n = sum(len(r.tokens) for r in t.runs)
        done = [(r, s) for r, (_, s, _) in zip(t.runs, cases) if r.finish not in ("length", "failed")]
        ok = sum(valid(s, r.text) for r, s in done) if name != "unconstrained" else 0
        truncated = sum(r.finish == "length" for r in t.runs)
        failed = sum(r.finish == "failed" for r in t.runs)
        rates[name] = n / t.sum("seconds")
        same = (sum(a.tokens == b.tokens for a, b in zip(t.runs, reference.runs)) if reference else 0)
        print(f"{name:<17} {f'{ok}/{len(done)}' if name != 'unconstrained' else '-':>7} {truncated:>9} {failed:>6} {n:>7} "
              f"{t.sum('passes') / max(1, n):>10.3f} {t.sum('forced') / max(1, n):>7.3f} "
              f"{t.sum('check_us') / max(1, n):>14.0f} {rates[name]:>7.1f} "
              f"{f'{same}/{len(t.runs)}' if reference else '-':>19}")
    if "unconstrained" in rates:
        for name in rates:
            if name != "unconstrained":
                print(f"tok/s {name} / unconstrained: {rates[name] / rates['unconstrained']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
