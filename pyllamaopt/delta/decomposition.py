"""pyllamaopt delta decompose: a model's layer matrices as shared bases plus per-layer low-rank deltas.

For each matrix type (attn_q, ..., ffn_down) the layers are clustered (k-means), each cluster
gets a base (the mean of its layers, stored at the base type), and each layer stores the
truncated SVD of its residual W − base as two F16 factors. A matrix whose delta would not be
smaller than the original, at the rank or error asked for, is stored whole; so is every layer
of a cluster whose base would cost more than its deltas save. The output is therefore never
larger than the input and never misses the error target.

One matrix type is processed at a time, one layer at a time; factors and bases go to a scratch
file until the output is written, so memory holds a few matrices whatever the model's size.
"""
from __future__ import annotations

import os
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import gguf
import numpy as np

from ..errors import DeltaError
from .bases import cluster_layers, cluster_means
from .format import NO_BASE, WHOLE, DeltaHeader, Parent, copied_fields
from .names import DEFAULT_MATRICES, VERSION_KEY, base_name, delta_u_name, delta_v_name, layer_of, matrix_name
from .progress import progress_bar
from .reader import Tensor
from .report import AnonymousMemoryPeak, BaseResult, DecompositionReport, LayerBytes, MatrixResult, peak_rss_bytes
from .scratch import ScratchFile, scratch_file
from .source import GGUFModel
from .svd import TruncatedSVD, smallest_rank_within, truncated_svd
from .writer import OutTensor, check_output, data_offsets, write_gguf

# the types gguf-py can quantize a base to
BASE_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q5_1", "Q5_0", "Q4_1", "Q4_0")
FACTOR_ITEM_BYTES = 2   # the low-rank factors are F16


@dataclass(frozen=True)
class DecomposeOptions:
    """rank: the same rank for every matrix; or target_error: the smallest rank per matrix whose
    relative error ‖W − Ŵ‖/‖W‖ is at most this. n_bases: k-means clusters of layers, one base
    each. parent: take each layer's base from this model instead (a fine-tune against its parent)."""
    rank: int | None = None
    target_error: float | None = None
    n_bases: int = 1
    matrices: tuple[str, ...] = DEFAULT_MATRICES
    parent: Path | None = None
    base_type: str = "F16"

    def check(self) -> None:
        if (self.rank is None) == (self.target_error is None):
            raise DeltaError("give either a rank (--rank R) or a target relative error (--target-error E), not both")
        if self.rank is not None and (isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank <= 0):
            raise DeltaError(f"--rank must be a positive whole number, got {self.rank!r}")
        if self.target_error is not None and not 0 < self.target_error < 1:
            raise DeltaError("--target-error is a relative error between 0 and 1 (0.05 = 5 %), "
                             f"got {self.target_error!r}")
        if isinstance(self.n_bases, bool) or not isinstance(self.n_bases, int) or self.n_bases < 1:
            raise DeltaError(f"--bases must be a positive whole number, got {self.n_bases!r}")
        if self.parent is not None and self.n_bases != 1:
            raise DeltaError("with --parent each layer's base is the parent's same layer: --bases does not apply")
        if not self.matrices or len(set(self.matrices)) != len(self.matrices):
            raise DeltaError(f"--matrices must name each matrix type once, got {','.join(self.matrices)!r}")
        if self.base_type not in BASE_TYPES:
            raise DeltaError(f"--base-type {self.base_type!r} is not one gguf-py can write; "
                             f"choose from {', '.join(BASE_TYPES)}")


@dataclass
class DeltaFit:
    rank: int
    u: np.ndarray        # (rows, rank) F16: U·√S
    v: np.ndarray        # (rank, cols) F16: √S·Vᵀ
    rel_error: float     # with the factors as stored


