"""tools/fetch_llama.py: verification, extraction, patching and their failure messages."""
from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import fetch_llama  # noqa: E402


def make_archive(path: Path, files: dict[str, str]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_pin_is_complete():
    pin = fetch_llama.read_pin()
    assert pin["package"] == "llama-cpp-python" and pin["version"] == "0.3.36"
    assert len(pin["sha256"]) == 64 and pin["upstream_build"].isdigit()


def test_extracts_only_the_tree(tmp_path):
    archive = make_archive(tmp_path / "a.tar.gz", {
        "pkg-1/vendor/llama.cpp/include/llama.h": "// header", "pkg-1/setup.py": "x", "pkg-1/vendor/other/x": "y",
        "pkg-1/vendor/llama.cpp/.git": "gitdir: ../../.git/modules/vendor/llama.cpp"})
    fetch_llama.extract_tree(archive, "pkg-1/vendor/llama.cpp", tmp_path / "tree")
    assert sorted(p.relative_to(tmp_path / "tree").as_posix() for p in (tmp_path / "tree").rglob("*")) == [
        "include", "include/llama.h"]
    with pytest.raises(fetch_llama.FetchError, match="no 'pkg-1/missing' folder"):
        fetch_llama.extract_tree(archive, "pkg-1/missing", tmp_path / "other")


def _patch(tmp_path: Path, old: str, new: str) -> Path:
    patch = tmp_path / "0001-test.patch"
    patch.write_text(f"--- a/file.txt\n+++ b/file.txt\n@@ -1 +1 @@\n-{old}\n+{new}\n")
    return patch


def test_patches_apply_in_order(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "file.txt").write_text("hello\n")
    fetch_llama.apply_patches(tree, [_patch(tmp_path, "hello", "patched")])
    assert (tree / "file.txt").read_text() == "patched\n"


def test_a_patch_that_does_not_apply_stops_the_build(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "file.txt").write_text("something else\n")
    with pytest.raises(fetch_llama.FetchError, match="0001-test.patch does not apply"):
        fetch_llama.apply_patches(tree, [_patch(tmp_path, "hello", "patched")])


def test_a_download_with_the_wrong_sha256_is_refused(tmp_path, monkeypatch):
    pin = dict(fetch_llama.read_pin(), filename="pkg.tar.gz")

    def fake_pip(cmd, **kwargs):
        make_archive(Path(cmd[cmd.index("-d") + 1]) / "pkg.tar.gz", {"x": "not the pinned file"})
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(fetch_llama.subprocess, "run", fake_pip)
    with pytest.raises(fetch_llama.FetchError, match="does not match the pin"):
        fetch_llama.obtain_archive(pin, tmp_path)
    assert not (tmp_path / "pkg.tar.gz").exists()


def test_the_prepared_tree_is_reused(tmp_path, monkeypatch):
    """A second prepare() with the same pin and patches does not extract again."""
    tree = fetch_llama.prepare()  # the tree this checkout was built from
    stamp = (tree / fetch_llama.STAMP_NAME).stat().st_mtime_ns
    monkeypatch.setattr(fetch_llama, "extract_tree", lambda *a: pytest.fail("extracted again"))
    assert fetch_llama.prepare() == tree
    assert (tree / fetch_llama.STAMP_NAME).stat().st_mtime_ns == stamp


# --- the command-line entry CMake runs: stdout is the tree's path, however it was obtained ---

FAKE_PIP = '''\
"""Stands in for `python -m pip download`: copies FAKE_PIP_ARCHIVE into the -d folder."""
import os, shutil, sys
with open(os.environ["FAKE_PIP_LOG"], "a") as log:
    log.write(" ".join(sys.argv[1:]) + "\\n")
print("Collecting llama-cpp-python (pip's progress on stdout)", flush=True)
archive = os.environ.get("FAKE_PIP_ARCHIVE")
if not archive:
    sys.exit("ERROR: No matching distribution found (the fake index is empty)")
shutil.copy(archive, sys.argv[sys.argv.index("-d") + 1])
'''


@dataclass
class FakeProject:
    """A project root holding the real fetch script, a pin of a small local sdist and a patch."""
    script: Path
    archive: Path      # the sdist the fake index serves when FAKE_PIP_ARCHIVE names it
    source_dir: Path   # a pristine tree, for LLAMA_CPP_SOURCE_DIR
    cache: Path        # PYLLAMAOPT_CACHE_DIR, empty at first
    pip_log: Path
    env: dict[str, str]

    def run(self, dest: Path, **extra_env: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(self.script), "--dest", str(dest)],
                              env={**self.env, **extra_env}, cwd=self.cache.parent,
                              capture_output=True, text=True)

    def pip_calls(self) -> int:
        return len(self.pip_log.read_text().splitlines())


