"""Builds and runs the C++ unit tests of cpp/ (no llama.cpp needed) with CMake and CTest."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_cpp_unit_tests(tmp_path):
    cmake = shutil.which("cmake")
    assert cmake, "cmake is needed for the C++ unit tests (pip install 'pyllamaopt[test]')"
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    build = tmp_path / "build"
    for cmd in ([cmake, "-S", ROOT / "tests" / "cpp", "-B", build, *generator],
                [cmake, "--build", build, "--parallel", "2"],
                ["ctest", "--test-dir", build, "--output-on-failure"]):
        result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
        assert result.returncode == 0, f"{cmd}:\n{result.stdout}\n{result.stderr}"
    assert "100% tests passed" in result.stdout