def fit_delta(w: np.ndarray, base: np.ndarray, source_bytes: int, options: DecomposeOptions) -> DeltaFit | None:
    """The low-rank delta of `w` from `base`, or None when storing `w` whole is the better choice:
    its delta would not be smaller than `source_bytes` (at the target error, in that mode)."""
    residual = w - base
    rows, cols = w.shape
    norm_w = float(np.linalg.norm(w)) or 1.0
    worthwhile_rank = (source_bytes - 1) // ((rows + cols) * FACTOR_ITEM_BYTES)
    if options.rank is not None:
        svd = truncated_svd(residual, options.rank)
        # below the requested rank only when the residual has no more (e.g. an untouched layer)
        fit = _fit_at(svd, min(options.rank, svd.numerical_rank()), residual, norm_w)
        return fit if fit.rank <= worthwhile_rank and np.isfinite(fit.rel_error) else None
    assert options.target_error is not None
    svd = truncated_svd(residual, worthwhile_rank)
    rank = smallest_rank_within(svd, (options.target_error * norm_w) ** 2)
    while rank is not None and rank <= svd.s.size:
        fit = _fit_at(svd, rank, residual, norm_w)
        if fit.rel_error <= options.target_error:
            return fit
        rank += 1   # rounding the factors to F16 cost the last bit of precision
    return None


def _fit_at(svd: TruncatedSVD, rank: int, residual: np.ndarray, norm_w: float) -> DeltaFit:
    u, v = svd.factors(rank)
    left = residual - u.astype(np.float32) @ v.astype(np.float32) if rank else residual
    return DeltaFit(rank, u, v, float(np.linalg.norm(left)) / norm_w)


class TypeBases:
    """The base each layer's matrix of one type is a delta from: the mean of its k-means cluster
    (as stored, at the base type), or the parent model's same matrix."""

    def __init__(self, model: GGUFModel, matrix: str, options: DecomposeOptions, parent: GGUFModel | None) -> None:
        self.matrix = matrix
        self.parent = parent
        self.qtype = gguf.GGMLQuantizationType[options.base_type]
        self.stored: list[np.ndarray] = []
        self.values: list[np.ndarray] = []
        if parent is not None:
            self.assignment = [NO_BASE] * model.n_layers
            return

        def load(layer: int) -> np.ndarray:
            return model.matrix(layer, matrix)

        self.assignment = cluster_layers(load, model.n_layers, options.n_bases)
        for mean in cluster_means(load, self.assignment, options.n_bases):
            stored = gguf.quants.quantize(mean, self.qtype)
            self.stored.append(stored)
            self.values.append(gguf.quants.dequantize(stored, self.qtype))

    def base_of(self, layer: int) -> np.ndarray:
        if self.parent is not None:
            return self.parent.matrix(layer, self.matrix)
        return self.values[self.assignment[layer]]


@dataclass
class TypeDecomposition:
    matrix: str
    results: list[MatrixResult]
    bases: list[BaseResult]
    base_tensors: list[OutTensor]               # the bases kept
    delta_tensors: dict[int, list[OutTensor]]   # decomposed layer -> its factors (none at rank 0)


def decompose_type(model: GGUFModel, matrix: str, options: DecomposeOptions, parent: GGUFModel | None,
                   scratch: ScratchFile, on_layer: Callable[[], None] = lambda: None) -> TypeDecomposition:
    """Decompose one matrix type over all layers; factors and bases go to `scratch`."""
    bases = TypeBases(model, matrix, options, parent)
    fits: list[tuple[int, float] | None] = []   # per layer: (rank, error) of its delta, None: store whole
    factors: dict[int, list[OutTensor]] = {}
    stored_bytes: list[int] = []
    for layer in range(model.n_layers):
        source = model.tensor(matrix_name(layer, matrix))
        fit = fit_delta(model.matrix(layer, matrix), bases.base_of(layer), source.n_bytes, options)
        if fit is None:
            fits.append(None)
            stored_bytes.append(source.n_bytes)
        else:
            fits.append((fit.rank, fit.rel_error))
            stored_bytes.append(fit.u.nbytes + fit.v.nbytes)
            if fit.rank:
                factors[layer] = [_spill(scratch, delta_u_name(layer, matrix), fit.u),
                                  _spill(scratch, delta_v_name(layer, matrix), fit.v)]
        on_layer()

    base_results, base_tensors, kept = [], [], set()
    for k, stored in enumerate(bases.stored):
        layers = [layer for layer, a in enumerate(bases.assignment) if a == k]
        source_bytes = sum(model.tensor(matrix_name(layer, matrix)).n_bytes for layer in layers)
        # a base is worth keeping only if its cluster, base included, gets smaller
        keep = sum(stored_bytes[layer] for layer in layers) + stored.nbytes < source_bytes
        base_results.append(BaseResult(matrix, k, layers, keep, stored.nbytes))
        if keep:
            kept.add(k)
            base_tensors.append(_spill(scratch, base_name(k, matrix), stored, bases.qtype))

    results, delta_tensors = [], {}
    for layer, rank_error in enumerate(fits):
        source = model.tensor(matrix_name(layer, matrix))
        rows, cols = source.shape
        base = bases.assignment[layer]
        if rank_error is not None and (parent is not None or base in kept):
            rank, rel_error = rank_error
            results.append(MatrixResult(layer, matrix, rows, cols, source.tensor_type.name, source.n_bytes,
                                        rank, base, rel_error, stored_bytes[layer]))
            delta_tensors[layer] = factors.get(layer, [])
        else:
            results.append(MatrixResult(layer, matrix, rows, cols, source.tensor_type.name, source.n_bytes,
                                        WHOLE, NO_BASE, 0.0, source.n_bytes))
    return TypeDecomposition(matrix, results, base_results, base_tensors, delta_tensors)


