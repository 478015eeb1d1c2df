"""tools/fetch_llama.py: verification, extraction, patching and their failure messages."""
from __future__ import annotations

import io
import subprocess
import sys
import tarfile
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
