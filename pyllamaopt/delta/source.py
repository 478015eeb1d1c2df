"""A GGUF model opened for reading (memory-mapped): its layers, its matrices, dequantized on demand."""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from ..errors import DeltaError
from .names import matrix_name
from .reader import GGUFFile, Tensor


def can_dequantize(qtype: gguf.GGMLQuantizationType) -> bool:
    """Whether gguf-py can turn this tensor type into floats (it cannot for integer types, Q8_K...)."""
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    try:
        gguf.quants.dequantize(np.zeros((1, type_size), dtype=np.uint8), qtype)
    except (NotImplementedError, ValueError):
        return False
    return True


def dequantize(tensor: Tensor) -> np.ndarray:
    """The tensor as float32 in numpy order (rows, columns)."""
    if tensor.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
        return np.asarray(tensor.data, dtype=np.float32)
    return gguf.quants.dequantize(tensor.data, tensor.tensor_type)


@dataclass(frozen=True)
class MatrixShape:
    rows: int
    cols: int

    @property
    def max_rank(self) -> int:
        return min(self.rows, self.cols)

    def __str__(self) -> str:
        return f"{self.rows} x {self.cols}"


class GGUFModel:
    """A GGUF file, memory-mapped; nothing is read until asked for."""

    def __init__(self, path: str | os.PathLike[str], *, role: str = "input") -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise DeltaError(f"{role} {self.path}: no such file")
        try:
            self.file = GGUFFile(self.path)
        except (ValueError, OSError) as exc:
            raise DeltaError(f"{role} {self.path} is not a readable GGUF file (not GGUF, or truncated): "
                             f"{exc}") from None
        self.tensors = {t.name: t for t in self.file.tensors}
        self.architecture = str(self.field("general.architecture", ""))
        self.n_layers = int(self.field(f"{self.architecture}.block_count", 0))

    def field(self, key: str, default: Any = None) -> Any:
        """The metadata value of `key` (its type is the file's: see Field.value), else `default`."""
        f = self.file.fields.get(key)
        return default if f is None else f.value

    def tensor(self, name: str) -> Tensor:
        try:
            return self.tensors[name]
        except KeyError:
            raise DeltaError(f"{self.path} has no tensor {name}: the file is damaged, or not the one it should be") from None

    def matrix(self, layer: int, matrix: str) -> np.ndarray:
        return dequantize(self.tensors[matrix_name(layer, matrix)])

    def matrix_shape(self, layer: int, matrix: str) -> MatrixShape:
        return MatrixShape(*self.tensors[matrix_name(layer, matrix)].shape)

    def layer_matrices(self) -> list[str]:
        """Names of the 2-D weight matrices of layer 0 (what --matrices can choose from)."""
        names = [name.split(".")[2] for name, t in self.tensors.items()
                 if name.startswith("blk.0.") and name.endswith(".weight") and len(t.shape) == 2]
        return sorted(names)

    def check_matrices(self, matrices: tuple[str, ...], role: str = "input") -> None:
        """Every layer has every matrix, 2-D, of a type gguf-py can dequantize."""
        if self.n_layers <= 0:
            raise DeltaError(f"{role} {self.path}: no '{self.architecture}.block_count' in the metadata, "
                             "so it has no layers to decompose")
        checked_types: dict[gguf.GGMLQuantizationType, bool] = {}
        for layer in range(self.n_layers):
            for matrix in matrices:
                t = self.tensors.get(matrix_name(layer, matrix))
                if t is None:
                    raise DeltaError(
                        f"{role} {self.path} ({self.architecture}) has no tensor {matrix_name(layer, matrix)}; "
                        f"its layers have: {', '.join(self.layer_matrices()) or 'no 2-D matrices'} "
                        "(choose with --matrices)")
                if len(t.shape) != 2:
                    raise DeltaError(f"{role} {t.name} has {len(t.shape)} dimensions; only 2-D matrices decompose")
                if t.tensor_type not in checked_types:
                    checked_types[t.tensor_type] = can_dequantize(t.tensor_type)
                if not checked_types[t.tensor_type]:
                    raise DeltaError(f"{role} {t.name} has type {t.tensor_type.name}, which gguf-py cannot dequantize; "
                                     "leave this matrix out with --matrices")

    def fingerprint(self, matrices: tuple[str, ...]) -> str:
        """sha256 of these matrices' stored bytes in every layer: identifies a parent model."""
        digest = hashlib.sha256()
        for layer in range(self.n_layers):
            for matrix in matrices:
                t = self.tensors[matrix_name(layer, matrix)]
                digest.update(f"{t.name}:{t.tensor_type.name}:".encode())
                digest.update(np.ascontiguousarray(t.data).data)
        return digest.hexdigest()
