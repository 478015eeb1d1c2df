#!/usr/bin/env python3
"""Build upstream llama.cpp programs from the pinned tree, with pyllamaopt's CPU flags.

    python tools/build_upstream.py            # prints the folder holding llama-simple-opt-numerics, llama-bench
    python tools/build_upstream.py llama-server   # only the targets named

The build is cached under ~/.cache/pyllamaopt/upstream/<key> (key: the tree's stamp, CMAKE_ARGS and
the build files), so only the first call compiles (about 3 minutes on 2 cores). llama-simple-opt-numerics
is upstream's examples/simple with pyllamaopt's numerics settings (tools/upstream/opt-numerics.cpp).
"""
from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fetch_llama  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ("llama-simple-opt-numerics", "llama-bench")


def build(targets: tuple[str, ...] = TARGETS, cmake_args: list[str] | None = None) -> Path:
    """cmake_args: CMake options of this build (default: $CMAKE_ARGS), e.g. other CPU switches."""
    tree = fetch_llama.prepare()
    if cmake_args is None:
        cmake_args = shlex.split(os.environ.get("CMAKE_ARGS", ""))
    recipe = (tree / fetch_llama.STAMP_NAME).read_text() + repr(cmake_args)
    recipe += (ROOT / "tools" / "upstream" / "CMakeLists.txt").read_text()
    recipe += (ROOT / "cmake" / "llama-cpu-flags.cmake").read_text()
    build_dir = fetch_llama.cache_dir() / "upstream" / hashlib.sha256(recipe.encode()).hexdigest()[:16]
    bin_dir = build_dir / "bin"
    if not (build_dir / "CMakeCache.txt").exists():
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        subprocess.run(["cmake", "-S", str(ROOT / "tools" / "upstream"), "-B", str(build_dir), *generator,
                        "-DCMAKE_BUILD_TYPE=Release", f"-DLLAMA_CPP_TREE={tree}",
                        f"-DCMAKE_RUNTIME_OUTPUT_DIRECTORY={bin_dir}", *cmake_args],
                       check=True, stdout=subprocess.DEVNULL)
    # always: up to date it does nothing, and a target built from our files (opt-numerics.cpp and
    # cpp/base/numerics.h) is rebuilt when they change
    subprocess.run(["cmake", "--build", str(build_dir), "--parallel", str(os.cpu_count() or 2),
                    "--target", *targets], check=True, stdout=subprocess.DEVNULL)
    return bin_dir


if __name__ == "__main__":
    print(build(tuple(sys.argv[1:]) or TARGETS))
