"""Where the time of a forward pass goes, per operation, from ggml's own graph (issue 19).

    python benchmarks/profile_ops.py [--model gemma3-270m] [--threads 1] [--prefill 512,4096]
                                     [--decode 32] [--facts] [--perf]

For each workload (a prefill of N tokens of the agent trace on the canonical schedule, in
n_batch-token ubatches; decode steps after a prefill) the context is made with
``profile="time"``: llama.cpp's eval callback computes every node of the graph alone and times
it (engine/op-profile.h). With --threads 1 (the default) the table is CPU time of the thread
that computes every node, which a loaded machine's preemptions do not inflate; with more
threads, wall time. The table groups nodes: matmuls by weight, attention, RoPE, norms,
softmax, adds, the output layer, ... A node computed alone costs one thread-pool round trip;
the median time of the nodes that compute nothing (views, reshapes, permutes) estimates it and is
subtracted from every node ("net"). Computing nodes alone also stops ggml fusing RMS_NORM + MUL,
so the norms' share is an upper bound.

--facts   a second pass with ``profile="facts"`` (flash attention off, so that the softmax is a
          node): per group, rows that repeat bit for bit within an output (what activation CSE
          could skip), rows seen in an earlier graph (what a cache keyed by the input, such as
          the norm-statistics cache, could hit), zero rows, identity operands, one-hot softmax rows.
--perf    the same workloads without the callback, sampled by `perf record` (CPU time of every
          thread, by symbol): the host side the graph does not show (KQ mask construction,
          graph building and scheduling, sampling, grammar, memo drafting, Python).
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import agent_trace_data  # noqa: E402

from pyllamaopt import Context, Model, OptConfig  # noqa: E402

NO_COMPUTE = {"NONE", "VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"}
NORM_NAMES = {"attn_norm", "Qcur_normed", "Kcur_normed", "attn_post_norm", "ffn_norm", "ffn_post_norm",
              "result_norm", "norm"}


def weight_types(path: str) -> dict[str, str]:
    """The GGUF's weight types by the profile's weight names (`blk.*.X.weight`: every layer's type,
    with the count of layers of each where they differ, e.g. "Q4_Kx12+Q6_Kx12")."""
    import gguf

    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for tensor in gguf.GGUFReader(path).tensors:
        counts[re.sub(r"^blk\.\d+\.", "blk.*.", tensor.name)][tensor.tensor_type.name] += 1
    return {name: next(iter(c)) if len(c) == 1 else "+".join(f"{t}x{n}" for t, n in c.most_common())
            for name, c in counts.items()}


def category(group: dict[str, Any], types: dict[str, str] | None = None) -> str:
    """The table row of a group of nodes (`types`: matmuls named with their weights' types)."""
    op, name, weight = group["op"], group["name"], group["weight"]
    typed = f" ({types[weight]})" if types and weight in types else ""
    if op in NO_COMPUTE:
        return "views (no compute)"
    if op == "MUL_MAT":
        if weight.startswith("blk.*."):
            return "matmul " + weight[len("blk.*."):-len(".weight")] + typed
        if weight in ("output.weight", "token_embd.weight"):
            return "output layer (matmul)" + typed
        return "attention (KQ, KQV matmuls)"
    if op == "FLASH_ATTN_EXT":
        return "attention (flash)"
    if op == "SOFT_MAX":
        return "softmax (attention)"
    if op == "ROPE":
        return "RoPE"
    if op == "RMS_NORM" or (op == "MUL" and name in NORM_NAMES):
        return "norms (RMS_NORM + weight MUL)"
    if op == "ADD":
        return "adds (residual)"
    if op == "GET_ROWS":
        return "embedding lookup" if weight == "token_embd.weight" else "get_rows (output rows)"
    if op in ("SET_ROWS", "CPY"):
        return "KV cache writes"
    if op in ("GELU", "GLU", "UNARY", "MUL"):
        return "FFN activation (GELU x up)"
    if op == "SCALE":
        return "scale"
    return op.lower()


def prompt_tokens(model: Model, n: int) -> list[int]:
    """The first n tokens of the agent trace's longest rendering (real text: repeated words,
    JSON, code)."""
    turns = agent_trace_data.turns()
    text = agent_trace_data.render(agent_trace_data.system_prompt(), turns[:-1], turns[-1], shape="append")
    tokens = model.tokenize(text, add_bos=True, special=True)
    while len(tokens) < n:
        tokens += tokens[1:]
    return tokens[:n]


def make_context(model: Model, args: argparse.Namespace, profile: str | None, flash_attn: bool = True,
                 n_ctx: int = 8192) -> Context:
    # no reuse between runs (every run computes its whole prompt) and decode steps of one token
    # each (memo batches are another shape)
    config = OptConfig({}, dedup_enabled=False, memo_enabled=False)
    return Context(model, n_ctx=n_ctx, n_batch=args.n_batch, n_threads=args.threads, flash_attn=flash_attn,
                   config=config, profile=profile)


def combine(a: list[dict[str, Any]], b: list[dict[str, Any]], sign: int) -> list[dict[str, Any]]:
    """Profiles a + sign * b, group by group (sign -1: what was counted between two readings)."""
    out = {(g["op"], g["name"], g["weight"]): dict(g) for g in a}
    for g in b:
        row = out.setdefault((g["op"], g["name"], g["weight"]),
                             {k: (0 if isinstance(v, int) else v) for k, v in g.items()})
        for k, v in g.items():
            if isinstance(v, int):
                row[k] += sign * v
    return [g for g in out.values() if g["calls"]]


def run_workload(ctx: Context, tokens: list[int], workload: str, n_decode: int,
                 control: PerfControl | None = None) -> tuple[float, list[dict[str, Any]]]:
    """Run one workload on a fresh session. Returns the wall time of its measured part (the
    prefill; or the decode steps after the prompt) and what the profile counted in it; perf
    (`control`) samples only that part."""
    session = ctx.session()
    if workload == "decode":
        session.append(tokens)
    before = ctx.op_profile()
    if control:
        control.send("enable")
    start = time.perf_counter()
    if workload == "decode":
        for _ in session.generate(n_decode):
            pass
    else:
        session.append(tokens)
        session.logits()  # the last row's logits (computed with the prompt)
    wall = time.perf_counter() - start
    if control:
        control.send("disable")
    profile = combine(ctx.op_profile(), before, -1)
    session.close()
    return wall, profile


def time_table(groups: list[dict[str, Any]], wall: float, title: str, clock: str, types: dict[str, str],
               tokens: int) -> None:
    """`clock`: "cpu_ns" (the calling thread's CPU time: with one compute thread, every node's own
    work, whatever else the machine runs) or "ns" (wall clock); `tokens`: those computed (a
    prefill's prompt tokens, a decode's steps), for the time per token."""
    overhead = [g[clock] / g["calls"] for g in groups if g["op"] in NO_COMPUTE and g["calls"]]
    per_node = statistics.median(overhead) if overhead else 0.0
    rows: dict[str, dict[str, float]] = defaultdict(lambda: {"calls": 0, "raw": 0.0, "net": 0.0})
    for g in groups:
        row = rows[category(g, types)]
        row["calls"] += g["calls"]
        row["raw"] += g[clock]
        row["net"] += 0.0 if g["op"] in NO_COMPUTE else max(0.0, g[clock] - per_node * g["calls"])
    total_net = sum(r["net"] for r in rows.values())
    total_wall = sum(g["ns"] for g in groups)
    print(f"\n{title}: wall {wall * 1e3:.1f} ms, of which in graph nodes {total_wall / 1e6:.1f} ms; "
          f"{'CPU time' if clock == 'cpu_ns' else 'wall time'} of the nodes {total_net / 1e6:.1f} ms net of "
          f"~{per_node / 1e3:.1f} us per node computed alone (median of the views)")
    print(f"  {'operation':<46} {'nodes':>7} {'net ms':>9} {'share':>7} {'us/token':>9}")
    for name, row in sorted(rows.items(), key=lambda kv: -kv[1]["net"]):
        if name == "views (no compute)":
            continue
        print(f"  {name:<46} {int(row['calls']):>7} {row['net'] / 1e6:>9.2f} {100 * row['net'] / total_net:>6.1f}% "
              f"{row['net'] / 1e3 / tokens:>9.1f}")
    print(f"  {'all nodes':<46} {'':>7} {total_net / 1e6:>9.2f} {'':>7} {total_net / 1e3 / tokens:>9.1f}")


def facts_table(groups: list[dict[str, Any]], title: str) -> None:
    rows: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for g in groups:
        if g["op"] in NO_COMPUTE:
            continue
        row = rows[category(g)]
        for key in ("calls", "rows", "rows_dup", "rows_seen", "rows_zero", "outputs_zero", "identity_calls",
                    "onehot_rows"):
            row[key] += g[key]
    print(f"\n{title}: facts per operation (rows = output rows examined)")
    print(f"  {'operation':<34} {'rows':>9} {'dup in batch':>12} {'seen before':>11} {'zero rows':>9} "
          f"{'zero outs':>9} {'identity':>8} {'one-hot':>8}")
    for name, r in sorted(rows.items()):
        if not r["rows"]:
            continue
        print(f"  {name:<34} {r['rows']:>9} {r['rows_dup']:>12} {r['rows_seen']:>11} {r['rows_zero']:>9} "
              f"{r['outputs_zero']:>9} {r['identity_calls']:>8} {r['onehot_rows']:>8}")
    per_layer: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for g in groups:
        if g["op"] == "RMS_NORM" or g["name"] in NORM_NAMES:
            per_layer[g["name"]]["rows"] += g["rows"]
            per_layer[g["name"]]["dup"] += g["rows_dup"]
            per_layer[g["name"]]["seen"] += g["rows_seen"]
    print("  norms by name:", ", ".join(f"{k} {v['dup']}+{v['seen']}/{v['rows']}" for k, v in sorted(per_layer.items())),
          "(dup in batch + seen before / rows)")


PERF_GROUPS = [  # (row, substrings of a symbol), first match wins
    ("KQ mask construction (host)", ("set_input_kq_mask",)),
    ("other graph inputs (host)", ("set_input", "llm_graph_input")),
    ("graph build (host)", ("llm_build", "llm_graph_context", "build_graph", "ggml_new_tensor", "ggml_graph_",
                            "ggml_build_forward", "ggml_visit_parents", "ggml_hash")),
    ("scheduler / allocator (host)", ("ggml_backend_sched", "ggml_gallocr", "ggml_backend_")),
    ("KV cache bookkeeping (llama.cpp)", ("llama_kv_cache", "llama_kv_cells", "llama_memory", "find_slot")),
    ("sampling", ("llama_opt_sampler", "llama_sampler", "sampler")),
    ("grammar", ("grammar",)),
    ("memo drafting", ("llama_opt_memo",)),
    ("pyllamaopt engine (other)", ("llama_opt_",)),
    ("matmul kernels", ("vec_dot", "gemv", "gemm", "mul_mat", "quantize_row", "quantize_mat", "tinyblas",
                        "tinyBLAS", "tiled_run_micro")),
    ("flash attention kernel", ("flash_attn",)),
    ("RoPE kernel", ("rope",)),
    ("norm kernels", ("rms_norm", "norm_f32")),
    ("softmax kernel", ("soft_max",)),
    ("FFN activation kernel", ("forward_glu", "gelu")),
    ("other ggml ops", ("ggml_compute_forward", "ggml_vec_", "ggml_cpu", "ggml_fp16", "ggml_", "gelu")),
    ("thread pool wait", ("ggml_barrier", "sched_yield", "futex", "pthread")),
    ("Python interpreter", ("_Py", "PyObject", "PyEval", "PyFrame")),
]


PERF_HZ = 4000


def perf_group(symbol: str, dso: str, groups: list[tuple[str, tuple[str, ...]]] = PERF_GROUPS) -> str:
    for row, needles in groups:
        if any(n in symbol for n in needles):
            return row
    if dso.startswith(("libpython", "python")):  # (not our extension, _core.cpython-*.so)
        return "Python interpreter"
    if "kernel" in dso or symbol.startswith("[k]"):
        return "kernel (syscalls, page faults)"
    return "other (libc, ...)"


def unstripped_package(root: Path) -> Path:
    """A copy of the installed package whose extension keeps its symbols (pybind11 strips Release
    builds, and perf then sees only exported functions): the build's own link command, without
    its strip step, into build/profile/. Returns the directory to put on PYTHONPATH."""
    import pyllamaopt

    installed = Path(pyllamaopt.__file__).parent
    build = next((root / "build").glob("cp*"), None)
    if build is None:
        raise SystemExit("--perf needs the build directory (pip install . from this checkout)")
    core = next(build.glob("_core*.so")).name
    link = subprocess.run(["ninja", "-C", str(build), "-t", "commands", core], capture_output=True, text=True,
                          check=True).stdout.strip().splitlines()[-1]
    link = link.split("&& cd ")[0].removeprefix(": &&").strip()  # the link step, not the strip after it
    dest = root / "build" / "profile"
    if (dest / "pyllamaopt").exists():
        shutil.rmtree(dest / "pyllamaopt")
    shutil.copytree(installed, dest / "pyllamaopt", ignore=shutil.ignore_patterns("_core*.so", "__pycache__"))
    subprocess.run(link.replace(f"-o {core}", f"-o {dest / 'pyllamaopt' / core}"), shell=True, cwd=build, check=True)
    return dest


def perf_shares(cmd: list[str], package: Path, groups: list[tuple[str, tuple[str, ...]]] = PERF_GROUPS
                ) -> tuple[dict[str, float], float]:
    """Run `cmd` (a program that takes --perf-control and sends "enable"/"disable" through a
    PerfControl around what it measures) under perf record, with `package` first on PYTHONPATH.
    Returns the share of CPU time of each group of symbols, in percent, and the CPU seconds
    sampled."""
    with tempfile.TemporaryDirectory() as tmp:
        data, ctl, ack = (os.path.join(tmp, n) for n in ("perf.data", "ctl", "ack"))
        os.mkfifo(ctl)
        os.mkfifo(ack)
        env = dict(os.environ, PYTHONPATH=str(package))
        subprocess.run(["perf", "record", "-q", "-F", str(PERF_HZ), "-D", "-1", f"--control=fifo:{ctl},{ack}",
                        "-o", data, "--", *cmd, "--perf-control", f"{ctl},{ack}"],
                       check=True, stdout=subprocess.DEVNULL, env=env)
        report = subprocess.run(["perf", "report", "-i", data, "--stdio", "--no-children", "-F", "overhead,dso,sym",
                                 "--percent-limit", "0"], capture_output=True, text=True, check=True).stdout
    rows: dict[str, float] = defaultdict(float)
    cpu_ns = 0  # cpu-clock's event count is in nanoseconds
    for line in report.splitlines():
        if line.startswith("# Event count (approx.):"):
            cpu_ns = int(line.split(":")[1])
        parts = line.split(None, 3)
        if not parts or not parts[0].endswith("%") or len(parts) < 4:
            continue
        rows[perf_group(parts[3], parts[1], groups)] += float(parts[0][:-1])
    return dict(rows), cpu_ns / 1e9


def perf_pass(args: argparse.Namespace, workload: str, package: Path) -> None:
    """This program for one workload, plain (no callback), under perf: CPU time by symbol group."""
    cmd = [sys.executable, __file__, "--model", args.model, "--threads", str(args.threads), "--n-batch",
           str(args.n_batch), "--decode", str(args.decode), "--only", workload, "--repeat", str(args.repeat),
           "--prefill", args.prefill, "--decode-after", str(args.decode_after)]
    rows, seconds = perf_shares(cmd, package)
    print(f"\n{workload}: CPU time by symbol (perf, without the callback, the workload only: {seconds:.2f} s sampled)")
    for name, share in sorted(rows.items(), key=lambda kv: -kv[1]):
        print(f"  {name:<34} {share:>6.2f}%")


class PerfControl:
    """perf record's control fifo: sampling on only around the workload."""

    def __init__(self, spec: str | None) -> None:
        self.ctl, self.ack = spec.split(",") if spec else (None, None)

    def send(self, command: str) -> None:
        if self.ctl:
            with open(self.ctl, "w") as ctl:
                ctl.write(command + "\n")
            with open(self.ack) as ack:
                ack.readline()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--n-batch", type=int, default=512)
    parser.add_argument("--prefill", default="512,4096", help="prefill lengths profiled ('' for none)")
    parser.add_argument("--decode", type=int, default=32, help="decode steps profiled")
    parser.add_argument("--decode-after", type=int, default=512, help="prompt tokens before the decode steps")
    parser.add_argument("--facts", action="store_true")
    parser.add_argument("--perf", action="store_true")
    parser.add_argument("--no-time", action="store_true", help="skip the time tables (with --facts or --perf)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each workload (profiles are summed)")
    parser.add_argument("--only", help=argparse.SUPPRESS)  # one workload without a profile (for --perf)
    parser.add_argument("--perf-control", help=argparse.SUPPRESS)
    args = parser.parse_args()
    model = Model(args.model)
    workloads = [(f"prefill {n}", int(n)) for n in args.prefill.split(",") if n] + [("decode", args.decode_after)]

    if args.only:  # under perf: the plain engine, no callback
        n = dict(workloads)[args.only]
        ctx = make_context(model, args, None)
        tokens = prompt_tokens(model, n)
        run_workload(ctx, tokens, args.only.split()[0], args.decode)  # warm-up
        for _ in range(args.repeat):
            run_workload(ctx, tokens, args.only.split()[0], args.decode, PerfControl(args.perf_control))
        return

    print(f"model {args.model}, threads {args.threads}, n_batch {args.n_batch}, canonical schedule, "
          f"flash attention on, memo off")
    types = weight_types(str(model.path))
    for workload, n in workloads if not args.no_time else []:
        tokens = prompt_tokens(model, n)
        ctx = make_context(model, args, "time")
        run_workload(ctx, tokens, workload.split()[0], args.decode)  # warm-up (page-in, allocations)
        wall, profile = 0.0, []
        for _ in range(args.repeat):
            seconds, counted = run_workload(ctx, tokens, workload.split()[0], args.decode)
            wall, profile = wall + seconds, combine(profile, counted, +1)
        label = f"{workload} ({args.decode} steps after {n} tokens)" if workload == "decode" else workload
        computed = (args.decode if workload == "decode" else n) * args.repeat
        time_table(profile, wall, label, "cpu_ns" if args.threads == 1 else "ns", types, computed)
        ctx.close()
    if args.facts:
        for workload, n in workloads:
            ctx = make_context(model, args, "facts", flash_attn=False)
            _, profile = run_workload(ctx, prompt_tokens(model, n), workload.split()[0], args.decode)
            facts_table(profile, workload + " (flash attention off)")
            ctx.close()
    if args.perf:
        package = unstripped_package(Path(__file__).resolve().parent.parent)
        for workload, _ in workloads:
            perf_pass(args, workload, package)


if __name__ == "__main__":
    main()
