"""The CLI's subcommands: each takes the parsed arguments and returns an exit code."""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from typing import TypedDict

from .. import build_info, features, fields
from ..chat import Chat
from ..config import CLI_VARIABLES, OptConfig
from ..context import Context
from ..errors import ContextOverflowError, InvalidArgumentError, PersistError, PyllamaoptError
from ..model import Model
from ..persist import PersistStore, default_persist_dir
from ..session import Generation

# Gemma 3 270M is a base model: a plain question/answer transcript suits it better than a chat
# template. Each turn re-sends the whole transcript, as agents do; the session keeps the KV of
# what it has already seen.
DEMO_PREAMBLE = (
    "A conversation between a programmer and a Python expert who answers in one sentence.\n"
    "The programmer is working on this module, mathkit/core.py:\n\n"
    + "".join(f"def op_{i}(a: float, b: float) -> float:\n"
              f"    \"\"\"Combine a and b (variant {i}).\"\"\"\n"
              f"    return a * {i + 1} + b\n\n" for i in range(8))
    + "\n")
DEMO_QUESTIONS = [
    "What does the function `def add(a, b): return a + b` do?",
    "How would I test it with pytest?",
    "What happens if a and b are strings?",
    "What is a better name for the function?",
    "What is a docstring?",
    "Thank you!",
]


def _context(args: argparse.Namespace) -> Context:
    model = Model(args.model, verbose=args.verbose)
    return Context(model, n_ctx=args.n_ctx, n_threads=args.threads)


class _Sampling(TypedDict):
    """The generate() arguments the CLI's options set."""
    max_tokens: int | None
    temperature: float
    seed: int | None
    repeat_penalty: float
    frequency_penalty: float
    presence_penalty: float
    repeat_last_n: int


def _sampling(args: argparse.Namespace) -> _Sampling:
    return {"max_tokens": args.max_tokens, "temperature": args.temperature, "seed": args.seed,
            "repeat_penalty": args.repeat_penalty, "frequency_penalty": args.frequency_penalty,
            "presence_penalty": args.presence_penalty, "repeat_last_n": args.repeat_last_n}


class _KvTypes(TypedDict):
    """The --kv-type* options (serve's and cache's), ServeSettings' fields; None where not given."""
    kv_type: str | None
    kv_type_k: str | None
    kv_type_v: str | None


def _kv_types(args: argparse.Namespace) -> _KvTypes:
    return {"kv_type": args.kv_type, "kv_type_k": args.kv_type_k, "kv_type_v": args.kv_type_v}


def _stream(generation: Generation) -> None:
    for token in generation:
        sys.stdout.write(token.text)
        sys.stdout.flush()
    sys.stdout.write("\n")


def run(args: argparse.Namespace) -> int:
    prompt = args.prompt if args.prompt is not None else sys.stdin.read()
    with _context(args) as ctx:
        session = ctx.session()
        if args.chat:
            _stream(Chat(session).stream(prompt, **_sampling(args)))
        else:
            session.append_text(prompt)
            _stream(session.generate(**_sampling(args)))
    return 0


def chat(args: argparse.Namespace) -> int:
    with _context(args) as ctx:
        conversation = Chat(ctx.session(), system=args.system)
        if not ctx.model.chat_template:
            print(f"(note: {os.path.basename(ctx.model.path)} has no chat template, a base model: its built-in turn format is "
                  "used, and a base model rarely answers well; an instruction-tuned model does, e.g. "
                  "--model smollm2-135m)", file=sys.stderr)
        print("(an empty line or Ctrl-D ends the chat)", file=sys.stderr)
        while True:
            try:
                line = input("> ")
            except EOFError:
                break
            if not line.strip():
                break
            try:
                _stream(conversation.stream(line, **_sampling(args)))
            except KeyboardInterrupt:
                print("\n(interrupted; the session goes on)", file=sys.stderr)
            except ContextOverflowError as exc:
                print(f"(that message does not fit: {exc}; the conversation is as before it)", file=sys.stderr)
    return 0


