#!/usr/bin/env python3
"""Cold start from the persistent KV cache (kv-cache-persist) on Gemma 3 270M, against a full
prefill and against llama.cpp's own sequence state files, in one run:

  prefill    a fresh Context with persistence off: append(prompt) + first token
  save       a Context with persistence on and an empty directory computes the prompt again
             (its prefill time is the overhead check of persistence on a miss), then
             session.save() writes the KV of its complete 64-token blocks
  cold       a fresh Context on that directory after the entry's pages were dropped from the
             page cache: append(prompt) + first token (the last >= 64 tokens are computed for
             the logits, the rest is read back), with a fresh Model object (what a restarted
             process does, minus loading the model: the Context hashes the weights file once
             per Model object) and with the Model object reused
  warm       the same, reused Model, the entry in the page cache
  llama.cpp  llama-cpp-python 0.3.36's low-level API on the same GGUF, same n_ctx, flash
             attention on, swa_full, 2 threads, 512-token batches: prefill, then
             llama_state_seq_save_file; a fresh context llama_state_seq_load_file's it (cold and
             warm), removes the last position and decodes the last token again for its logits.
             Its file holds, for sliding-window layers, only the cells inside the window of the
             last position (llama_kv_cache::state_write skips SWA-masked cells, even with
             swa_full): it can resume that one context, not serve a shorter prefix of it, while
             a pyllamaopt entry holds every layer at every position of its complete blocks

    python benchmarks/persist_restore.py [--sizes 2048,8192,16384] [--reps 3] [--gen 16]

n_ctx = size + 256. The prompt is the scripted agent conversation of
benchmarks/agent_trace_data.py, long enough and cut to exactly `size` tokens. Restore timings
are the median of --reps runs; Context creation (which hashes the model with a fresh Model)
is reported apart from the TTFT. Exactness: the logits after the prompt must be bitwise equal
(np.array_equal) and the --gen greedy tokens identical to those of the full prefill, for every
restore. Cache drop: fsync + posix_fadvise(DONTNEED) of the entry file (works without root for
clean pages), plus `echo 1 > /proc/sys/vm/drop_caches` when permitted; the pages still resident
afterwards are counted with mincore(2) and reported (in a VM the host may still cache the disk).
drop_caches also evicts the GGUF: for the fresh-Model runs the file is read back into the page
cache after loading the Model (its mmapped tensors would otherwise be paged in by the first
forward pass, which is model loading, not restoring).
Target (issue): restore TTFT <= 1/20 of the full prefill's at 8k tokens.
"""
from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import mmap
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import agent_trace_data as data  # noqa: E402

import numpy as np  # noqa: E402

import pyllamaopt  # noqa: E402
from pyllamaopt import Context, Model, OptConfig, PersistStore, _core, models  # noqa: E402

N_THREADS = 2
CTX_MARGIN = 256


# --- the page cache -------------------------------------------------------------------------

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


def resident_fraction(path: Path) -> float | None:
    """Share of the file's pages in the page cache (mincore), None if it cannot be told."""
    size = path.stat().st_size
    if size == 0:
        return 0.0
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            return None
        try:
            pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
            vec = (ctypes.c_ubyte * pages)()
            if _libc.mincore(addr, size, vec) != 0:
                return None
            return sum(v & 1 for v in vec) / pages
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)


def drop_page_cache(paths: list[Path]) -> tuple[str, float | None]:
    """Evict the files' pages; returns (methods that were accepted, resident share afterwards)."""
    methods = []
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)  # only clean pages can be dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    methods.append("fadvise")
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
        methods.append("drop_caches")
    except OSError:
        pass
    fractions = [resident_fraction(p) for p in paths]
    resident = None if any(f is None for f in fractions) else max(fractions, default=0.0)
    return "+".join(methods), resident


def warm_page_cache(paths: list[Path]) -> None:
    for path in paths:
        with open(path, "rb") as f:
            while f.read(1 << 24):
                pass


# --- the prompt -----------------------------------------------------------------------------

def build_prompt(model: Model, n_tokens: int) -> list[int]:
    """The agent conversation of agent_trace_data, with enough turns, cut to n_tokens tokens."""
    system = data.system_prompt()
    n_turns = 8
    while True:
        turns = data.turns(n_turns)
        tokens = model.tokenize(data.render(system, turns[:-1], turns[-1], shape="append"), special=True)
        if len(tokens) >= n_tokens:
            return tokens[:n_tokens]
        n_turns *= 2


