"""pyllamaopt delta report: relative error against rank for each matrix type, without writing a model.

The errors come from the singular values of each residual W − base (exact SVD up to
EXACT_SVD_MAX_DIM), before the factors are rounded to F16; `decompose` measures the error
after rounding, which is at most a little higher.
"""
from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

import numpy as np

from ..errors import DeltaError
from .decomposition import FACTOR_ITEM_BYTES, DecomposeOptions, TypeBases, check_inputs
from .names import DEFAULT_MATRICES, matrix_name
from .progress import progress_bar
from .report import JsonReport, megabytes, peak_rss_bytes
from .source import GGUFModel
from .svd import EXACT_SVD_MAX_DIM, truncated_svd
from .writer import atomic_output

DEFAULT_RANKS = (16, 32, 64, 128)
DEFAULT_TARGET_ERRORS = (0.01, 0.05, 0.10)


@dataclass(frozen=True)
class LayerCurve:
    layer: int
    matrix: str
    rows: int
    cols: int
    source_bytes: int
    base: int
    errors: list[float]   # errors[r] = relative error at rank r, for r = 0 .. len - 1

    def error_at(self, rank: int) -> float | None:
        if rank < len(self.errors):
            return self.errors[rank]
        return 0.0 if len(self.errors) > min(self.rows, self.cols) else None   # full rank: exact

    def rank_for(self, target: float) -> int | None:
        """Smallest rank meeting `target`; None if beyond the ranks computed."""
        meets = [r for r, e in enumerate(self.errors) if e <= target]
        return meets[0] if meets else None

    def stored_bytes(self, rank: int | None) -> int:
        """Bytes of its delta at `rank`, or of the original when that is not smaller."""
        if rank is None:
            return self.source_bytes
        return min(rank * (self.rows + self.cols) * FACTOR_ITEM_BYTES, self.source_bytes)


class RankOutcome(TypedDict):
    """A matrix type with every layer's delta at one rank."""
    mean: float | None   # relative error over the layers (None: beyond the ranks computed)
    min: float | None
    max: float | None
    ratio: float         # size against the original, bases included
    whole: int           # layers stored whole


class TargetOutcome(TypedDict):
    """A matrix type with each layer's delta at the smallest rank meeting one target error."""
    ranks: list[int | None]   # per layer; None: more than the ranks computed
    ratio: float
    whole: int


class MatrixSummary(TypedDict):
    at_rank: dict[int, RankOutcome]
    at_target: dict[float, TargetOutcome]


@dataclass
class ErrorCurves(JsonReport):
    input: str
    options: dict[str, object]
    ranks: list[int]
    target_errors: list[float]
    layers: list[LayerCurve]
    base_bytes: dict[str, list[int]]    # per matrix type, per base
    peak_rss_bytes: int = 0
    seconds: float = 0.0
    summary: dict[str, MatrixSummary] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for matrix in dict.fromkeys(c.matrix for c in self.layers):
            curves = [c for c in self.layers if c.matrix == matrix]
            at_rank: dict[int, RankOutcome] = {}
            for rank in self.ranks:
                errors = [c.error_at(rank) for c in curves]
                known = [e for e in errors if e is not None]
                ratio, whole = self._outcome(curves, [rank] * len(curves))
                at_rank[rank] = {"mean": float(np.mean(known)) if known else None,
                                 "min": min(known, default=None), "max": max(known, default=None),
                                 "ratio": ratio, "whole": whole}
            at_target: dict[float, TargetOutcome] = {}
            for target in self.target_errors:
                ranks = [c.rank_for(target) for c in curves]
                ratio, whole = self._outcome(curves, ranks)
                at_target[target] = {"ranks": ranks, "ratio": ratio, "whole": whole}
            self.summary[matrix] = {"at_rank": at_rank, "at_target": at_target}

    def _outcome(self, curves: list[LayerCurve], ranks: list[int | None]) -> tuple[float, int]:
        """Size ratio of this matrix type (bases included) with deltas at `ranks`, and how many
        layers are stored whole; a cluster keeps its base only if that makes it smaller, as
        decompose does."""
        source = sum(c.source_bytes for c in curves)
        whole = [c.stored_bytes(r) == c.source_bytes for c, r in zip(curves, ranks, strict=True)]
        if self.options.get("parent"):
            return sum(c.stored_bytes(r) for c, r in zip(curves, ranks, strict=True)) / source, sum(whole)
        stored = 0
        for k, base_bytes in enumerate(self.base_bytes[curves[0].matrix]):
            cluster = [i for i, c in enumerate(curves) if c.base == k]
            as_is = sum(curves[i].source_bytes for i in cluster)
            with_base = base_bytes + sum(curves[i].stored_bytes(ranks[i]) for i in cluster)
            stored += min(as_is, with_base)
            if with_base >= as_is:
                whole = [w or i in cluster for i, w in enumerate(whole)]
        return stored / source, sum(whole)

    def table(self) -> str:
        """Per matrix type: the error at each rank, then the rank each target error needs; each
        with the size of the type (bases included) against the original."""
        lines = ["relative error ‖W−Ŵ‖/‖W‖ over the layers at each rank (factors not yet rounded to F16)",
                 f"{'matrix':<12}{'rank':>6}{'mean':>9}{'min':>9}{'max':>9}{'whole':>7}{'size ratio':>12}"]
        for matrix, s in self.summary.items():
            for rank in self.ranks:
                a = s["at_rank"][rank]
                errors = "".join(f"{'n/a':>9}" if e is None else f"{_pct(e):>9}" for e in (a["mean"], a["min"], a["max"]))
                lines.append(f"{matrix:<12}{rank:>6}{errors}{a['whole']:>7}{a['ratio']:>12.3f}")
        lines += ["", "rank each layer needs to meet a target error ('>': more than the ranks computed); "
                      "a delta not smaller than its matrix is stored whole",
                  f"{'matrix':<12}{'target':>8}{'median':>8}{'max':>7}{'whole':>7}{'size ratio':>12}"]
        for matrix, s in self.summary.items():
            curves = [c for c in self.layers if c.matrix == matrix]
            for target in self.target_errors:
                t = s["at_target"][target]
                ranks = [r if r is not None else len(c.errors) for r, c in zip(t["ranks"], curves, strict=True)]
                unknown = ">" if None in t["ranks"] else ""
                lines.append(f"{matrix:<12}{_pct(target):>8}{int(np.median(ranks)):>8}{unknown + str(max(ranks)):>7}"
                             f"{t['whole']:>7}{t['ratio']:>12.3f}")
        lines += ["", f"peak RSS {megabytes(self.peak_rss_bytes)}, {self.seconds:.1f} s"]
        return "\n".join(lines)

    def plot(self, path: Path) -> None:
        """Mean relative error against rank, one line per matrix type (needs matplotlib)."""
        require_matplotlib()
        import matplotlib

        matplotlib.use("Agg")   # no display needed
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(8, 5))
        for matrix in self.summary:
            curves = [c.errors for c in self.layers if c.matrix == matrix]
            n = min(len(e) for e in curves)
            ax.plot(range(n), np.mean([e[:n] for e in curves], axis=0), label=matrix)
        for target in self.target_errors:
            ax.axhline(target, color="grey", linewidth=0.5, linestyle="--")
        ax.set(xlabel="rank", ylabel="relative error ‖W−Ŵ‖/‖W‖ (mean over layers)", ylim=(0, 1.05),
               title=f"{Path(self.input).name}: error against rank")
        ax.legend()
        with atomic_output(path) as tmp:
            fig.savefig(tmp, format="png", dpi=120)
        plt.close(fig)