def demo(args: argparse.Namespace) -> int:
    with _context(args) as ctx:
        print(f"model: {ctx.model.description}   context: {ctx.n_ctx} tokens\n")
        session, transcript, rows = ctx.session(), DEMO_PREAMBLE, []
        for turn, question in enumerate(DEMO_QUESTIONS[: max(1, args.turns)], 1):
            transcript += f"Q: {question}\nA:"
            before, start = session.stats, time.perf_counter()
            session.sync(ctx.model.tokenize(transcript))
            generation = session.generate(stop=["\nQ:", "\n\n"], **_sampling(args))
            first_token_at = None
            print(f"[{turn}] Q: {question}\n    A:", end="")
            for token in generation:
                first_token_at = first_token_at or time.perf_counter()
                sys.stdout.write(token.text.replace("\n", " "))
                sys.stdout.flush()
            transcript += generation.text + "\n"
            spent = session.stats - before
            rows.append((turn, session.n_tokens - len(generation.tokens), spent.tokens_prefilled,
                         spent.tokens_generated, spent.forward_passes,
                         (first_token_at or time.perf_counter()) - start, time.perf_counter() - start))
            print("\n")
        print("turn  prompt  computed  generated  forward passes  first token  total")
        for turn, prompt, computed, generated, passes, ttft, total in rows:
            print(f"{turn:>4}  {prompt:>6}  {computed:>8}  {generated:>9}  {passes:>14}  {ttft * 1000:>8.0f} ms"
                  f"  {total:.2f} s")
        print("\nEvery turn re-sends the whole transcript; 'computed' counts the prompt tokens whose KV"
              "\nhad to be computed, the rest was kept from the previous turn. LLAMA_OPT_STATS=1 prints"
              "\nevery counter per turn.")
    return 0


def config(args: argparse.Namespace) -> int:
    if args.list:
        print("LLAMA_OPT_* variables of the optimization layer:")
        for f in fields():
            # a float field holds a C float: 7 significant digits give it back exactly
            default = f"{f.default:.7g}" if isinstance(f.default, float) else str(f.default)
            print(f"  {f.env:<34} {f.type:<5} default {default:<8} {f.help}")
        print("\nLLAMA_OPT_* variables of the CLI:")
        for name, text in CLI_VARIABLES.items():
            print(f"  {name:<34} {text}")
        return 0
    cfg = OptConfig()
    print(f"{'option':<28} {'value':<10} {'source':<12} variable")
    for name, value, source, env in cfg.table():
        note = ""
        if isinstance(value, float):
            value = f"{value:.7g}"  # a C float: 7 significant digits give it back exactly
        elif name == "persist_dir" and not value:
            value, note = "(default)", f"  = {default_persist_dir()}"
        print(f"{name:<28} {value!s:<10} {source:<12} {env}{note}")
    print(f"\n{'feature':<12} {'tier':<5} {'compiled':<9} {'implemented':<12} runtime switch")
    values = cfg.as_dict()
    for feature in features():
        state = "on" if values[feature.enabled_field] else "off"
        print(f"{feature.name:<12} {feature.tier:<5} {'yes' if feature.compiled else 'no':<9} "
              f"{'yes' if feature.implemented else 'no':<12} {feature.enabled_field}={state}")
    print("\nSwitches accepted (the specification's interface) that do nothing:")
    for feature in features():
        if feature.no_effect:
            print(f"  {feature.enabled_field:<20} {feature.no_effect}")
    return 0


def info(args: argparse.Namespace) -> int:
    for key, value in build_info().items():
        print(f"{key}: {value}")
    if args.model:
        model = Model(args.model)
        print(f"\nmodel: {model.path}\n  {model.description}, architecture {model.architecture}")
        print(f"  layers {model.n_layer}, embedding {model.n_embd}, heads {model.n_head} (KV {model.n_head_kv}), "
              f"vocabulary {model.n_vocab}, trained context {model.n_ctx_train}, sliding window {model.n_swa}")
        print(f"  chat template: {'in the file' if model.chat_template else 'none in the file'}")
    return 0


