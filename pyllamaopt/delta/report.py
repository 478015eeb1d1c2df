"""What a decomposition did, per layer and matrix: relative error, rank, bytes; as JSON and as a table."""
from __future__ import annotations

import json
import resource
import sys
import threading
from dataclasses import Field, asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from .format import WHOLE
from .writer import atomic_output


class JsonReport:
    """For a report dataclass: itself as JSON (``asdict``), and saved to a file atomically."""

    if TYPE_CHECKING:  # subclasses are dataclasses: what asdict() needs of self
        __dataclass_fields__: ClassVar[dict[str, Field[Any]]]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def save_json(self, path: Path) -> None:
        with atomic_output(path) as tmp:
            tmp.write_text(json.dumps(self.to_json(), indent=1) + "\n")


@dataclass(frozen=True)
class MatrixResult:
    """One layer's matrix in the output."""
    layer: int
    matrix: str
    rows: int
    cols: int
    source_type: str
    source_bytes: int
    rank: int           # WHOLE (-1): stored as it was
    base: int           # index of its base, -1 for none
    rel_error: float    # ‖W − Ŵ‖ / ‖W‖ against the dequantized original
    stored_bytes: int   # delta factors, or the original bytes when stored whole


@dataclass(frozen=True)
class BaseResult:
    matrix: str
    index: int
    layers: list[int]
    kept: bool          # False: no layer of its cluster got smaller, so all were stored whole
    bytes: int


@dataclass(frozen=True)
class LayerBytes:
    layer: int
    offset: int         # from the start of the data section
    bytes: int          # what streaming this layer reads
    source_bytes: int   # the same layer in the input


@dataclass
class DecompositionReport(JsonReport):
    input: str
    output: str
    options: dict[str, Any]
    input_bytes: int
    output_bytes: int
    matrices: list[MatrixResult]
    bases: list[BaseResult]
    layers: list[LayerBytes]
    resident_bytes: int      # tensors outside the layers plus the bases: read once, kept
    peak_rss_bytes: int      # ru_maxrss: includes the pages of the memory-mapped input
    peak_anonymous_bytes: int   # the memory the work itself held (RssAnon)
    seconds: float
    totals: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        source = sum(m.source_bytes for m in self.matrices)
        stored = sum(m.stored_bytes for m in self.matrices) + sum(b.bytes for b in self.bases if b.kept)
        self.totals = {
            "ratio": self.output_bytes / self.input_bytes,
            "decomposed_source_bytes": source,
            "decomposed_stored_bytes": stored,
            "decomposed_ratio": stored / source if source else 1.0,
            "streamed_bytes_per_layer": sum(layer.bytes for layer in self.layers) / max(len(self.layers), 1),
            "source_bytes_per_layer": sum(layer.source_bytes for layer in self.layers) / max(len(self.layers), 1),
            "max_rel_error": max((m.rel_error for m in self.matrices), default=0.0),
        }

    def table(self) -> str:
        """Per layer: rank and error of each matrix, and the bytes streaming it reads; then per
        matrix type; then the totals."""
        types = list(dict.fromkeys(m.matrix for m in self.matrices))
        cell = {(m.layer, m.matrix): m for m in self.matrices}
        lines = ["layer " + "".join(f"{t:>15}" for t in types) + "   streamed / input bytes"]
        for layer in self.layers:
            cells = "".join(f"{_rank_cell(cell[layer.layer, t]):>15}" if (layer.layer, t) in cell else f"{'':>15}"
                            for t in types)
            lines.append(f"{layer.layer:>5} {cells}   {megabytes(layer.bytes)} / {megabytes(layer.source_bytes)}")
        lines += ["", f"{'matrix':<12}{'input':>11}{'stored':>11}{'ratio':>8}{'whole':>7}{'mean err':>10}"
                      f"{'max err':>9}{'ranks':>12}"]
        for t in types:
            rows = [m for m in self.matrices if m.matrix == t]
            source = sum(m.source_bytes for m in rows)
            stored = sum(m.stored_bytes for m in rows) + sum(b.bytes for b in self.bases if b.kept and b.matrix == t)
            ranks = [m.rank for m in rows if m.rank != WHOLE]
            errors = [m.rel_error for m in rows]
            lines.append(f"{t:<12}{megabytes(source):>11}{megabytes(stored):>11}{stored / source:>8.3f}"
                         f"{sum(m.rank == WHOLE for m in rows):>7}{100 * sum(errors) / len(errors):>9.2f}%"
                         f"{100 * max(errors):>8.2f}%{_range(ranks):>12}")
        totals = self.totals
        lines += ["",
                  f"decomposed matrices: {megabytes(totals['decomposed_source_bytes'])} -> "
                  f"{megabytes(totals['decomposed_stored_bytes'])} ({totals['decomposed_ratio']:.3f}, bases included)",
                  f"file: {megabytes(self.input_bytes)} -> {megabytes(self.output_bytes)} ({totals['ratio']:.3f})",
                  f"streamed per layer: {megabytes(totals['streamed_bytes_per_layer'])} "
                  f"(input {megabytes(totals['source_bytes_per_layer'])}); resident: {megabytes(self.resident_bytes)}",
                  f"peak RSS {megabytes(self.peak_rss_bytes)} (of which anonymous, not file pages: "
                  f"{megabytes(self.peak_anonymous_bytes)}), {self.seconds:.1f} s"]
        return "\n".join(lines)


def _rank_cell(m: MatrixResult) -> str:
    return "whole" if m.rank == WHOLE else f"r{m.rank} {100 * m.rel_error:.1f}%"


def _range(values: list[int]) -> str:
    if not values:
        return "-"
    return str(values[0]) if min(values) == max(values) else f"{min(values)}-{max(values)}"


def megabytes(n: float) -> str:
    return f"{n / 1e6:.2f} MB"


class AnonymousMemoryPeak:
    """Peak anonymous resident memory (Linux RssAnon) while the block runs, sampled by a thread.
    Unlike ru_maxrss it leaves out the pages of memory-mapped model files, which the kernel can
    drop at any time: copying a tensor through the map counts the file in ru_maxrss, not here.
    0 where /proc/self/status is missing."""

    INTERVAL = 0.01

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> AnonymousMemoryPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            self.peak = max(self.peak, _anonymous_rss())
            if self._stop.wait(self.INTERVAL):
                return


def _anonymous_rss() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def peak_rss_bytes() -> int:
    """The process's peak resident set size so far (ru_maxrss is in bytes on macOS, KiB elsewhere)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
