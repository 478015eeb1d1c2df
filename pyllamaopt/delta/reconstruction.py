"""pyllamaopt delta reconstruct: a delta file back to a standard GGUF that llama.cpp loads.

Each decomposed matrix becomes base + delta_u · delta_v, stored as F16 (F32 when the original
was F32): gguf-py cannot quantize back to K-quants, so a Q4_K_M model comes back larger than
it was. Every other tensor, and every matrix stored whole, is copied byte for byte.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import gguf
import numpy as np

from ..errors import DeltaError
from ..models import cache_root
from .format import WHOLE, DeltaHeader, copied_fields
from .names import base_name, delta_u_name, delta_v_name, matrix_name
from .progress import progress_bar
from .reader import GGUFFile
from .source import GGUFModel, dequantize
from .writer import OutTensor, check_output, write_gguf

_F32, _F16 = gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16


def reconstruct(delta_path: str | os.PathLike[str], output: str | os.PathLike[str], *,
                parent: str | os.PathLike[str] | None = None, progress: bool | None = None) -> int:
    """Write `output`, the standard GGUF rebuilt from the delta file `delta_path`; returns its size.
    `parent`: the parent model of a delta made with --parent (default: the path recorded in it)."""
    delta = GGUFModel(delta_path, role="delta file")
    header = DeltaHeader.read(delta)
    parent_model = _open_parent(header, parent, delta.path)
    output = Path(output)
    check_output(output, [delta.path] + ([parent_model.path] if parent_model else []))

    try:
        tensors, converted = _plan_tensors(delta, header, parent_model)
    except (KeyError, IndexError, ValueError) as exc:  # lists of the header shorter than its layers, ...
        raise DeltaError(f"delta file {delta.path} is damaged: its header does not describe its tensors "
                         f"({type(exc).__name__}: {exc})") from None
    fields = copied_fields(delta)
    if converted:
        # the rebuilt matrices are F16 now, whatever the quantization was
        fields = [f for f in fields if f[0] != "general.file_type"]
        fields.append(("general.file_type", int(gguf.LlamaFileType.MOSTLY_F16), gguf.GGUFValueType.UINT32, None))
    bar = progress_bar(sum(t.nbytes for t in tensors), "reconstruct", "B", progress)
    with bar:
        return write_gguf(output, delta.architecture, fields, tensors, alignment=delta.file.alignment,
                          on_tensor=lambda t: bar.update(t.nbytes))


def _open_parent(header: DeltaHeader, given: str | os.PathLike[str] | None, delta_path: Path) -> GGUFModel | None:
    if header.parent is None:
        if given is not None:
            raise DeltaError(f"{delta_path} was not made against a parent model: leave out --parent")
        return None
    path = Path(given) if given is not None else Path(header.parent.path)
    if not path.is_file():
        raise DeltaError(f"{delta_path} needs its parent model {header.parent.name}, which is no longer at "
                         f"{header.parent.path}: give its path (pyllamaopt delta reconstruct DELTA OUT --parent PATH, "
                         "then load OUT)")
    parent = GGUFModel(path, role="parent")
    parent.check_matrices(header.matrices, role="parent")
    if parent.n_layers != header.n_layers or parent.fingerprint(header.matrices) != header.parent.fingerprint:
        raise DeltaError(f"{path} is not the parent {delta_path} was made against ({header.parent.name}: "
                         "its matrices differ)")
    return parent


def _plan_tensors(delta: GGUFModel, header: DeltaHeader, parent: GGUFModel | None) -> tuple[list[OutTensor], bool]:
    """The output's tensors in the delta file's order, each decomposed matrix rebuilt where its
    first factor was; and whether any tensor's type changed."""
    rebuilt: dict[tuple[int, str], OutTensor] = {}
    converted = False
    for matrix in header.matrices:
        for layer, rank in enumerate(header.ranks[matrix]):
            if rank != WHOLE:
                source_type = gguf.GGMLQuantizationType(header.source_types[matrix][layer])
                out_type = _F32 if source_type == _F32 else _F16
                converted |= out_type != source_type
                rebuilt[layer, matrix] = _rebuilt_tensor(delta, header, parent, layer, matrix, rank, out_type)

    tensors: list[OutTensor] = []
    for t in delta.file.tensors:
        parts = t.name.split(".")
        if parts[0] == "base" or parts[-1] == "delta_v":
            continue
        if parts[-1] == "delta_u":
            tensors.append(rebuilt.pop((int(parts[1]), parts[2])))
        else:
            tensors.append(OutTensor.copy_of(t))
    tensors += rebuilt.values()   # rank 0: the matrix is its base, nothing of it is in the file
    return tensors, converted


def _rebuilt_tensor(delta: GGUFModel, header: DeltaHeader, parent: GGUFModel | None, layer: int, matrix: str,
                    rank: int, out_type: gguf.GGMLQuantizationType) -> OutTensor:
    dtype = np.dtype(np.float32 if out_type == _F32 else np.float16)
    rows_cols: tuple[int, ...]
    if parent is not None:
        shape = parent.matrix_shape(layer, matrix)
        rows_cols = (shape.rows, shape.cols)
    else:
        base_tensor = delta.tensor(base_name(header.bases[matrix][layer], matrix))
        rows_cols = base_tensor.shape

    def load() -> np.ndarray:
        w = parent.matrix(layer, matrix) if parent is not None else dequantize(base_tensor)
        if rank:
            u = np.asarray(delta.tensor(delta_u_name(layer, matrix)).data, dtype=np.float32)
            v = np.asarray(delta.tensor(delta_v_name(layer, matrix)).data, dtype=np.float32)
            w = w + u @ v
        return w.astype(dtype)

    return OutTensor(matrix_name(layer, matrix), rows_cols, dtype, out_type, load)


def default_cache_dir() -> Path:
    """Where Model() keeps the standard GGUFs it rebuilds from delta files:
    ``$XDG_CACHE_HOME/pyllamaopt/delta`` (``~/.cache/pyllamaopt/delta``)."""
    return cache_root() / "delta"


def cached_reconstruction(delta_path: str | os.PathLike[str], *, progress: bool | None = None) -> Path:
    """The standard GGUF rebuilt from `delta_path`, built once and then found by the file's content hash."""
    digest = hashlib.sha256()
    with open(delta_path, "rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    cache_dir = default_cache_dir()
    path = cache_dir / f"{digest.hexdigest()[:32]}.gguf"
    if not _whole_gguf(path):  # missing, or cut short by a crash or a full disk: built (again)
        try:
            cache_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DeltaError(f"cannot make the cache of rebuilt models {cache_dir}: {exc}; set XDG_CACHE_HOME to a "
                             "directory you can write") from None
        reconstruct(delta_path, path, progress=progress)
    return path


def _whole_gguf(path: Path) -> bool:
    """A GGUF file whose header reads and whose every tensor lies within it."""
    if not path.is_file():
        return False
    try:
        GGUFFile(path)  # (checks each tensor's end against the file's size)
    except (ValueError, OSError):
        return False
    return True