def _spill(scratch: ScratchFile, name: str, array: np.ndarray,
           ggml_type: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.F16) -> OutTensor:
    return OutTensor(name, array.shape, array.dtype, ggml_type, scratch.store(array))


def check_inputs(model: GGUFModel, parent: GGUFModel | None, options: DecomposeOptions) -> None:
    """Every check of the models against the options, made before anything is computed."""
    if model.field(VERSION_KEY) is not None:
        raise DeltaError(f"{model.path} is already a delta file; decompose the original model "
                         "(or rebuild it with: pyllamaopt delta reconstruct)")
    model.check_matrices(options.matrices)
    if options.n_bases > model.n_layers:
        raise DeltaError(f"--bases {options.n_bases} is more than the model's {model.n_layers} layers")
    block_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[options.base_type]][0]
    for matrix in options.matrices:
        shapes = {model.matrix_shape(layer, matrix) for layer in range(model.n_layers)}
        if len(shapes) > 1 and parent is None:
            raise DeltaError(f"the layers' {matrix} matrices differ in shape, so they cannot share a base; "
                             "leave it out with --matrices")
        for shape in shapes:
            if options.rank is not None and options.rank > shape.max_rank:
                raise DeltaError(f"--rank {options.rank} is larger than {matrix} ({shape}) allows: "
                                 f"at most {shape.max_rank}")
            if shape.cols % block_size:
                raise DeltaError(f"--base-type {options.base_type} needs rows that are a multiple of {block_size} "
                                 f"values; {matrix} has {shape.cols}: choose F16")
    if parent is not None:
        parent.check_matrices(options.matrices, role="parent")
        if parent.n_layers != model.n_layers:
            raise DeltaError(f"the parent has {parent.n_layers} layers, the model {model.n_layers}: "
                             "--parent must be the model this one was fine-tuned from")
        for layer in range(model.n_layers):
            for matrix in options.matrices:
                ours, theirs = model.matrix_shape(layer, matrix), parent.matrix_shape(layer, matrix)
                if ours != theirs:
                    raise DeltaError(f"{matrix_name(layer, matrix)} is {ours} in the model but {theirs} in the parent: "
                                     "--parent must be the model this one was fine-tuned from")