# --- pyllamaopt -----------------------------------------------------------------------------

@dataclass
class Run:
    ctx_ms: float              # Context creation
    ttft_ms: float             # append(prompt) + first generated token
    logits: np.ndarray
    tokens: list[int]
    restored: int = 0
    prefilled: int = 0
    loads: int = 0
    misses: int = 0
    resident: float | None = None  # share of the entry's pages cached when the run started
    drop: str = ""


def run_session(model: Model, n_ctx: int, prompt: list[int], n_gen: int, persist_dir: Path | None,
                save: bool = False) -> tuple[Run, int, float]:
    """One fresh Context: append the prompt, time to the first token, then n_gen greedy tokens.
    With save, the prompt's complete blocks are saved before generating (returns tokens, ms)."""
    config = OptConfig(env={}, persist_enabled=persist_dir is not None,
                       **({"persist_dir": str(persist_dir)} if persist_dir is not None else {}))
    start = time.perf_counter()
    ctx = Context(model, n_ctx=n_ctx, n_threads=N_THREADS, config=config)
    ctx_ms = (time.perf_counter() - start) * 1000
    try:
        session = ctx.session()
        start = time.perf_counter()
        session.append(prompt)
        prompt_done = time.perf_counter()
        logits = session.logits()  # a copy, taken outside the timed span
        saved, save_ms = 0, 0.0
        if save:
            t = time.perf_counter()
            saved = session.save()
            save_ms = (time.perf_counter() - t) * 1000
        stats = session.stats
        resume = time.perf_counter()
        generation = session.generate(n_gen)
        first = next(generation, None)
        ttft_ms = (prompt_done - start + time.perf_counter() - resume) * 1000
        tokens = ([first.id] if first else []) + [t.id for t in generation]
        run = Run(ctx_ms, ttft_ms, logits, tokens, stats.persist_tokens_restored, stats.tokens_prefilled,
                  stats.persist_loads, stats.persist_misses)
        return run, saved, save_ms
    finally:
        ctx.close()


def exact(run: Run, reference: Run) -> bool:
    return bool(np.array_equal(run.logits, reference.logits)) and run.tokens == reference.tokens


# --- llama.cpp ------------------------------------------------------------------------------

