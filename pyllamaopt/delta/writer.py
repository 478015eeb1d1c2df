"""Writing GGUF files one tensor at a time, atomically: a reader never sees a half-written file."""
from __future__ import annotations

import contextlib
import math
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from ..errors import DeltaError
from .reader import Tensor

Field = tuple[str, Any, gguf.GGUFValueType, "gguf.GGUFValueType | None"]


@dataclass(frozen=True)
class OutTensor:
    """A tensor to write: `load` gives its array (raw blocks for quantized types) when its turn comes."""
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    ggml_type: gguf.GGMLQuantizationType
    load: Callable[[], np.ndarray]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    @classmethod
    def copy_of(cls, tensor: Tensor) -> OutTensor:
        """The tensor's bytes exactly as stored in the file it comes from."""
        return cls(tensor.name, tensor.data.shape, tensor.data.dtype, tensor.tensor_type, lambda: tensor.data)


def data_offsets(tensors: Sequence[OutTensor], alignment: int) -> list[int]:
    """Offset of each tensor from the start of the data section (each one starts aligned),
    followed by the end of the data section."""
    offsets = [0]
    for t in tensors:
        offsets.append(offsets[-1] + gguf.GGUFWriter.ggml_pad(t.nbytes, alignment))
    return offsets


def check_output(output: Path, inputs: Sequence[Path]) -> None:
    """An output file can be written without destroying an input (checked before any work)."""
    if not output.parent.is_dir():
        raise DeltaError(f"output directory {output.parent} does not exist")
    if output.is_dir():
        raise DeltaError(f"output {output} is a directory; give a file path")
    if any(output.resolve() == p.resolve() for p in inputs):
        raise DeltaError(f"output {output} would overwrite an input; choose another output file")


@contextlib.contextmanager
def atomic_output(path: Path) -> Iterator[Path]:
    """Yields a temporary path next to `path`; renamed to `path` only if the block completes.
    On any exception, KeyboardInterrupt included, the temporary file is removed."""
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")  # (threads of a process too)
    try:
        yield tmp
        with open(tmp, "rb+") as written:  # on disk before it has its name: a crash leaves no half file there
            os.fsync(written.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_gguf(path: Path, architecture: str, fields: Sequence[Field], tensors: Sequence[OutTensor], *,
               alignment: int = gguf.GGUF_DEFAULT_ALIGNMENT, max_size: int | None = None,
               on_tensor: Callable[[OutTensor], None] | None = None) -> int:
    """Write a GGUF file atomically, loading one tensor at a time; returns its size.
    With `max_size`, a file that would be larger is not kept (DeltaError)."""
    with atomic_output(path) as tmp:
        writer = gguf.GGUFWriter(tmp, architecture)
        writer.data_alignment = alignment
        try:
            for key, value, vtype, sub_type in fields:
                writer.add_key_value(key, value, vtype, sub_type)
            for t in tensors:
                writer.add_tensor_info(t.name, t.shape, t.dtype, t.nbytes, raw_dtype=t.ggml_type)
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_ti_data_to_file()
            for t in tensors:
                array = t.load()
                if array.shape != t.shape or array.dtype != t.dtype:
                    raise AssertionError(f"{t.name}: planned {t.shape} {t.dtype}, got {array.shape} {array.dtype}")
                writer.write_tensor_data(array)
                if on_tensor:
                    on_tensor(t)
        finally:
            writer.close()
        size = tmp.stat().st_size
        if max_size is not None and size > max_size:
            raise DeltaError(f"the output would be {size} bytes, larger than the input's {max_size}: "
                             "nothing to gain at this rank or error target")
    return size