def decompose(source: str | os.PathLike[str], output: str | os.PathLike[str],
              options: DecomposeOptions = DecomposeOptions(rank=64), *,
              progress: bool | None = None) -> DecompositionReport:
    """Write `output`, the delta file of the GGUF model `source`, and return what it holds."""
    started = time.perf_counter()
    source, output = Path(source), Path(output)
    options.check()
    model = GGUFModel(source)
    parent = GGUFModel(options.parent, role="parent") if options.parent is not None else None
    check_inputs(model, parent, options)
    check_output(output, [model.path] + ([parent.path] if parent else []))

    with scratch_file(output) as scratch, AnonymousMemoryPeak() as memory:
        bar = progress_bar(len(options.matrices) * model.n_layers, "decompose", "matrix", progress)
        with bar:
            types = [decompose_type(model, matrix, options, parent, scratch, lambda: bar.update(1))
                     for matrix in options.matrices]
        if all(r.rank == WHOLE for t in types for r in t.results):
            raise DeltaError("nothing to gain: at this rank or error target no matrix gets smaller than it is "
                             "(see 'pyllamaopt delta report' for the ranks each error needs)")
        tensors, layers = _plan_tensors(model, types)
        offsets = data_offsets(tensors, model.file.alignment)
        header = _header(model, parent, options, types, layers, offsets)
        fields = header.fields()
        bar = progress_bar(offsets[-1], "write", "B", progress)
        with bar:
            size = write_gguf(output, model.architecture, fields[:1] + copied_fields(model) + fields[1:], tensors,
                              alignment=model.file.alignment, max_size=source.stat().st_size,
                              on_tensor=lambda t: bar.update(t.nbytes))

    layer_bytes = [LayerBytes(layer, header.layer_offsets[i], header.layer_sizes[i],
                              sum(t.n_bytes for t in layers[layer][1]))
                   for i, layer in enumerate(sorted(layers))]
    resident = offsets[-1] - sum(header.layer_sizes)
    return DecompositionReport(
        input=str(source), output=str(output), options=_options_json(options), input_bytes=source.stat().st_size,
        output_bytes=size, matrices=[r for t in types for r in t.results], bases=[b for t in types for b in t.bases],
        layers=layer_bytes, resident_bytes=resident, peak_rss_bytes=peak_rss_bytes(),
        peak_anonymous_bytes=memory.peak, seconds=time.perf_counter() - started)


def _plan_tensors(model: GGUFModel, types: list[TypeDecomposition]
                  ) -> tuple[list[OutTensor], dict[int, tuple[range, list[Tensor]]]]:
    """The output's tensors in order (outside the layers, bases, then layer by layer), and for
    each layer the span of its tensors in that list and its tensors in the input."""
    replaced = {matrix_name(layer, t.matrix): tensors for t in types for layer, tensors in t.delta_tensors.items()}
    by_layer: dict[int, list[Tensor]] = defaultdict(list)
    tensors: list[OutTensor] = []
    for t in model.file.tensors:
        layer = layer_of(t.name)
        if layer is None:
            tensors.append(OutTensor.copy_of(t))
        else:
            by_layer[layer].append(t)
    tensors += [b for t in types for b in t.base_tensors]
    layers = {}
    for layer in sorted(by_layer):
        start = len(tensors)
        for t in by_layer[layer]:
            tensors += replaced[t.name] if t.name in replaced else [OutTensor.copy_of(t)]
        layers[layer] = (range(start, len(tensors)), by_layer[layer])
    return tensors, layers


def _header(model: GGUFModel, parent: GGUFModel | None, options: DecomposeOptions, types: list[TypeDecomposition],
            layers: dict[int, tuple[range, list[Tensor]]], offsets: list[int]) -> DeltaHeader:
    spans = [layers[layer][0] for layer in sorted(layers)]
    return DeltaHeader(
        n_layers=model.n_layers, matrices=options.matrices, rank=options.rank or 0,
        target_error=options.target_error or 0.0, base_type=options.base_type,
        n_bases=0 if parent else options.n_bases,
        ranks={t.matrix: [r.rank for r in t.results] for t in types},
        bases={t.matrix: [r.base for r in t.results] for t in types},
        source_types={t.matrix: [int(gguf.GGMLQuantizationType[r.source_type]) for r in t.results] for t in types},
        errors={t.matrix: [r.rel_error for r in t.results] for t in types},
        layer_offsets=[offsets[span.start] for span in spans],
        layer_sizes=[offsets[span.stop] - offsets[span.start] for span in spans],
        parent=Parent(parent.path.name, str(parent.path.resolve()), parent.fingerprint(options.matrices))
        if parent else None)


def _options_json(options: DecomposeOptions) -> dict[str, object]:
    out = asdict(options)
    out["matrices"] = list(options.matrices)
    out["parent"] = str(options.parent) if options.parent else None
    return out