class LlamaCpp:
    """llama-cpp-python's low-level API: prefill, llama_state_seq_save_file, _load_file."""

    def __init__(self, path: Path) -> None:
        import llama_cpp

        self.lc = lc = llama_cpp
        self._quiet = lc.llama_log_callback(lambda level, text, user_data: None)  # keep a reference
        lc.llama_log_set(self._quiet, ctypes.c_void_p(0))
        lc.llama_backend_init()
        params = lc.llama_model_default_params()
        self.model = lc.llama_model_load_from_file(str(path).encode(), params)
        if not self.model:
            raise RuntimeError(f"llama.cpp cannot load {path}")
        self.n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(self.model))

    def context(self, n_ctx: int):
        lc = self.lc
        p = lc.llama_context_default_params()
        p.n_ctx, p.n_batch, p.n_ubatch, p.n_seq_max = n_ctx, 512, 512, 1
        p.n_threads = p.n_threads_batch = N_THREADS
        p.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_ENABLED
        p.swa_full = True  # as pyllamaopt's Context (swa_full=True): every position of every layer kept
        ctx = lc.llama_init_from_model(self.model, p)
        if not ctx:
            raise RuntimeError("llama.cpp cannot create the context")
        return ctx

    def decode(self, ctx, tokens: list[int]) -> int:
        """Evaluate tokens (batches of 512); returns the greedy next token."""
        lc = self.lc
        for i in range(0, len(tokens), 512):
            chunk = tokens[i:i + 512]
            arr = (lc.llama_token * len(chunk))(*chunk)
            rc = lc.llama_decode(ctx, lc.llama_batch_get_one(arr, len(chunk)))
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc}")
        logits = np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx, -1), shape=(self.n_vocab,))
        return int(np.argmax(logits))

    def measure(self, prompt: list[int], n_ctx: int, directory: Path, reps: int) -> dict[str, float]:
        lc, n = self.lc, len(prompt)
        out: dict[str, float] = {}
        path = directory / "llama-state.bin"
        ctx = self.context(n_ctx)
        try:
            start = time.perf_counter()
            first = self.decode(ctx, prompt)
            out["prefill_ms"] = (time.perf_counter() - start) * 1000
            out["state_size"] = lc.llama_state_seq_get_size(ctx, 0)
            arr = (lc.llama_token * n)(*prompt)
            start = time.perf_counter()
            written = lc.llama_state_seq_save_file(ctx, str(path).encode(), 0, arr, n)
            out["save_ms"] = (time.perf_counter() - start) * 1000
            if written == 0:
                raise RuntimeError("llama_state_seq_save_file wrote nothing")
        finally:
            lc.llama_free(ctx)
        out["file_size"] = path.stat().st_size
        for mode in ("cold", "warm"):
            ctx_ms, load_ms, ttft_ms, same = [], [], [], True
            for _ in range(reps):
                if mode == "cold":
                    drop_page_cache([path])
                else:
                    warm_page_cache([path])
                start = time.perf_counter()
                ctx = self.context(n_ctx)
                ctx_ms.append((time.perf_counter() - start) * 1000)
                try:
                    tokens_out = (lc.llama_token * n)()
                    n_out = ctypes.c_size_t(0)
                    start = time.perf_counter()
                    read = lc.llama_state_seq_load_file(ctx, str(path).encode(), 0, tokens_out, n, ctypes.byref(n_out))
                    loaded = time.perf_counter()
                    if read == 0 or n_out.value != n:
                        raise RuntimeError(f"llama_state_seq_load_file read {read} bytes, {n_out.value} tokens")
                    # the logits are not in the file: evaluate the last token again
                    if not lc.llama_memory_seq_rm(lc.llama_get_memory(ctx), 0, n - 1, -1):
                        raise RuntimeError("llama_memory_seq_rm refused to drop the last position")
                    same &= self.decode(ctx, prompt[-1:]) == first
                    ttft_ms.append((time.perf_counter() - start) * 1000)
                    load_ms.append((loaded - start) * 1000)
                finally:
                    lc.llama_free(ctx)
            out[f"{mode}_ctx_ms"] = statistics.median(ctx_ms)
            out[f"{mode}_load_ms"] = statistics.median(load_ms)
            out[f"{mode}_ttft_ms"] = statistics.median(ttft_ms)
            out[f"{mode}_same_first"] = same
        return out

    def close(self) -> None:
        self.lc.llama_model_free(self.model)


# --- the benchmark --------------------------------------------------------------------------

@dataclass
class SizeResult:
    size: int
    prefill: Run
    persist_prefill: Run
    saved: int
    save_ms: float
    entry_bytes: int
    n_entries: int
    restores: dict[str, list[Run]] = field(default_factory=dict)
    llama: dict[str, float] | None = None
    llama_error: str = ""


def median_run(runs: list[Run], attr: str) -> float:
    return statistics.median(getattr(r, attr) for r in runs)


