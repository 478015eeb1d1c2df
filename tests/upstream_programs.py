"""Check programs of tools/upstream built from the pinned tree, for this CPU or another one."""
from __future__ import annotations

import os
import platform
import re
import shlex
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# ggml's x86 switches of the builds below; llama-cpu-flags.cmake turns on what /proc/cpuinfo reports
SWITCHES = ("SSE42", "AVX", "AVX2", "FMA", "F16C", "BMI2")
OTHER_CPUS = {
    # most users' x86 machines: the AVX2 paths of the multi-row kernels and of tinyBLAS, no AVX-512
    "avx2": (["-DGGML_NATIVE=OFF", *(f"-DGGML_{s}=ON" for s in SWITCHES)], {"avx2", "fma", "f16c", "bmi2"}),
    # no SIMD at all: ggml's generic C kernels
    "generic": (["-DGGML_NATIVE=OFF", *(f"-DGGML_{s}=OFF" for s in SWITCHES)], set()),
}


def build_program(target: str, cmake_args: list[str] | None = None) -> Path:
    """The program `target`, built from the pinned tree (cmake_args: another CPU's switches)."""
    sys.path.insert(0, str(ROOT / "tools"))
    import build_upstream

    return build_upstream.build((target,), cmake_args) / target


def pinned_tree() -> Path:
    """The pinned, patched llama.cpp tree (tools/fetch_llama.py; already there after a build)."""
    sys.path.insert(0, str(ROOT / "tools"))
    import fetch_llama

    return fetch_llama.prepare()


def templates_dir() -> Path:
    """The chat templates of popular models that the pinned tree tests its chat layer with."""
    return pinned_tree() / "models" / "templates"


def cpu_flags() -> set[str]:
    cpuinfo = Path("/proc/cpuinfo")
    if platform.machine() not in ("x86_64", "AMD64") or not cpuinfo.exists():
        return set()
    flags = re.search(r"^flags\s*:(.*)$", cpuinfo.read_text(), re.M)
    return set(flags.group(1).split()) if flags else set()


# the CPU flags for which cmake/llama-cpu-flags.cmake turns on a switch beyond the "avx2" build's
BEYOND_AVX2 = {"avx_vnni", "avx512f", "avx512vbmi", "avx512_vnni", "avx512_bf16"}


def build_for_other_cpu(target: str, cpu: str) -> Path:
    """`target` built for one of OTHER_CPUS; skips where that build could not run on this machine.
    On an AVX2 machine without the flags beyond, this machine's own build has the "avx2" build's
    very switches (cmake/llama-cpu-flags.cmake), and is that build (a second one would compile
    the same ggml again)."""
    args, needed = OTHER_CPUS[cpu]
    flags = cpu_flags()
    if not flags or not needed <= flags:
        pytest.skip(f"not an x86 machine with {sorted(needed) or 'x86-64'}: this build would not run here")
    if cpu == "avx2" and not flags & BEYOND_AVX2 and not shlex.split(os.environ.get("CMAKE_ARGS", "")):
        return build_program(target)
    return build_program(target, args)
