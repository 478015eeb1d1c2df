#!/usr/bin/env python3
"""Soak of the engine (issue 20): long runs in one process, checking that nothing grows and nothing drifts.
(benchmarks/soak.py soaks the server through pyllamaopt.client.)

    python benchmarks/soak_engine.py [--turns 1000] [--cycle 10] [--gen 4] [--sessions 10000] [--distinct 200]
                              [--phases turns,sessions] [--threads 2]

turns     Gemma 3 270M, one context, one session: the agent trace's turns (benchmarks/agent_trace_data.py)
          cycled, --cycle turns per cycle, append and reasoning shapes in turn; every turn syncs the
          session to the re-sent conversation and generates --gen tokens (greedy). Every answer is
          compared with the answer a fresh context with every optimization off gives to the same
          prompt (computed once per distinct prompt).
sessions  the tiny synthetic model (tests/tinymodel.py), one context: --sessions sessions created,
          given one of --distinct prompts (a shared 2-block system prefix and a suffix of their
          own; a few prompts often, most rarely: exponentially distributed), asked for 4 tokens
          and closed. The block pool is bounded to 24 blocks and the disk
          tier to 1 MiB: both budgets are exceeded over and over (closed sessions' blocks evicted,
          entries trimmed). Every answer is compared with a fresh all-off context's.

Reported at every checkpoint: resident memory (VmRSS), open file descriptors, threads, and for
the sessions phase the disk tier's size. Pass criteria: after warm-up (the first checkpoints,
--warmup of them), RSS stays within 5 % of its warm-up value; file descriptors and threads do
not grow; every answer equals the fresh context's; the disk tier stays within its budget.
Exit status 1 if any fails. Interrupted (SIGINT or SIGTERM: a run in the background ignores
SIGINT), a phase reports what it reached as INCOMPLETE, never as a pass, and the next phase runs.
"""
from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import agent_trace_data as data  # noqa: E402
from served import process_status  # noqa: E402

from pyllamaopt import Context, Model, OptConfig, PersistStore, models  # noqa: E402
from pyllamaopt.config import features  # noqa: E402


@dataclass
class Checkpoint:
    done: int
    seconds: float
    rss: float
    fds: int
    threads: int
    extra: str = ""