def measure_size(path: Path, model: Model, llama: LlamaCpp | None, size: int, n_gen: int, reps: int,
                 workdir: Path) -> SizeResult:
    n_ctx = size + CTX_MARGIN
    prompt = build_prompt(model, size)
    persist_dir = workdir / f"kv-{size}"
    print(f"## {size} tokens (n_ctx {n_ctx}); load average {os.getloadavg()[0]:.1f}", flush=True)

    prefill, _, _ = run_session(model, n_ctx, prompt, n_gen, None)
    print(f"  prefill, persistence off: TTFT {prefill.ttft_ms:.0f} ms", flush=True)
    persist_prefill, saved, save_ms = run_session(model, n_ctx, prompt, n_gen, persist_dir, save=True)
    print(f"  prefill, persistence on (empty dir): TTFT {persist_prefill.ttft_ms:.0f} ms, "
          f"misses {persist_prefill.misses}; save() {saved} tokens in {save_ms:.0f} ms", flush=True)
    entries = PersistStore(persist_dir).entries()
    files = [e.path for e in entries]
    print(f"  stored: {len(entries)} entr{'y' if len(entries) == 1 else 'ies'}, "
          f"{', '.join(f'{e.n_tokens} tokens {e.size} bytes' for e in entries)}", flush=True)
    result = SizeResult(size, prefill, persist_prefill, saved, save_ms, sum(e.size for e in entries), len(entries))
    if not entries:
        print("  no entry was written: nothing to restore", flush=True)
        return result

    plans = [("cold, fresh Model", True, True), ("cold, reused Model", False, True), ("warm, reused Model", False, False)]
    for label, fresh_model, cold in plans:
        runs = []
        for _ in range(reps):
            if cold:
                drop, _ = drop_page_cache(files)
            else:
                warm_page_cache(files)
                drop = "none"
            # a restarted process loads the model (which reads the GGUF again) before its first prompt
            m = Model(path, progress=False) if fresh_model else model
            if fresh_model:  # its weights are partly mmapped: page them in, as a model load would
                warm_page_cache([path])
            fractions = [resident_fraction(f) for f in files]
            resident = None if None in fractions else max(fractions)
            run, _, _ = run_session(m, n_ctx, prompt, n_gen, persist_dir)
            run.drop, run.resident = drop, resident
            runs.append(run)
            if fresh_model:
                del m
        result.restores[label] = runs
        r = runs[-1]
        after = PersistStore(persist_dir).entries()
        if len(after) != len(entries) or sum(e.size for e in after) != result.entry_bytes:
            print(f"  note: the directory changed during the restores: {len(after)} entries, "
                  f"{sum(e.size for e in after)} bytes", flush=True)
        print(f"  restore {label}: TTFT median {median_run(runs, 'ttft_ms'):.0f} ms "
              f"(runs {', '.join(f'{x.ttft_ms:.0f}' for x in runs)}), Context {median_run(runs, 'ctx_ms'):.0f} ms; "
              f"restored {r.restored}, computed {r.prefilled}, loads {r.loads}, misses {r.misses}; "
              f"exact {sum(exact(x, prefill) for x in runs)}/{len(runs)}; cache: {r.drop}, "
              f"resident before {'?' if r.resident is None else f'{r.resident:.0%}'}", flush=True)

    if llama is not None:
        try:
            result.llama = llama.measure(prompt, n_ctx, workdir, reps)
            ll = result.llama
            print(f"  llama.cpp: prefill {ll['prefill_ms']:.0f} ms, state file {ll['file_size']} bytes "
                  f"(llama_state_seq_get_size {ll['state_size']}), save {ll['save_ms']:.0f} ms, "
                  f"load + last token cold {ll['cold_ttft_ms']:.0f} ms (load {ll['cold_load_ms']:.0f}), "
                  f"warm {ll['warm_ttft_ms']:.0f} ms (load {ll['warm_load_ms']:.0f}); "
                  f"same first token as its prefill: {ll['cold_same_first'] and ll['warm_same_first']}", flush=True)
        except Exception as exc:  # noqa: BLE001 - reported, the rest of the run goes on
            result.llama_error = f"{type(exc).__name__}: {exc}"
            print(f"  llama.cpp: failed ({result.llama_error})", flush=True)
        finally:
            (workdir / "llama-state.bin").unlink(missing_ok=True)
    print(f"  load average {os.getloadavg()[0]:.1f}\n", flush=True)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--sizes", default="2048,8192,16384")
    parser.add_argument("--gen", type=int, default=16, help="greedy tokens compared after the prompt")
    parser.add_argument("--reps", type=int, default=3, help="runs of each restore (median reported)")
    parser.add_argument("--no-llama-cpp", action="store_true", help="skip the llama.cpp state file comparison")
    parser.add_argument("--dir", help="parent of the temporary directories (default: the system's temp dir)")
    args = parser.parse_args()

    path = models.resolve(args.model)
    model = Model(path, progress=False)
    llama = None
    if not args.no_llama_cpp:
        try:
            llama = LlamaCpp(path)
        except Exception as exc:  # noqa: BLE001
            print(f"llama.cpp comparison not available ({type(exc).__name__}: {exc})")
    workdir = Path(tempfile.mkdtemp(prefix="persist-restore-", dir=args.dir))
    core = Path(_core.__file__)
    print(f"pyllamaopt {pyllamaopt.__version__}, llama.cpp b{pyllamaopt.build_info()['llama_cpp_build']}; "
          f"{core.name} built {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(core.stat().st_mtime))}")
    print(f"model {model.description}; {N_THREADS} threads; flash attention on; {args.gen} greedy tokens; "
          f"KV {model.kv_bytes_per_token} bytes/token; restores: median of {args.reps}; dir {workdir}\n")
    results = []
    try:
        for size in (int(s) for s in args.sizes.split(",")):
            results.append(measure_size(path, model, llama, size, args.gen, args.reps, workdir))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        if llama is not None:
            llama.close()

    cold, warm, fresh = "cold, reused Model", "warm, reused Model", "cold, fresh Model"
    print(f"{'size':>6} {'prefill':>9} {'restore ms':>11} {'restore':>8} {'prefill/restore':>16} {'save':>6} "
          f"{'bytes/token':>11} {'bytes/token':>12} {'exact':>6} {'cache drop':>24}")
    print(f"{'tokens':>6} {'TTFT ms':>9} {'cold':>11} {'warm ms':>8} {'cold':>7} {'warm':>8} {'ms':>6} "
          f"{'ours':>11} {'llama.cpp':>12} {'':>6} {'(entry resident)':>24}")
    for r in results:
        if not r.restores:
            print(f"{r.size:>6} {r.prefill.ttft_ms:>9.0f}  no restore (nothing stored)")
            continue
        c, w = median_run(r.restores[cold], "ttft_ms"), median_run(r.restores[warm], "ttft_ms")
        ok = all(exact(x, r.prefill) for runs in r.restores.values() for x in runs) and exact(r.persist_prefill, r.prefill)
        drops = [x for k in (fresh, cold) for x in r.restores[k]]
        worst = None if any(x.resident is None for x in drops) else max(x.resident for x in drops)
        drop = f"{drops[-1].drop} ({'?' if worst is None else f'{worst:.0%}'})"
        ll = f"{r.llama['file_size'] / r.size:>12.0f}" if r.llama else f"{'-':>12}"
        print(f"{r.size:>6} {r.prefill.ttft_ms:>9.0f} {c:>11.0f} {w:>8.0f} {r.prefill.ttft_ms / c:>7.1f} "
              f"{r.prefill.ttft_ms / w:>8.1f} {r.save_ms:>6.0f} {r.entry_bytes / r.size:>11.0f} {ll} "
              f"{'yes' if ok else 'NO':>6} {drop:>24}")

    print("\nRestart (fresh Model object, cold entry): Context creation (allocates the KV cache; with a fresh Model "
          "object it also hashes the weights) + TTFT; persist-on: prefill TTFT with persistence on and an empty "
          "directory; llama.cpp (ms): prefill, save, fresh context + llama_state_seq_load_file + last token, cold / warm")
    print(f"{'size':>6} {'Context ms':>10} {'TTFT ms':>8} {'sum ms':>7} {'prefill/sum':>11} {'persist-on':>10} "
          f"{'entry MiB':>9} {'stored':>7} {'restored':>8} {'computed':>8} {'llama pre':>9} {'llama save':>10} "
          f"{'llama cold':>10} {'llama warm':>10}")
    for r in results:
        if not r.restores:
            continue
        runs = r.restores[fresh]
        cm, tm = median_run(runs, "ctx_ms"), median_run(runs, "ttft_ms")
        ll = r.llama or {}
        fmt = lambda key: f"{ll[key]:>10.0f}" if key in ll else f"{'-':>10}"  # noqa: E731
        print(f"{r.size:>6} {cm:>10.0f} {tm:>8.0f} {cm + tm:>7.0f} {r.prefill.ttft_ms / (cm + tm):>11.1f} "
              f"{r.persist_prefill.ttft_ms:>10.0f} {r.entry_bytes / 2**20:>9.1f} {r.saved:>7} {runs[-1].restored:>8} "
              f"{runs[-1].prefilled:>8} {ll.get('prefill_ms', float('nan')):>9.0f} {fmt('save_ms')} "
              f"{fmt('cold_ttft_ms')} {fmt('warm_ttft_ms')}")
        if r.llama_error:
            print(f"       llama.cpp failed: {r.llama_error}")

    target = next((r for r in results if r.size == 8192 and r.restores), None)
    if target:
        ratio = target.prefill.ttft_ms / median_run(target.restores[cold], "ttft_ms")
        print(f"\ntarget at 8192 tokens: prefill TTFT / cold restore TTFT = {ratio:.1f} (>= 20: "
              f"{'met' if ratio >= 20 else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
