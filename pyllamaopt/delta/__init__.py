"""GGUF delta decomposition: a model's layer matrices as shared bases plus per-layer low-rank
deltas (docs/delta.md).

    >>> from pyllamaopt import delta
    >>> report = delta.decompose("model.gguf", "model.delta.gguf", delta.DecomposeOptions(rank=64))
    >>> print(report.table())
    >>> delta.reconstruct("model.delta.gguf", "rebuilt.gguf")   # a standard GGUF again
    >>> Model("model.delta.gguf")                                # rebuilt once, then cached

The modules load on first use: gguf takes ~0.3 s to import, and `import pyllamaopt` should not
pay for it.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ..errors import DeltaError
from .marker import is_delta_file

if TYPE_CHECKING:
    from .analysis import ErrorCurves, analyze
    from .decomposition import DecomposeOptions, decompose
    from .reconstruction import cached_reconstruction, reconstruct
    from .report import DecompositionReport

_LAZY = {
    "DecomposeOptions": "decomposition", "decompose": "decomposition",
    "reconstruct": "reconstruction", "cached_reconstruction": "reconstruction",
    "DecompositionReport": "report",
    "ErrorCurves": "analysis", "analyze": "analysis",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)


__all__ = ["DecomposeOptions", "DecompositionReport", "DeltaError", "ErrorCurves", "analyze", "cached_reconstruction",
           "decompose", "is_delta_file", "reconstruct"]
