"""The Python–C++ seam is typed: mypy passes on the package, reading pyllamaopt._core's types from
the committed stub (pyllamaopt/_core.pyi), and that stub names what the built module has."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

import pyllamaopt._core

ROOT = Path(__file__).resolve().parent.parent
STUB = ROOT / "pyllamaopt" / "_core.pyi"


@pytest.fixture(scope="module")
def mypy_run(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    """mypy on the source tree with the project's configuration, from outside the repository
    (so nothing is found through the working directory), verbose: the log says which file each
    module was read from."""
    tmp = tmp_path_factory.mktemp("mypy")
    return subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                           "--cache-dir", str(tmp / "cache"), "--verbose", str(ROOT / "pyllamaopt")],
                          cwd=tmp, capture_output=True, text=True)


@pytest.mark.slow
def test_mypy_passes(mypy_run: subprocess.CompletedProcess[str]) -> None:
    # stderr holds the verbose log; keep only what is not log (a crash's traceback)
    not_log = [line for line in mypy_run.stderr.splitlines() if not line.startswith(("LOG:", "TRACE:"))]
    assert mypy_run.returncode == 0, "\n".join([mypy_run.stdout, *not_log])


@pytest.mark.slow
def test_mypy_reads_the_committed_stub(mypy_run: subprocess.CompletedProcess[str]) -> None:
    """Not the installed package (the test environment installs it, with its own copy of the
    stub next to the binary): the stub under review is the one checked against the code."""
    read = re.findall(r"^LOG:\s+Parsing (.+) \(pyllamaopt\._core\)$", mypy_run.stderr, re.MULTILINE)
    assert [Path(p).resolve() for p in read] == [STUB], f"mypy read pyllamaopt._core from {read}, not {STUB}"


def _public(name: str) -> bool:
    return not name.startswith("_") or name == "__init__"


def _stub_names(body: list[ast.stmt]) -> set[str]:
    """Names a module or class body of the stub defines: functions, classes, variables."""
    names: set[str] = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return {n for n in names if _public(n)}


def _runtime_members(cls: type) -> set[str]:
    """What the binding defines on the class itself. A class without a bound constructor still
    has an __init__ in its dict: pybind11's slot wrapper that raises "No constructor defined"."""
    return {name for name, value in vars(cls).items()
            if _public(name) and not (name == "__init__" and isinstance(value, types.WrapperDescriptorType))}


def _difference(what: str, stub: set[str], runtime: set[str]) -> list[str]:
    out = []
    if runtime - stub:
        out.append(f"{what}: missing from the stub: {sorted(runtime - stub)}")
    if stub - runtime:
        out.append(f"{what}: in the stub only: {sorted(stub - runtime)}")
    return out


def test_stub_matches_built_module() -> None:
    core = pyllamaopt._core
    tree = ast.parse(STUB.read_text(), filename=str(STUB))
    problems = _difference("pyllamaopt._core", _stub_names(tree.body), {n for n in dir(core) if _public(n)})
    stub_classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef) and _public(node.name)}
    for name, node in sorted(stub_classes.items()):
        cls = getattr(core, name, None)
        if isinstance(cls, type):
            problems += _difference(f"class {name}", _stub_names(node.body), _runtime_members(cls))
    assert not problems, ("pyllamaopt/_core.pyi does not match the built pyllamaopt._core:\n  "
                          + "\n  ".join(problems)
                          + "\nregenerate with pybind11-stubgen pyllamaopt._core (then keep the hand "
                            "corrections listed at the top of the stub)")


def test_a_source_tree_without_the_engine_says_so(tmp_path):
    """`from pyllamaopt import Model` run inside a clone imports the source tree, which has no
    compiled engine: an ImportError that says why and what to do, not "cannot import name '_core'"."""
    import shutil

    shutil.copytree(ROOT / "pyllamaopt", tmp_path / "pyllamaopt", ignore=shutil.ignore_patterns("_core*.so"))
    run = subprocess.run([sys.executable, "-c", "from pyllamaopt import Model"], cwd=tmp_path, capture_output=True,
                         text=True)
    assert run.returncode == 1
    assert "is not in" in run.stderr and "Run from another directory" in run.stderr
