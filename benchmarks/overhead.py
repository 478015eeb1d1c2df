"""What the optimization layer's own bookkeeping costs per turn of the agent trace, and the memory
of every cache and index (specification 000 §6.1; issue 19).

    python benchmarks/overhead.py [--model gemma3-270m] [--turns 6] [--gen 16] [--threads 1]
                                  [--shape reasoning] [--perf]

The trace (benchmarks/agent_trace_data.py) runs with the default switches (dedup, diff, canon,
memo, schema skip) and persistence on, every other turn under the tool-call JSON Schema; the
session is saved after each turn so that the disk tier's directory grows as a server's would.
Per turn:

  sync, gen        wall time of the turn's sync and of iterating its generation (the model's
                   work is in them)
  hash             the prompt's chained block hashes (_core.segment), all blocks (an upper bound:
                   the engine hashes only blocks it registers or looks up)
  diff             the diff of the previous history against the prompt (_core.DiffEngine)
  persist scan     reading every entry's header in the disk tier's directory (PersistStore.entries),
                   the scan each lookup makes (llama_opt_persist_store::find)
  setup            generate()'s own work before the first token: compiling the JSON Schema
                   to a grammar and parsing it
  grammar          the engine's own clock of the grammar checks (schema_check_us)
  memo drafting    the draft search the session runs before each step, replayed on the turn's
                   history in C++ (_core.memo_draft_cost), per generated token
  python/token     generate's CPU time (the calling thread's) minus that inside the engine's
                   step(), per token

hash, diff and the scan are the shortest of 5 runs; python/token is CPU time: both stay
meaningful on a loaded machine, the wall times of sync and gen do not.

hash and diff are timed through the bindings, so they include converting the token list; they
are an upper bound of what the engine spends. --perf samples the same run with perf record
(the unstripped copy benchmarks/profile_ops.py builds) and prints CPU time by symbol group:
the block pool's lookups and the rest, as far as inlining keeps them apart.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import agent_trace_data as data  # noqa: E402
import profile_ops  # noqa: E402

from pyllamaopt import Context, Model, OptConfig, PersistStore, _core  # noqa: E402

TOOL_CALL = {"type": "object", "properties": {
    "tool": {"enum": ["read_file", "edit_file", "run_tests", "search"]},
    "arguments": {"type": "object", "properties": {"path": {"type": "string", "maxLength": 12}}, "required": ["path"]}},
    "required": ["tool", "arguments"]}
POOL_BLOCK_BYTES = 120  # a pool entry besides its tokens: ids, hashes, holders, two hash-map nodes (estimate)
OVERHEAD_GROUPS = [  # perf symbol groups of our bookkeeping, then the model's work (profile_ops)
    ("hashing", ("hash_block", "hash_chain", "llama_opt_hasher", "block_hash", "llama_opt_segment")),
    ("diff", ("llama_opt_diff",)),
    ("block pool", ("llama_opt_block_pool",)),
    ("persist", ("llama_opt_persist",)),
    ("memo drafting", ("llama_opt_memo",)),
    *profile_ops.PERF_GROUPS,
]


class TimedCore:
    """The engine's session with the CPU time of its step() counted (the rest passed through).
    With one compute thread the step computes in the calling thread, so the thread's CPU time
    outside step() is Python's own work, whatever else the machine runs."""

    def __init__(self, core: Any) -> None:
        self._core = core
        self.step_cpu = 0.0

    def step(self) -> Any:
        start = time.thread_time()
        try:
            return self._core.step()
        finally:
            self.step_cpu += time.thread_time() - start

    def __getattr__(self, name: str) -> Any:
        return getattr(self._core, name)


