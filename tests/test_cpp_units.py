"""Builds and runs the C++ unit tests and fuzz drivers of cpp/ (no llama.cpp needed) with CMake
and CTest: as they are, and under AddressSanitizer + UndefinedBehaviorSanitizer (any report fails:
UB aborts, leaks are checked). tools/sanitize.sh covers llama.cpp and the extension as well."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SANITIZE = "-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"


def compiler_sanitizes(tmp_path: Path) -> bool:
    source = tmp_path / "probe.cpp"
    source.write_text("int main() { return 0; }\n")
    cxx = os.environ.get("CXX") or shutil.which("c++") or "c++"
    return subprocess.run([cxx, *SANITIZE.split(), str(source), "-o", str(tmp_path / "probe")],
                          capture_output=True).returncode == 0


@pytest.mark.slow
@pytest.mark.parametrize("sanitized", [False, True], ids=["plain", "asan-ubsan"])
def test_cpp_unit_tests(tmp_path, sanitized):
    cmake = shutil.which("cmake")
    assert cmake, "cmake is needed for the C++ unit tests (pip install 'pyllamaopt[test]')"
    if sanitized and not compiler_sanitizes(tmp_path):
        pytest.skip("the C++ compiler cannot build with -fsanitize=address,undefined")
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    flags = [f"-DCMAKE_CXX_FLAGS={SANITIZE}", f"-DCMAKE_EXE_LINKER_FLAGS={SANITIZE}",
             "-DCMAKE_BUILD_TYPE=RelWithDebInfo"] if sanitized else []
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1", UBSAN_OPTIONS="print_stacktrace=1")
    env.pop("LD_PRELOAD", None)  # (tools/sanitize.sh preloads the runtimes; these binaries link their own)
    build = tmp_path / "build"
    for cmd in ([cmake, "-S", ROOT / "tests" / "cpp", "-B", build, *generator, *flags],
                [cmake, "--build", build, "--parallel", "2"],
                ["ctest", "--test-dir", build, "--output-on-failure"]):
        result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env)
        assert result.returncode == 0, f"{cmd}:\n{result.stdout}\n{result.stderr}"
    assert "100% tests passed" in result.stdout
    assert "fuzz-persist" in result.stdout and "fuzz-hash-diff" in result.stdout