def cache(args: argparse.Namespace) -> int:
    try:
        store = PersistStore(args.dir)
    except InvalidArgumentError as exc:
        raise SystemExit(f"pyllamaopt: error: {exc}") from None
    refusal = store.refusal()
    if refusal:  # still listed, verified and cleaned: `clean --all` is how to clear an untrusted one
        print(f"pyllamaopt: warning: contexts with persistence refuse this directory: {refusal}", file=sys.stderr)
    if args.action == "ls":
        entries, leftovers = store.entries(), store.leftovers()
        print(f"{store.directory}: {len(entries)} entries, {sum(e.size for e in entries) / 2**20:.1f} MiB")
        if leftovers:
            print(f"  and {len(leftovers)} file(s) of interrupted saves, {sum(s for _, s in leftovers) / 2**20:.1f} MiB "
                  "(`pyllamaopt cache clean` removes those older than an hour, `clean --all` all)")
        layout = _layout(args, store) if args.model and entries else None
        for e in sorted(entries, key=lambda e: e.mtime, reverse=True):
            state = f"  PROBLEM: {e.problem}" if e.problem else ""
            if layout is not None and not e.problem:
                state = f"  {e.unusable_by(layout) or 'usable'}"
            extends = f"  extends the entry of its first {e.base_tokens} tokens" if e.base_tokens else ""
            print(f"  {e.path.name}  {e.n_tokens:>7} tokens  {e.size / 2**20:>8.1f} MiB  "
                  f"used {e.age / 3600:>7.1f} h ago  model {e.model_hash:016x}{state}{extends}")
        if layout is not None:
            usable = [e for e in entries if not e.unusable_by(layout)]
            print(f"{args.model} (KV {layout['kv_type']}): {len(usable)} entries "
                  f"({sum(e.n_tokens - e.base_tokens for e in usable)} tokens) usable after a restart, "
                  f"{len(store.foreign(layout))} for another model, build or KV type (never used by it)")
        return 0
    if args.action == "verify":
        problems = store.verify(remove=args.remove)
        for path, problem in problems.items():
            print(f"{path}: {problem}")
        kept = [p for p in problems if p.exists()]  # bad, and not removed (or not asked to)
        hint = (" (`pyllamaopt cache verify --remove` removes them)" if not args.remove else
                " (removed)" if not kept else f" ({len(problems) - len(kept)} removed, {len(kept)} could not be)")
        print(f"{len(store.entries())} entries left, {len(problems)} bad" + (hint if problems else ""))
        return 1 if kept else 0
    if args.max_age is not None and not (math.isfinite(args.max_age) and args.max_age > 0):
        raise SystemExit("pyllamaopt: error: --max-age must be a positive number of days")
    if args.max_mb is not None and not (math.isfinite(args.max_mb) and args.max_mb >= 0):
        raise SystemExit("pyllamaopt: error: --max-mb must be a number >= 0")
    if args.foreign and args.all:
        raise SystemExit("pyllamaopt: error: give --foreign or --all, not both (--all removes every entry)")
    if args.foreign and not args.model:
        raise SystemExit("pyllamaopt: error: --foreign needs --model MODEL (or $LLAMA_OPT_MODEL): the model whose "
                         "server's entries to keep")
    layout = _layout(args, store) if args.foreign else None  # (the model is loaded before anything goes)
    try:
        removed = store.clear() if args.all else store.clean(
            max_age=None if args.max_age is None else args.max_age * 86400, max_mb=args.max_mb)
        foreign = 0 if layout is None else store.remove_foreign(layout)
    except (InvalidArgumentError, PersistError) as exc:  # days beyond what seconds can count; files kept
        raise SystemExit(f"pyllamaopt: error: {exc}") from None
    of_others = "" if layout is None else f" ({foreign} for another model, build or KV type)"
    print(f"removed {removed + foreign} file(s){of_others}; {len(store.entries())} entries left in {store.directory}")
    return 0


def _layout(args: argparse.Namespace, store: PersistStore) -> dict[str, object]:
    """The layout of the entries a server of --model with the --kv-type* given (its context as
    `pyllamaopt serve` makes it, this build) writes and restores in the store's directory."""
    from ..serve import ServeSettings

    server = ServeSettings(model=args.model, **_kv_types(args))  # (its config as the server's, below)
    config = server.set_kv_types(OptConfig(persist_enabled=True, persist_dir=str(store.directory)))
    try:
        model = Model(args.model)
    except PyllamaoptError as exc:
        raise SystemExit(f"pyllamaopt: error: --model {args.model}: {exc}") from None
    with Context(model, n_ctx=256, n_seq_max=1, config=config) as context:  # (the layout does not depend on sizes)
        layout = context.persist_layout
    assert layout is not None, "a context with persistence has a layout"
    return layout


def serve(args: argparse.Namespace) -> int:
    from ..serve import ServeSettings
    from ..serve.schema_cache import DEFAULT_JSON_WHITESPACE
    from ..serve import serve as run_server

    if args.replicas is not None and not args.ray:
        raise SystemExit("pyllamaopt serve: --replicas needs --ray")
    settings = ServeSettings(model=args.model, host=args.host, port=args.port, grpc_port=args.grpc_port,
                             **_kv_types(args), n_ctx=args.n_ctx, threads=args.threads, api_key=args.api_key,
                             tls_cert=args.tls_cert, tls_key=args.tls_key, max_sessions=args.max_sessions,
                             session_ttl=args.session_ttl,
                             approximate_reuse=args.approximate_reuse, sparse_tool_results=args.sparse_tool_results,
                             json_whitespace=args.json_whitespace or DEFAULT_JSON_WHITESPACE,
                             chat_template_file=args.chat_template_file,
                             verbose=args.verbose)
    # a malformed LLAMA_OPT_* variable or --kv-type* stops here, before the model loads
    settings.set_kv_types(OptConfig())
    if args.ray:
        from ..ray.deploy import RayOptions, serve_on_ray

        serve_on_ray(settings, RayOptions(replicas=2 if args.replicas is None else args.replicas, router=args.ray_router))
    else:
        run_server(settings)
    return 0
