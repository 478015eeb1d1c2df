"""Arrays spilled to a temporary file while a delta file is planned, so that memory holds one
matrix at a time however large the model is. The file is removed however the run ends."""
from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np


class ScratchFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = open(path, "w+b")

    def store(self, array: np.ndarray) -> Callable[[], np.ndarray]:
        """Append `array`; returns a function that reads it back."""
        array = np.ascontiguousarray(array)
        offset = self._file.seek(0, os.SEEK_END)
        array.tofile(self._file)
        shape, dtype, count = array.shape, array.dtype, array.size

        def load() -> np.ndarray:
            self._file.flush()
            return np.fromfile(self.path, dtype=dtype, count=count, offset=offset).reshape(shape)

        return load

    def close(self) -> None:
        self._file.close()


@contextlib.contextmanager
def scratch_file(next_to: Path) -> Iterator[ScratchFile]:
    scratch = ScratchFile(next_to.with_name(f"{next_to.name}.scratch-{os.getpid()}"))
    try:
        yield scratch
    finally:
        scratch.close()
        scratch.path.unlink(missing_ok=True)
