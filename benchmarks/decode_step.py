"""A plain decode step, pyllamaopt against upstream llama.cpp, per generated token (issue 47).

    python benchmarks/decode_step.py [--model smollm2-135m] [--depth 4000] [--threads 2] [--reps 2]
                                     [--perf]

pyllamaopt: in process, the canonical schedule, memo off (one decode step per token), a prompt of
`--depth` tokens of the agent trace; each rep syncs the session back to the prompt (outside the
measure) and generates N1, then N2 tokens (end of generation banned); the process's CPU time
(all threads) and the wall time of the generation only. upstream: `llama-bench` from the pinned
tree (tools/build_upstream.py: our patches are off unless called, so its numerics and kernels are
upstream's), `-p 0 -d depth -n N`, flash attention on: its own wall time per token, and CPU time
by difference (the process's CPU with -n N2 minus -n N1, over reps x (N2 - N1) tokens; the
depth's prefill cancels). CPU time, not wall, is the figure a shared machine keeps (though
contention still inflates both engines alike). `--perf`: both engines sampled by `perf record`,
CPU time per token by symbol (pyllamaopt on an unstripped copy of its extension, the generation
only; llama-bench by difference).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import build_upstream  # noqa: E402
from profile_ops import PerfControl, prompt_tokens, unstripped_package  # noqa: E402

from pyllamaopt import Context, Model, OptConfig, models  # noqa: E402

PERF_HZ = 2000  # samples per CPU second: one sample is 0.5 ms


def process_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def ours(args: argparse.Namespace) -> None:
    """In process (also run under perf, --only ours): per rep, the CPU and wall of N1 and N2 tokens."""
    model = Model(args.model)
    banned = {t: -100.0 for t in range(model.n_vocab) if model.is_eog(t)}
    control = PerfControl(args.perf_control)
    with Context(model, n_ctx=args.n_ctx, n_threads=args.threads, config=OptConfig({}, memo_enabled=False)) as ctx:
        tokens = prompt_tokens(model, args.depth)
        session = ctx.session()
        session.append(tokens)

        def generate(n: int, sampled: bool = False) -> tuple[float, float]:
            session.sync(tokens)
            session.logits()  # the prompt's end computed again: before the measure
            if sampled:
                control.send("enable")
            cpu, wall = process_cpu(), time.perf_counter()
            got = sum(1 for _ in session.generate(n, logit_bias=banned))
            cpu, wall = process_cpu() - cpu, time.perf_counter() - wall
            if sampled:
                control.send("disable")
            assert got == n, got
            return cpu, wall

        generate(8)  # warm-up
        for _ in range(args.reps):
            (c1, w1), (c2, w2) = generate(args.n1), generate(args.n2, sampled=True)
            print(json.dumps({"cpu_ms": (c2 - c1) / (args.n2 - args.n1) * 1e3,
                              "wall_ms": (w2 - w1) / (args.n2 - args.n1) * 1e3}), flush=True)


def upstream_bench(args: argparse.Namespace, n: int, perf_data: str | None) -> tuple[float, float]:
    """llama-bench -n n: its wall ms per token and the process's CPU seconds."""
    program = args.llama_bench or build_upstream.build(("llama-bench",)) / "llama-bench"
    cmd = [str(program), "-m", str(models.resolve(args.model)), "-t", str(args.threads), "-fa", "1", "-p", "0",
           "-n", str(n), "-d", str(args.depth), "-r", str(args.reps), "-o", "json"]
    if perf_data:
        cmd = ["perf", "record", "-q", "-e", "cpu-clock", "-F", str(PERF_HZ), "-o", perf_data, "--", *cmd]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = json.loads(out[out.index("["):])[0]
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return result["avg_ns"] / 1e6 / n, cpu


def perf_symbols(data: str) -> dict[str, int]:
    """Samples by symbol of a perf.data file."""
    report = subprocess.run(["perf", "report", "-i", data, "--stdio", "--no-children", "-F", "sample,sym",
                             "--percent-limit", "0"], capture_output=True, text=True, check=True).stdout
    samples: dict[str, int] = defaultdict(int)
    for line in report.splitlines():
        if m := re.match(r"\s*(\d+)\s+\[.\]\s+(.*)", line):
            samples[m.group(2).strip()] += int(m.group(1))
    return samples


