#!/usr/bin/env python3
"""Exact small batches (issue 22, lever 2): time per batch of 1, 2, 4, 8, 16 rows with upstream's
kernels (not exact), patches/0006's one-row kernels row by row, and patches/0009's multi-row
kernels (the same bits), side by side in one run: per weight type of Gemma 3 270M and for one
whole llama_decode with every row's logits. With --prefill, stage 2 instead: prompt processing
with upstream's kernels against every row computed like a decode step.

    python benchmarks/row_kernels.py [--threads 2] [--context 1000] [--reps 7] [--swa-view]
    python benchmarks/row_kernels.py --prefill 512,4096 [--threads 2] [--reps 3]

The program is tools/upstream/bench-row-kernels.cpp, built by tools/build_upstream.py from the
pinned, patched tree with pyllamaopt's CPU flags; it prints markdown tables (docs/benchmarks.md).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import build_upstream  # noqa: E402

from pyllamaopt import models  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3-270m", help="a path or a model name (pyllamaopt.models)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--context", type=int, default=1000, help="tokens in the KV before the timed batches")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--prefill", help="comma-separated prompt lengths: stage 2's comparison instead")
    parser.add_argument("--skip-ops", action="store_true", help="only the whole llama_decode")
    parser.add_argument("--swa-view", action="store_true",
                        help="sliding-window layers given only their window's cells, as pyllamaopt runs (patches/0013)")
    args = parser.parse_args()
    program = build_upstream.build(("bench-row-kernels",)) / "bench-row-kernels"
    cmd = [str(program), "-m", str(models.resolve(args.model)), "--threads", str(args.threads),
           "--context", str(args.context), "--reps", str(args.reps)]
    if args.prefill:
        cmd += ["--prefill", args.prefill]
    if args.skip_ops:
        cmd.append("--skip-ops")
    if args.swa_view:
        cmd.append("--swa-view")
    return subprocess.run(cmd).returncode


if __name__ == "__main__":
    sys.exit(main())