@pytest.fixture
def fake_project(tmp_path) -> FakeProject:
    """pip is replaced by a package of the same name first on PYTHONPATH, so the script's own
    `python -m pip download` runs without the network."""
    project = tmp_path / "project"
    (project / "tools").mkdir(parents=True)
    script = project / "tools" / "fetch_llama.py"
    script.write_text((ROOT / "tools" / "fetch_llama.py").read_text())
    (project / "patches").mkdir()
    (project / "patches" / "0001-test.patch").write_text(
        "--- a/file.txt\n+++ b/file.txt\n@@ -1 +1 @@\n-hello\n+patched\n")
    tree_files = {"CMakeLists.txt": "project(fake)\n", "include/llama.h": "// header\n", "file.txt": "hello\n"}
    archive = make_archive(tmp_path / "fake_sdist-1.0.tar.gz",
                           {f"fake_sdist-1.0/vendor/llama.cpp/{n}": t for n, t in tree_files.items()})
    (project / "vendor" / "llama.cpp").mkdir(parents=True)
    (project / "vendor" / "llama.cpp" / "PIN").write_text(
        "package = fake-sdist\nversion = 1.0\nfilename = fake_sdist-1.0.tar.gz\n"
        f"sha256 = {fetch_llama.sha256_of(archive)}\ntree = fake_sdist-1.0/vendor/llama.cpp\n")
    pristine = tmp_path / "pristine"
    for name, text in tree_files.items():
        (pristine / name).parent.mkdir(parents=True, exist_ok=True)
        (pristine / name).write_text(text)
    (tmp_path / "fakepip" / "pip").mkdir(parents=True)
    (tmp_path / "fakepip" / "pip" / "__init__.py").write_text("")
    (tmp_path / "fakepip" / "pip" / "__main__.py").write_text(FAKE_PIP)
    pip_log = tmp_path / "pip.log"
    pip_log.write_text("")
    env = {k: v for k, v in os.environ.items() if k not in ("LLAMA_CPP_SOURCE_DIR", "PYTHONPATH")}
    env.update(PYTHONPATH=str(tmp_path / "fakepip"), FAKE_PIP_LOG=str(pip_log),
               PYLLAMAOPT_CACHE_DIR=str(tmp_path / "cache"))
    return FakeProject(script, archive, pristine, tmp_path / "cache", pip_log, env)


def assert_prints_only_the_tree(result: subprocess.CompletedProcess, dest: Path) -> None:
    assert result.returncode == 0, result.stderr
    assert result.stdout.endswith("\n") and result.stdout.count("\n") == 1, result.stdout
    tree = Path(result.stdout.strip())
    assert tree == dest and tree.is_dir()
    assert (tree / "file.txt").read_text() == "patched\n"  # patches applied


def test_a_download_into_an_empty_cache_prints_only_the_tree(fake_project, tmp_path):
    assert not fake_project.cache.exists()
    result = fake_project.run(tmp_path / "tree", FAKE_PIP_ARCHIVE=str(fake_project.archive))
    assert_prints_only_the_tree(result, tmp_path / "tree")
    assert fake_project.pip_calls() == 1
    assert "fetch_llama: " in result.stderr and "-m pip download" in result.stderr  # progress
    assert (fake_project.cache / "downloads" / "fake_sdist-1.0.tar.gz").exists()


