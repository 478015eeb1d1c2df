"""Is this GGUF file a delta file? Answered from its first metadata keys, without importing gguf
(which costs ~0.3 s), so that Model() can ask it of every file it loads."""
from __future__ import annotations

import os
import struct
from typing import BinaryIO

from .names import VERSION_KEY

_GGUF_MAGIC = b"GGUF"
# Delta files put VERSION_KEY right after general.architecture; looking this far is enough.
_SCAN_KEYS = 4
_STRING = 8
# GGUF value type -> size of a scalar of that type
_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def is_delta_file(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is a delta GGUF. Anything unreadable is 'no', left for the loader to report."""
    try:
        with open(path, "rb") as f:
            magic, _version, _n_tensors, n_kv = struct.unpack("<4sIQQ", f.read(24))
            if magic != _GGUF_MAGIC:
                return False
            for _ in range(min(n_kv, _SCAN_KEYS)):
                if _read_string(f) == VERSION_KEY:
                    return True
                (vtype,) = struct.unpack("<I", f.read(4))
                if not _skip_value(f, vtype):
                    return False
    except (OSError, struct.error, UnicodeDecodeError, ValueError):
        return False
    return False


def _read_string(f: BinaryIO) -> str:
    (length,) = struct.unpack("<Q", f.read(8))
    if length > 1 << 16:
        raise ValueError("not a metadata key")
    return f.read(length).decode()


def _skip_value(f: BinaryIO, vtype: int) -> bool:
    """Skip a scalar or string; False for an array (none comes before the marker in a delta file)."""
    if vtype == _STRING:
        (length,) = struct.unpack("<Q", f.read(8))
        f.seek(length, os.SEEK_CUR)
        return True
    size = _SCALAR_SIZES.get(vtype)
    if size is None:
        return False
    f.seek(size, os.SEEK_CUR)
    return True
