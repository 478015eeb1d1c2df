#!/usr/bin/env python3
"""Obtain the pinned llama.cpp tree, verify it, and apply our patches.

Run by CMake at configure time (cmake/llama-fetch.cmake); also usable by hand:

    python tools/fetch_llama.py            # -> vendor/llama.cpp/tree (git-ignored)

Its standard output is exactly one line, the tree's absolute path: CMake builds from whatever
it prints. Progress and errors, its own and those of the programs it runs, go to stderr.

Where the tree comes from, in order:
  1. LLAMA_CPP_SOURCE_DIR=/path: an existing pristine llama.cpp tree (offline builds). It is
     copied, so the checkout itself is never modified.
  2. the download cache (~/.cache/pyllamaopt/downloads, or $PYLLAMAOPT_CACHE_DIR/downloads);
  3. `python -m pip download` of the sdist named in vendor/llama.cpp/PIN.
The archive's sha256 must match the pin. Then patches/*.patch are applied in order; a patch
that does not apply stops the build with a message naming it. A stamp file records what the
tree was made from, so an unchanged rebuild does nothing.
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PIN_FILE = ROOT / "vendor" / "llama.cpp" / "PIN"
PATCH_DIR = ROOT / "patches"
DEFAULT_DEST = ROOT / "vendor" / "llama.cpp" / "tree"
STAMP_NAME = ".pyllamaopt-stamp"


class FetchError(RuntimeError):
    """A step failed; the message says what to do."""


def read_pin(path: Path = PIN_FILE) -> dict[str, str]:
    pin: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            pin[key.strip()] = value.strip()
    for key in ("package", "version", "filename", "sha256", "tree"):
        if key not in pin:
            raise FetchError(f"{path}: missing '{key} = ...'")
    return pin


def cache_dir() -> Path:
    base = os.environ.get("PYLLAMAOPT_CACHE_DIR") or Path.home() / ".cache" / "pyllamaopt"
    return Path(base)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def obtain_archive(pin: dict[str, str], downloads: Path) -> Path:
    """Return the verified sdist, downloading it with pip if it is not cached."""
    downloads.mkdir(parents=True, exist_ok=True)
    archive = downloads / pin["filename"]
    if archive.exists() and sha256_of(archive) == pin["sha256"]:
        return archive
    with tempfile.TemporaryDirectory(dir=downloads) as tmp:
        # Only this package from source: ":all:" would also build its build tools from source.
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps",
               "--no-binary", pin["package"], "-d", tmp, f"{pin['package']}=={pin['version']}"]
        print("fetch_llama: " + " ".join(cmd), file=sys.stderr, flush=True)
        result = subprocess.run(cmd, capture_output=True, text=True)
        got = Path(tmp) / pin["filename"]
        if result.returncode != 0 or not got.exists():
            raise FetchError(
                f"could not download {pin['package']}=={pin['version']} with pip:\n"
                f"{result.stdout[-2000:]}{result.stderr[-2000:]}\n"
                "Offline? Set LLAMA_CPP_SOURCE_DIR to a llama.cpp tree, or put "
                f"{pin['filename']} into {downloads}.")
        actual = sha256_of(got)
        if actual != pin["sha256"]:
            raise FetchError(f"{pin['filename']}: sha256 {actual} does not match the pin "
                             f"{pin['sha256']} ({PIN_FILE}); refusing to build from it.")
        os.replace(got, archive)
    return archive


def extract_tree(archive: Path, member_root: str, into: Path) -> None:
    prefix = member_root.rstrip("/") + "/"
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
        if not members:
            raise FetchError(f"{archive} has no '{member_root}' folder")
        for member in members:
            member.name = member.name[len(prefix):]
        # the sdist's tree is a git submodule: its ".git" file points to a repository that is
        # not there, and would make `git apply` fail
        kept = [m for m in members if m.name and m.name.split("/")[0] != ".git"]
        if hasattr(tarfile, "data_filter"):  # refuses links and paths that leave `into`
            tar.extractall(into, members=kept, filter="data")
        else:
            tar.extractall(into, members=kept)


def patch_files(patch_dir: Path = PATCH_DIR) -> list[Path]:
    return sorted(patch_dir.glob("*.patch"))


def apply_patches(tree: Path, patches: list[Path]) -> None:
    # The ceiling stops git from treating an enclosing repository as the target.
    env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(tree.parent))
    for patch in patches:
        result = subprocess.run(["git", "apply", "--whitespace=nowarn", str(patch)],
                                cwd=tree, env=env, capture_output=True, text=True)
        if result.returncode != 0:
            raise FetchError(f"patch {patch.name} does not apply to the pinned llama.cpp:\n"
                             f"{result.stderr.strip()}\nUpdate the patch for this llama.cpp "
                             f"version (or the pin in {PIN_FILE}).")


def stamp_text(pin: dict[str, str], source: str, patches: list[Path]) -> str:
    lines = [f"source = {source}", f"sha256 = {pin['sha256']}"]
    lines += [f"patch = {p.name} {sha256_of(p)}" for p in patches]
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def locked(lock_path: Path):
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two builds at once must not interleave
        yield


def prepare(dest: Path = DEFAULT_DEST, source_dir: str | None = None,
            patches: list[Path] | None = None) -> Path:
    pin = read_pin()
    patches = patch_files() if patches is None else patches
    source = f"dir:{Path(source_dir).resolve()}" if source_dir else f"sdist:{pin['filename']}"
    stamp = stamp_text(pin, source, patches)
    with locked(dest.with_name(dest.name + ".lock")):
        if (dest / STAMP_NAME).exists() and (dest / STAMP_NAME).read_text() == stamp:
            return dest
        dest.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".tree-", dir=dest.parent))
        try:
            tree = staging / "llama.cpp"
            if source_dir:
                if not (Path(source_dir) / "include" / "llama.h").exists():
                    raise FetchError(f"LLAMA_CPP_SOURCE_DIR={source_dir} is not a llama.cpp "
                                     "tree (no include/llama.h)")
                shutil.copytree(source_dir, tree, ignore=shutil.ignore_patterns(".git"))
            else:
                archive = obtain_archive(pin, cache_dir() / "downloads")
                extract_tree(archive, pin["tree"], tree)
            apply_patches(tree, patches)
            (tree / STAMP_NAME).write_text(stamp)
            if dest.exists():
                shutil.rmtree(dest)
            os.replace(tree, dest)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return dest


@contextlib.contextmanager
def stdout_to_stderr():
    """Send everything written to stdout, by Python or by a child process, to stderr."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=DEFAULT_DEST)
    parser.add_argument("--print-pin", metavar="KEY", help="print one value of the pin and exit")
    args = parser.parse_args(argv)
    try:
        if args.print_pin:
            print(read_pin()[args.print_pin])
            return 0
        # stdout carries the tree's path and nothing else, however the tree was obtained
        with stdout_to_stderr():
            tree = prepare(args.dest.resolve(), os.environ.get("LLAMA_CPP_SOURCE_DIR") or None)
        print(tree)
    except (FetchError, KeyError, OSError, tarfile.TarError) as exc:
        print(f"fetch_llama: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
