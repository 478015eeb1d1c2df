"""The delta GGUF format: metadata keys under ``pyllamaopt.delta.``, tensor names, the header.

A delta file is a GGUF file with all the metadata of the model it came from plus:

    pyllamaopt.delta.version             u32    FORMAT_VERSION (written right after general.architecture)
    pyllamaopt.delta.n_layers            u32
    pyllamaopt.delta.matrices            [str]  decomposed matrix types, e.g. attn_q, ffn_up
    pyllamaopt.delta.rank                i32    rank asked for (0: chosen per matrix by target_error)
    pyllamaopt.delta.target_error        f32    relative error asked for (0: a fixed rank)
    pyllamaopt.delta.base_type           str    ggml type of the stored bases, e.g. F16
    pyllamaopt.delta.delta_type          str    ggml type of the low-rank factors: F16
    pyllamaopt.delta.n_bases             u32    bases per matrix type (0 with a parent model)
    pyllamaopt.delta.<m>.ranks           [i32]  per layer: rank of the delta, -1 = stored whole
    pyllamaopt.delta.<m>.bases           [i32]  per layer: index of its base, -1 = none
    pyllamaopt.delta.<m>.source_types    [u32]  per layer: ggml type of the original matrix
    pyllamaopt.delta.<m>.errors          [f32]  per layer: ‖W − Ŵ‖/‖W‖ of what is stored
    pyllamaopt.delta.layer_offsets       [u64]  per layer: offset of its first tensor in the data section
    pyllamaopt.delta.layer_sizes         [u64]  per layer: bytes of its tensors (what streaming reads)
    pyllamaopt.delta.parent.name         str    with a parent model: its file name,
    pyllamaopt.delta.parent.path         str      its absolute path when decomposed,
    pyllamaopt.delta.parent.fingerprint  str      sha256 of its base matrices (checked before use)

Tensors: the model's tensors outside the layers first, then the bases ``base.<k>.<m>.weight``,
then layer by layer: the layer's own tensors, where a decomposed ``blk.<i>.<m>.weight`` is
replaced by ``blk.<i>.<m>.delta_u`` (rows x rank, U·√S) and ``blk.<i>.<m>.delta_v``
(rank x cols, √S·Vᵀ), or by nothing when its rank is 0 (the layer equals its base).
W = base + delta_u · delta_v.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import gguf

from ..errors import DeltaError
from .names import PREFIX, VERSION_KEY
from .source import GGUFModel
from .writer import Field

FORMAT_VERSION = 1
WHOLE = -1   # rank of a matrix stored whole
NO_BASE = -1
_T = gguf.GGUFValueType


@dataclass(frozen=True)
class Parent:
    name: str
    path: str
    fingerprint: str


@dataclass
class DeltaHeader:
    n_layers: int
    matrices: tuple[str, ...]
    rank: int
    target_error: float
    base_type: str
    n_bases: int
    ranks: dict[str, list[int]]
    bases: dict[str, list[int]]
    source_types: dict[str, list[int]]
    errors: dict[str, list[float]]
    layer_offsets: list[int] = field(default_factory=list)
    layer_sizes: list[int] = field(default_factory=list)
    parent: Parent | None = None
    delta_type: str = "F16"
    version: int = FORMAT_VERSION

    def fields(self) -> list[Field]:
        """(key, value, type, array item type) of every key, VERSION_KEY first."""
        out = [
            (VERSION_KEY, self.version, _T.UINT32, None),
            (PREFIX + "n_layers", self.n_layers, _T.UINT32, None),
            (PREFIX + "matrices", list(self.matrices), _T.ARRAY, _T.STRING),
            (PREFIX + "rank", self.rank, _T.INT32, None),
            (PREFIX + "target_error", self.target_error, _T.FLOAT32, None),
            (PREFIX + "base_type", self.base_type, _T.STRING, None),
            (PREFIX + "delta_type", self.delta_type, _T.STRING, None),
            (PREFIX + "n_bases", self.n_bases, _T.UINT32, None),
        ]
        for m in self.matrices:
            out += [(f"{PREFIX}{m}.ranks", self.ranks[m], _T.ARRAY, _T.INT32),
                    (f"{PREFIX}{m}.bases", self.bases[m], _T.ARRAY, _T.INT32),
                    (f"{PREFIX}{m}.source_types", self.source_types[m], _T.ARRAY, _T.UINT32),
                    (f"{PREFIX}{m}.errors", self.errors[m], _T.ARRAY, _T.FLOAT32)]
        out += [(PREFIX + "layer_offsets", self.layer_offsets, _T.ARRAY, _T.UINT64),
                (PREFIX + "layer_sizes", self.layer_sizes, _T.ARRAY, _T.UINT64)]
        if self.parent:
            out += [(PREFIX + "parent.name", self.parent.name, _T.STRING, None),
                    (PREFIX + "parent.path", self.parent.path, _T.STRING, None),
                    (PREFIX + "parent.fingerprint", self.parent.fingerprint, _T.STRING, None)]
        return out

    @classmethod
    def read(cls, model: GGUFModel) -> DeltaHeader:
        version = model.field(VERSION_KEY)
        if version is None:
            raise DeltaError(f"{model.path} is not a delta file (no {VERSION_KEY}); "
                             "make one with: pyllamaopt delta decompose")
        if version != FORMAT_VERSION:
            raise DeltaError(f"{model.path} is delta format version {version}; this pyllamaopt reads version "
                             f"{FORMAT_VERSION}: decompose the original model again")
        try:
            def get(key: str) -> Any:
                value = model.field(PREFIX + key)
                if value is None:
                    raise KeyError(key)
                return value

            matrices = tuple(get("matrices"))
            parent = None
            if model.field(PREFIX + "parent.fingerprint") is not None:
                parent = Parent(get("parent.name"), get("parent.path"), get("parent.fingerprint"))
            return cls(
                n_layers=get("n_layers"), matrices=matrices, rank=get("rank"), target_error=get("target_error"),
                base_type=get("base_type"), delta_type=get("delta_type"), n_bases=get("n_bases"),
                ranks={m: get(f"{m}.ranks") for m in matrices}, bases={m: get(f"{m}.bases") for m in matrices},
                source_types={m: get(f"{m}.source_types") for m in matrices},
                errors={m: get(f"{m}.errors") for m in matrices},
                layer_offsets=get("layer_offsets"), layer_sizes=get("layer_sizes"), parent=parent)
        except KeyError as exc:
            raise DeltaError(f"{model.path}: delta metadata {PREFIX}{exc.args[0]} is missing; the file is damaged, "
                             "decompose the original model again") from None


def copied_fields(model: GGUFModel) -> list[Field]:
    """The metadata of `model` as (key, value, type, item type), without general.architecture
    (the writer adds it) and our own delta keys."""
    out = []
    for key, f in model.file.fields.items():
        if key.startswith(PREFIX) or key == "general.architecture":
            continue
        if f.type == _T.ARRAY and not f.value:
            continue   # gguf-py cannot write an empty array; an absent key reads the same to llama.cpp
        out.append((key, f.value, f.type, f.item_type))
    return out