def test_a_cached_archive_prints_only_the_tree(fake_project, tmp_path):
    (fake_project.cache / "downloads").mkdir(parents=True)
    shutil.copy(fake_project.archive, fake_project.cache / "downloads")
    result = fake_project.run(tmp_path / "tree")  # the fake index is empty: pip would fail
    assert_prints_only_the_tree(result, tmp_path / "tree")
    assert fake_project.pip_calls() == 0
    # an unchanged second run reuses the tree and still prints only its path
    assert_prints_only_the_tree(fake_project.run(tmp_path / "tree"), tmp_path / "tree")


def test_a_source_dir_prints_only_the_tree(fake_project, tmp_path):
    result = fake_project.run(tmp_path / "tree", LLAMA_CPP_SOURCE_DIR=str(fake_project.source_dir))
    assert_prints_only_the_tree(result, tmp_path / "tree")
    assert fake_project.pip_calls() == 0
    assert (fake_project.source_dir / "file.txt").read_text() == "hello\n"  # the source is not patched


def test_a_relative_dest_prints_an_absolute_path(fake_project, tmp_path):
    result = fake_project.run(Path("relative-tree"), FAKE_PIP_ARCHIVE=str(fake_project.archive))
    assert_prints_only_the_tree(result, tmp_path / "relative-tree")


def test_a_failed_download_prints_nothing_on_stdout(fake_project, tmp_path):
    result = fake_project.run(tmp_path / "tree")
    assert result.returncode == 1 and result.stdout == ""
    assert "could not download fake-sdist==1.0 with pip" in result.stderr
    assert "No matching distribution found" in result.stderr and "LLAMA_CPP_SOURCE_DIR" in result.stderr
    assert not (tmp_path / "tree").exists()


# --- the CMake side: what the fetch step printed must be a llama.cpp tree ---

def _configure_with(tmp_path: Path, fetch_script_text: str) -> subprocess.CompletedProcess:
    cmake = shutil.which("cmake")
    if cmake is None:
        pytest.fail("cmake is needed: pip install 'pyllamaopt[test]'")
    script = tmp_path / "fake_fetch.py"
    script.write_text(fetch_script_text)
    probe = tmp_path / "probe.cmake"
    probe.write_text(f'include("{(ROOT / "cmake" / "llama-fetch.cmake").as_posix()}")\n'
                     f'llama_opt_fetch_llama_tree(tree "{script.as_posix()}")\n'
                     'message(STATUS "tree=${tree}")\n')
    return subprocess.run([cmake, f"-DPython_EXECUTABLE={sys.executable}", "-P", str(probe)],
                          capture_output=True, text=True, cwd=tmp_path)


def test_cmake_takes_the_printed_tree(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "CMakeLists.txt").write_text("")
    result = _configure_with(tmp_path, f"import sys\nprint('progress', file=sys.stderr)\nprint({str(tree)!r})\n")
    assert result.returncode == 0, result.stderr
    assert f"tree={tree}" in result.stdout


def test_cmake_refuses_output_that_is_not_a_tree(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "CMakeLists.txt").write_text("")
    result = _configure_with(tmp_path, f"print('fetch_llama: python -m pip download ...')\nprint({str(tree)!r})\n")
    assert result.returncode != 0
    said = " ".join(result.stderr.split())  # CMake wraps a long message where its paths' lengths fall
    assert "should print only the path of the llama.cpp tree" in said
    assert "fetch_llama: python -m pip download" in said


def test_cmake_stops_when_the_fetch_step_fails(tmp_path):
    result = _configure_with(tmp_path, "import sys\nsys.exit('fetch_llama: error: offline')\n")
    assert result.returncode != 0
    assert "fetch_llama: error: offline" in result.stderr
    assert "Could not prepare the pinned llama.cpp source" in result.stderr