def timed(fn: Any, *args: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    result = fn(*args)
    return result, time.perf_counter() - start


def best_of(fn: Any, *args: Any, n: int = 5) -> float:
    """The shortest of n runs: a small operation's own time, without a loaded machine's preemptions."""
    return min(timed(fn, *args)[1] for _ in range(n))


def run(args: argparse.Namespace, persist_dir: str, control: profile_ops.PerfControl) -> None:
    model = Model(args.model)
    config = OptConfig({}, persist_enabled=True, persist_dir=persist_dir, persist_max_mb=0)
    system, turns = data.system_prompt(), data.turns(args.turns)
    prompts = [model.tokenize(data.render(system, turns[:i], turns[i], shape=args.shape), special=True)
               for i in range(args.turns)]
    print(f"model {args.model}, {args.turns} turns of the '{args.shape}' shape, {args.gen} tokens generated a turn "
          f"(odd turns under a JSON Schema), threads {args.threads}, switches: defaults + persist")
    print(f"{'turn':>4} {'prompt':>6} {'computed':>8} {'passes':>6} {'sync ms':>8} {'gen ms':>8} {'hash us':>8} "
          f"{'diff us':>8} {'scan us':>8} {'entries':>7} {'setup ms':>8} {'grammar ms':>10} {'memo us/tok':>11} "
          f"{'py us/tok':>9}")
    engine = _core.DiffEngine(64, config.diff_min_unchanged)
    with Context(model, n_ctx=args.n_ctx, n_batch=512, n_threads=args.threads, config=config) as ctx:
        session = ctx.session()
        timed_core = TimedCore(session._core)
        session._core = timed_core  # type: ignore[assignment]
        control.send("enable")
        for i, prompt in enumerate(prompts):
            before, previous = ctx.stats, session.tokens
            _, t_sync = timed(session.sync, prompt)
            constraint = {"json_schema": TOOL_CALL} if i % 2 else {}
            stream, t_setup = timed(lambda: session.generate(args.gen, **constraint))
            timed_core.step_cpu, cpu_start = 0.0, time.thread_time()
            generation, t_gen = timed(list, stream)
            python_cpu = time.thread_time() - cpu_start - timed_core.step_cpu
            spent = ctx.stats - before
            n_gen = max(1, len(generation))
            t_hash = best_of(_core.segment, prompt, ctx.block_size)
            t_diff = best_of(engine.compute, previous, prompt)
            session.save()
            entries = PersistStore(persist_dir).entries()
            t_scan = best_of(lambda: PersistStore(persist_dir).entries())
            _, memo_ns = _core.memo_draft_cost(session.tokens, len(prompt))
            python_per_token = python_cpu / n_gen
            print(f"{i:>4} {len(prompt):>6} {spent.tokens_prefilled:>8} {spent.forward_passes:>6} {t_sync * 1e3:>8.1f} "
                  f"{t_gen * 1e3:>8.1f} {t_hash * 1e6:>8.0f} {t_diff * 1e6:>8.0f} {t_scan * 1e6:>8.0f} "
                  f"{len(entries):>7} {t_setup * 1e3:>8.1f} {spent.schema_check_us / 1e3:>10.2f} {memo_ns / 1e3 / n_gen:>11.1f} "
                  f"{python_per_token * 1e6:>9.0f}")
        control.send("disable")
        memory(model, ctx, persist_dir, config)


def memory(model: Model, ctx: Context, persist_dir: str, config: OptConfig) -> None:
    n_vocab, block = model.n_vocab, ctx.block_size
    disk = PersistStore(persist_dir).size
    rows = [
        ("KV cache, cells in use", ctx.kv_cells_used * model.kv_bytes_per_token,
         f"{ctx.kv_cells_used} cells x {model.kv_bytes_per_token} B"),
        ("block pool (dedup index)", ctx.pool_blocks * (block * 4 + POOL_BLOCK_BYTES),
         f"{ctx.pool_blocks} blocks x ({block} tokens x 4 B + ~{POOL_BLOCK_BYTES} B)"),
        ("memo check rows (during a generation)", (config.memo_draft_max + 1) * n_vocab * 4,
         f"({config.memo_draft_max} drafted + 1) rows x {n_vocab} logits x 4 B; released at the end"),
        ("logits kept per session", n_vocab * 4, f"{n_vocab} x 4 B"),
        ("session history and block chain", ctx.kv_cells_used * 4 + ctx.kv_cells_used // block * 8,
         "4 B a token + 8 B a block"),
        ("disk tier (persist directory)", disk, "on disk, not in RAM"),
    ]
    print("\nmemory of every cache and index (end of the trace)")
    for name, size, how in rows:
        print(f"  {name:<40} {size / 2**20:>9.2f} MiB   {how}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--gen", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--n-ctx", type=int, default=16384)
    parser.add_argument("--shape", default="reasoning", choices=["append", "reasoning", "workspace", "edits"])
    parser.add_argument("--perf", action="store_true", help="also: CPU time by symbol group under perf")
    parser.add_argument("--perf-control", help=argparse.SUPPRESS)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as persist_dir:
        run(args, persist_dir, profile_ops.PerfControl(args.perf_control))
    if args.perf:
        package = profile_ops.unstripped_package(Path(__file__).resolve().parent.parent)
        cmd = [sys.executable, __file__, "--model", args.model, "--turns", str(args.turns), "--gen", str(args.gen),
               "--threads", str(args.threads), "--n-ctx", str(args.n_ctx), "--shape", args.shape]
        shares, seconds = profile_ops.perf_shares(cmd, package, OVERHEAD_GROUPS)
        print(f"\nCPU time by symbol group over the turns (perf: {seconds:.2f} s sampled, "
              f"{seconds / args.turns * 1e3:.0f} ms a turn)")
        for name, share in sorted(shares.items(), key=lambda kv: -kv[1]):
            print(f"  {name:<34} {share:>6.2f}%  {share / 100 * seconds / args.turns * 1e3:>8.2f} ms/turn")


if __name__ == "__main__":
    main()