def run_ours(args: argparse.Namespace, perf_dir: str | None) -> tuple[list[dict[str, float]], dict[str, int]]:
    cmd = [sys.executable, __file__, "--only", "ours", "--model", args.model, "--depth", str(args.depth),
           "--threads", str(args.threads), "--reps", str(args.reps), "--n1", str(args.n1), "--n2", str(args.n2),
           "--n-ctx", str(args.n_ctx)]
    env = dict(os.environ)
    if perf_dir:
        data, ctl, ack = (os.path.join(perf_dir, n) for n in ("ours.data", "ctl", "ack"))
        os.mkfifo(ctl)
        os.mkfifo(ack)
        env["PYTHONPATH"] = str(unstripped_package(ROOT))
        cmd = ["perf", "record", "-q", "-e", "cpu-clock", "-F", str(PERF_HZ), "-D", "-1",
               f"--control=fifo:{ctl},{ack}", "-o", data, "--", *cmd, "--perf-control", f"{ctl},{ack}"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout
    reps = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return reps, perf_symbols(os.path.join(perf_dir, "ours.data")) if perf_dir else {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--depth", type=int, default=4000, help="prompt tokens before the decode steps")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--n1", type=int, default=32)
    parser.add_argument("--n2", type=int, default=160)
    parser.add_argument("--n-ctx", type=int, default=8192)
    parser.add_argument("--perf", action="store_true", help="CPU time per token by symbol, both engines")
    parser.add_argument("--llama-bench", help="this llama-bench binary (default: tools/build_upstream.py's)")
    parser.add_argument("--only", help=argparse.SUPPRESS)
    parser.add_argument("--perf-control", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.only == "ours":
        return ours(args)

    with tempfile.TemporaryDirectory() as tmp:
        reps, ours_samples = run_ours(args, tmp if args.perf else None)
        data1, data2 = (os.path.join(tmp, f"upstream{i}.data") if args.perf else None for i in (1, 2))
        (wall1, cpu1), (wall2, cpu2) = upstream_bench(args, args.n1, data1), upstream_bench(args, args.n2, data2)
        up_samples = {}
        if args.perf:
            s1, s2 = perf_symbols(data1), perf_symbols(data2)
            up_samples = {k: s2.get(k, 0) - s1.get(k, 0) for k in set(s1) | set(s2)}
    ours_cpu = sum(r["cpu_ms"] for r in reps) / len(reps)
    ours_wall = sum(r["wall_ms"] for r in reps) / len(reps)
    up_cpu = (cpu2 - cpu1) / (args.reps * (args.n2 - args.n1)) * 1e3
    print(f"{args.model}, {args.depth} tokens of context, {args.threads} threads, decode steps {args.n1 + 1}..{args.n2} "
          f"(differential), load {os.getloadavg()[0]:.1f}")
    print("| engine | CPU ms per token | wall ms per token |\n|---|---|---|")
    print(f"| pyllamaopt | {ours_cpu:.2f} | {ours_wall:.2f} |")
    print(f"| llama-bench | {up_cpu:.2f} | {wall2:.2f} |")
    print(f"| pyllamaopt / llama-bench | {ours_cpu / up_cpu:.3f} | {ours_wall / wall2:.3f} |")
    if args.perf:
        ours_tokens = args.reps * (args.n2 - 1)  # (the first token comes from the prompt's logits)
        up_tokens = args.reps * (args.n2 - args.n1)
        per_token = {k: (ours_samples.get(k, 0) * 1e3 / PERF_HZ / ours_tokens,
                         up_samples.get(k, 0) * 1e3 / PERF_HZ / up_tokens) for k in set(ours_samples) | set(up_samples)}
        print("\nCPU ms per token by symbol (perf; pyllamaopt: the N2 generations; llama-bench: by difference)")
        print("| symbol | pyllamaopt | llama-bench |\n|---|---|---|")
        for name, (a, b) in sorted(per_token.items(), key=lambda kv: -max(kv[1])):
            if max(a, b) >= 0.05:
                print(f"| `{name[:80]}` | {a:.2f} | {b:.2f} |")
        print(f"| total sampled | {sum(a for a, _ in per_token.values()):.2f} | {sum(b for _, b in per_token.values()):.2f} |")


if __name__ == "__main__":
    main()