def require_matplotlib() -> None:
    if importlib.util.find_spec("matplotlib") is None:
        raise DeltaError("the plot needs matplotlib: pip install matplotlib (or leave out --plot)")


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def analyze(source: str | os.PathLike[str], *, matrices: Sequence[str] = DEFAULT_MATRICES,
            ranks: Sequence[int] = DEFAULT_RANKS, target_errors: Sequence[float] = DEFAULT_TARGET_ERRORS,
            n_bases: int = 1, parent: str | os.PathLike[str] | None = None, base_type: str = "F16",
            progress: bool | None = None) -> ErrorCurves:
    """Error-against-rank curves of each matrix type of the GGUF model `source`."""
    started = time.perf_counter()
    if not ranks or any(isinstance(r, bool) or not isinstance(r, int) or r < 0 for r in ranks):
        raise DeltaError(f"ranks must be whole numbers >= 0 (0: the base alone), got {list(ranks)!r}")
    if not target_errors:
        raise DeltaError("give at least one target error")
    if any(not 0 < t < 1 for t in target_errors):  # (each; DecomposeOptions checks only the smallest, by its flag)
        raise DeltaError(f"target errors are relative errors between 0 and 1 (0.05 = 5 %), got {list(target_errors)!r}")
    options = DecomposeOptions(target_error=min(target_errors), n_bases=n_bases, matrices=tuple(matrices),
                               parent=Path(parent) if parent is not None else None, base_type=base_type)
    options.check()
    model = GGUFModel(source)
    parent_model = GGUFModel(parent, role="parent") if parent is not None else None
    check_inputs(model, parent_model, options)
    for target in target_errors:
        DecomposeOptions(target_error=target).check()

    curves: list[LayerCurve] = []
    base_bytes: dict[str, list[int]] = {}
    with progress_bar(len(matrices) * model.n_layers, "analyze", "matrix", progress) as bar:
        for matrix in options.matrices:
            bases = TypeBases(model, matrix, options, parent_model)
            base_bytes[matrix] = [b.nbytes for b in bases.stored]
            for layer in range(model.n_layers):
                curves.append(_layer_curve(model, layer, matrix, bases, max(ranks)))
                bar.update(1)
    return ErrorCurves(str(source), _options(options), list(ranks), list(target_errors), curves, base_bytes,
                       peak_rss_bytes(), time.perf_counter() - started)


def _layer_curve(model: GGUFModel, layer: int, matrix: str, bases: TypeBases, max_rank: int) -> LayerCurve:
    w = model.matrix(layer, matrix)
    rows, cols = w.shape
    source_bytes = model.tensor(matrix_name(layer, matrix)).n_bytes
    # exact SVDs give the whole curve; randomized ones reach far enough to say when storing whole wins
    worthwhile = source_bytes // ((rows + cols) * FACTOR_ITEM_BYTES)
    limit = min(rows, cols) if min(rows, cols) <= EXACT_SVD_MAX_DIM else max(max_rank, worthwhile)
    svd = truncated_svd(w - bases.base_of(layer), limit)
    norm_w = float(np.linalg.norm(w)) or 1.0
    errors = (np.sqrt(svd.tail_sq) / norm_w).tolist()
    return LayerCurve(layer, matrix, rows, cols, source_bytes, bases.assignment[layer], errors)


def _options(options: DecomposeOptions) -> dict[str, object]:
    return {"n_bases": options.n_bases, "matrices": list(options.matrices), "base_type": options.base_type,
            "parent": str(options.parent) if options.parent else None}