@dataclass
class Soak:
    name: str
    warmup: int
    planned: int
    checkpoints: list[Checkpoint] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)
    start: float = field(default_factory=time.perf_counter)

    def checkpoint(self, done: int, extra: str = "") -> None:
        status = process_status(os.getpid())
        c = Checkpoint(done, time.perf_counter() - self.start, status["rss"] / 2**20, status["fds"], status["threads"],
                       extra)
        self.checkpoints.append(c)
        print(f"  {c.done:>6}  {c.seconds:>7.0f} s  RSS {c.rss:>7.1f} MiB  fds {c.fds:>3}  threads {c.threads:>2}  "
              f"wrong answers {len(self.wrong)}  {c.extra}", flush=True)

    @contextmanager
    def interruptible(self) -> Iterator[None]:
        """SIGINT or SIGTERM ends the phase early; verdict() then says how far it got."""
        def interrupt(signum: int, frame: object) -> None:
            raise KeyboardInterrupt

        previous = {s: signal.signal(s, interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        except KeyboardInterrupt:
            print(f"  {self.name}: interrupted", flush=True)
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def verdict(self) -> bool:
        if not self.checkpoints:
            print(f"  {self.name}: no checkpoint reached  INCOMPLETE")
            return False
        base = self.checkpoints[min(self.warmup, len(self.checkpoints)) - 1]
        after = self.checkpoints[self.warmup:]
        peak = max((c.rss for c in after), default=base.rss)
        growth = (peak - base.rss) / base.rss
        fds = max((c.fds for c in after), default=base.fds) - base.fds
        threads_ = max((c.threads for c in after), default=base.threads) - base.threads
        last = self.checkpoints[-1]
        complete = last.done == self.planned
        ok = complete and growth <= 0.05 and fds <= 0 and threads_ <= 0 and not self.wrong
        print(f"  {self.name}: {last.done} of {self.planned} done in {last.seconds:.0f} s; after warm-up ({base.done}): RSS "
              f"{base.rss:.1f} -> peak {peak:.1f} MiB ({growth:+.1%}), final {last.rss:.1f}; fds {fds:+d}; "
              f"threads {threads_:+d}; answers different from a fresh context's: {len(self.wrong)}  "
              f"{'PASS' if ok else 'FAIL' if complete or self.wrong else 'INCOMPLETE'}")
        for w in self.wrong[:10]:
            print(f"    {w}")
        return ok


def fresh_answer(model: Model, prompt: list[int], n_gen: int, **context) -> list[int]:
    """The answer of a new context with every optimization off (the Tier-1 baseline)."""
    all_off = OptConfig(env={}, **{f.enabled_field: False for f in features() if f.compiled})
    with Context(model, config=all_off, **context) as ctx:
        s = ctx.session()
        s.sync(prompt)
        return [t.id for t in s.generate(n_gen)]


def soak_turns(args: argparse.Namespace) -> bool:
    model = Model(models.resolve(args.model), progress=False)
    system, turns = data.system_prompt(), data.turns(args.cycle)
    shapes = ("append", "reasoning")
    prompts = {(shape, i): model.tokenize(data.render(system, turns[:i], turns[i], shape=shape), special=True)
               for shape in shapes for i in range(args.cycle)}
    context = dict(n_ctx=8192, n_seq_max=2, n_threads=args.threads)
    print(f"## turns: {model.description}, {args.turns} turns, cycles of {args.cycle} (prompts "
          f"{min(map(len, prompts.values()))}..{max(map(len, prompts.values()))} tokens), shapes {shapes}, "
          f"{args.gen} tokens per answer, {args.threads} threads", flush=True)
    start = time.perf_counter()
    reference = {key: fresh_answer(model, prompt, args.gen, **context) for key, prompt in prompts.items()}
    print(f"  fresh-context answers of the {len(prompts)} distinct prompts: {time.perf_counter() - start:.0f} s", flush=True)

    soak = Soak("turns", args.warmup, args.turns)
    every = max(1, args.turns // 20)
    with soak.interruptible(), Context(model, config=OptConfig(env={}), **context) as ctx:
        session = ctx.session()
        for n in range(args.turns):
            key = (shapes[n // args.cycle % len(shapes)], n % args.cycle)
            session.sync(prompts[key])
            answer = [t.id for t in session.generate(args.gen)]
            if answer != reference[key]:
                soak.wrong.append(f"turn {n} {key}: {answer} != {reference[key]}")
            if (n + 1) % every == 0 or n + 1 == soak.planned:
                st = ctx.stats
                soak.checkpoint(n + 1, f"prefilled {st.tokens_prefilled}, kept by the diff {st.diff_tokens_unchanged}")
    return soak.verdict()


def soak_sessions(args: argparse.Namespace) -> bool:
    from tinymodel import WORDS, write_tiny_llama

    work = Path(tempfile.mkdtemp(prefix="pyllamaopt-soak-"))
    model = Model(write_tiny_llama(work / "tiny.gguf"))
    words = WORDS * 3
    system = model.tokenize(" ".join(words[:200]))[:128]  # two blocks every session shares
    prompts = [system + model.tokenize(" ".join(words[i % 97:][:20 + i % 150]) + f" request {i}", add_bos=False)
               for i in range(args.distinct)]
    budget_mib = 1
    config = OptConfig(env={}, dedup_pool_max=24, persist_enabled=True, persist_dir=str(work / "kv"),
                       persist_max_mb=budget_mib)
    context = dict(n_ctx=2048, n_batch=256, n_seq_max=8, n_threads=1)
    print(f"## sessions: tiny model, {args.sessions} sessions over {args.distinct} prompts "
          f"({min(map(len, prompts))}..{max(map(len, prompts))} tokens), block pool 24 blocks, disk tier "
          f"{budget_mib} MiB", flush=True)
    reference = [fresh_answer(model, p, 4, **context) for p in prompts]
    store = PersistStore(work / "kv")
    soak = Soak("sessions", args.warmup, args.sessions)
    every = max(1, args.sessions // 20)
    largest = 0
    rng = random.Random(0)
    with soak.interruptible(), Context(model, config=config, **context) as ctx:
        for n in range(args.sessions):
            i = min(int(rng.expovariate(1 / 15)), args.distinct - 1)  # some prompts often, most rarely
            s = ctx.session()
            s.append(prompts[i])
            answer = [t.id for t in s.generate(4)]
            s.close()
            if answer != reference[i]:
                soak.wrong.append(f"session {n} (prompt {i}): {answer} != {reference[i]}")
            if (n + 1) % every == 0 or n + 1 == soak.planned:
                size = store.size
                largest = max(largest, size)
                st = ctx.stats
                soak.checkpoint(n + 1, f"disk {size / 2**20:.2f} MiB in {len(store.entries())} entries; saves "
                                       f"{st.persist_saves}, restored {st.persist_tokens_restored} tokens; pool: "
                                       f"blocks hit {st.dedup_blocks_hit}, cached sequences evicted "
                                       f"{st.dedup_sequences_evicted}")
    within = largest <= budget_mib * 2**20
    print(f"  disk tier at most {largest / 2**20:.2f} MiB of {budget_mib} MiB: {'PASS' if within else 'FAIL'}")
    return soak.verdict() and within


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--phases", default="turns,sessions")
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--cycle", type=int, default=10)
    parser.add_argument("--gen", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sessions", type=int, default=10000)
    parser.add_argument("--distinct", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=4, help="checkpoints (of 20) before RSS is compared")
    args = parser.parse_args()
    phases = {"turns": soak_turns, "sessions": soak_sessions}
    results = [phases[p](args) for p in args.phases.split(",")]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
