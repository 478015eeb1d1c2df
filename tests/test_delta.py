"""GGUF delta decomposition (pyllamaopt.delta) on tiny synthetic models: round trips within the
error asked for, rank selection, stored-whole fallback, k-means bases, a fine-tune recovered
against its parent, loading delta files with Model, bad input, interrupted runs."""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from pyllamaopt import Context, Model, ModelLoadError
from pyllamaopt.cli import main
from pyllamaopt.delta import DecomposeOptions, DeltaError, analyze, decompose, is_delta_file, reconstruct
from pyllamaopt.delta import svd as delta_svd
from pyllamaopt.delta.format import WHOLE
from pyllamaopt.delta.names import DEFAULT_MATRICES, matrix_name
from pyllamaopt.delta.reader import GGUFFile
from tinymodel import write_tiny_llama

N_LAYER = 4
FINETUNE_SPECTRUM = 0.3 * 0.5 ** np.arange(6)   # singular values of the fine-tune's change, ‖W‖ = 1
FINETUNE_RANK = len(FINETUNE_SPECTRUM)
UNTOUCHED = (3, "ffn_down")                     # the fine-tune leaves this matrix as the parent has it
SHARED_GROUPS = (0, 1, 0, 1)                    # layer -> its group in the shared-base model
SHARED_RANK = 2


def _orthonormal(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    return np.linalg.qr(rng.standard_normal((n, k)))[0]


def _rewrite(src: Path, dst: Path, weights: dict[str, np.ndarray]) -> Path:
    """A copy of the F32 model `src` with some tensors' values replaced (same shapes)."""
    shutil.copy(src, dst)
    reader = gguf.GGUFReader(dst, "r+")
    for t in reader.tensors:
        if t.name in weights:
            t.data[...] = weights[t.name]
    reader.data.flush()
    del reader
    return dst


def _weights(path: Path) -> dict[str, np.ndarray]:
    reader = gguf.GGUFReader(path)
    return {t.name: np.array(t.data) for t in reader.tensors}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """parent; finetune = parent + a change of known spectrum in every matrix but one;
    shared = layers that are one of two bases (interleaved 0,1,0,1) plus a rank-2 change in the
    attention matrices, and unrelated random FFN matrices."""
    d = tmp_path_factory.mktemp("delta-models")
    rng = np.random.default_rng(1)
    parent = write_tiny_llama(d / "parent.gguf", n_layer=N_LAYER)
    w = _weights(parent)

    finetune = {}
    for layer in range(N_LAYER):
        for m in DEFAULT_MATRICES:
            if (layer, m) == UNTOUCHED:
                continue
            name = matrix_name(layer, m)
            rows, cols = w[name].shape
            u, v = _orthonormal(rng, rows, FINETUNE_RANK), _orthonormal(rng, cols, FINETUNE_RANK)
            change = (u * FINETUNE_SPECTRUM) @ v.T
            finetune[name] = w[name] + change * np.linalg.norm(w[name])

    shared = {}
    for m in ("attn_q", "attn_k", "attn_v", "attn_output"):
        rows, cols = w[matrix_name(0, m)].shape
        bases = [rng.standard_normal((rows, cols)) / 8 for _ in range(2)]
        for layer, group in enumerate(SHARED_GROUPS):
            change = rng.standard_normal((rows, SHARED_RANK)) @ rng.standard_normal((SHARED_RANK, cols)) / 80
            shared[matrix_name(layer, m)] = bases[group] + change
    return {
        "parent": parent,
        "finetune": _rewrite(parent, d / "finetune.gguf", finetune),
        "shared": _rewrite(parent, d / "shared.gguf", shared),
    }


def _results(report, matrix=None):
    return [r for r in report.matrices if matrix is None or r.matrix == matrix]


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if ".tmp-" in p.name or ".scratch-" in p.name)


# decompose / reconstruct


def test_round_trip_within_the_reported_error(models, tmp_path):
    out = tmp_path / "shared.delta.gguf"
    options = DecomposeOptions(rank=8, n_bases=2, matrices=("attn_q", "attn_v", "ffn_up"))
    report = decompose(models["shared"], out, options)
    assert is_delta_file(out) and not is_delta_file(models["shared"])
    assert report.output_bytes == out.stat().st_size < report.input_bytes
    rebuilt = tmp_path / "rebuilt.gguf"
    reconstruct(out, rebuilt)

    original, back = _weights(models["shared"]), _weights(rebuilt)
    assert set(back) == set(original)
    for r in report.matrices:
        name = matrix_name(r.layer, r.matrix)
        error = np.linalg.norm(back[name] - original[name]) / np.linalg.norm(original[name])
        assert error == pytest.approx(r.rel_error, rel=1e-3, abs=1e-6)
    for name in original.keys() - {matrix_name(r.layer, r.matrix) for r in report.matrices}:
        assert np.array_equal(back[name], original[name]), name    # copied byte for byte
    # the attention matrices are base + rank 2: near exact; the FFN ones are random: far from it
    assert max(r.rel_error for r in _results(report, "attn_q")) < 2e-3
    assert max(r.rel_error for r in _results(report, "ffn_up")) > 0.3


def test_kmeans_finds_interleaved_groups(models, tmp_path):
    one = decompose(models["shared"], tmp_path / "k1.gguf", DecomposeOptions(rank=4, matrices=("attn_q",)))
    two = decompose(models["shared"], tmp_path / "k2.gguf", DecomposeOptions(rank=4, n_bases=2, matrices=("attn_q",)))
    # k-means starts from contiguous groups (0,1 | 2,3) and must move to the true ones (0,2 | 1,3)
    assert sorted(b.layers for b in two.bases) == [[0, 2], [1, 3]]
    assert [r.base for r in two.matrices] == [0 if i in two.bases[0].layers else 1 for i in range(N_LAYER)]
    assert max(r.rel_error for r in two.matrices) < 2e-3
    assert min(r.rel_error for r in one.matrices) > 0.3


def test_target_error_picks_the_smallest_rank(models, tmp_path):
    parent, finetune = _weights(models["parent"]), _weights(models["finetune"])
    for target in (0.05, 0.01):
        report = decompose(models["finetune"], tmp_path / f"t{target}.gguf",
                           DecomposeOptions(target_error=target, parent=models["parent"]))
        for r in report.matrices:
            if (r.layer, r.matrix) == UNTOUCHED:
                assert (r.rank, r.rel_error) == (0, 0.0)
                continue
            # the change's singular values are FINETUNE_SPECTRUM · ‖W_parent‖
            name = matrix_name(r.layer, r.matrix)
            tails = [np.sqrt(np.sum(FINETUNE_SPECTRUM[k:] ** 2)) * np.linalg.norm(parent[name])
                     for k in range(FINETUNE_RANK + 1)]
            expected = next(k for k, tail in enumerate(tails) if tail <= target * np.linalg.norm(finetune[name]))
            assert r.rank == expected, (r, target)
            assert r.rel_error <= target


def test_finetune_recovered_against_its_parent(models, tmp_path):
    out = tmp_path / "ft.delta.gguf"
    report = decompose(models["finetune"], out, DecomposeOptions(rank=FINETUNE_RANK, parent=models["parent"]))
    for r in report.matrices:
        expected_rank = 0 if (r.layer, r.matrix) == UNTOUCHED else FINETUNE_RANK
        assert r.rank == expected_rank and r.rel_error < 1e-3, r
    # what the ratio means: rank·(rows + cols) F16 values instead of rows·cols F32 ones
    for r in report.matrices:
        assert r.stored_bytes == r.rank * (r.rows + r.cols) * 2
    assert report.totals["decomposed_ratio"] < 0.3
    assert report.totals["ratio"] < 1
    rebuilt = tmp_path / "ft.rebuilt.gguf"
    reconstruct(out, rebuilt)
    _same_greedy_tokens(models["finetune"], rebuilt)


def _greedy(path: Path | str, prompt: str = "the capital of france is", n: int = 16) -> list[int]:
    model = Model(path)
    with Context(model, n_ctx=128, n_batch=64, n_seq_max=1, n_threads=1) as ctx:
        session = ctx.session()
        session.append_text(prompt)
        return [t.id for t in session.generate(n)]


def _same_greedy_tokens(a: Path | str, b: Path | str) -> None:
    assert _greedy(a) == _greedy(b)


def _small_model(path: Path, layers: dict[str, list[np.ndarray]]) -> Path:
    """A llama GGUF of just these layer matrices (no vocabulary: not loadable, but decomposable)."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(len(next(iter(layers.values()))))
    for matrix, arrays in layers.items():
        for layer, array in enumerate(arrays):
            writer.add_tensor(matrix_name(layer, matrix), array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _random_f16(rng: np.random.Generator, n: int = 4, size: int = 64) -> list[np.ndarray]:
    return [rng.standard_normal((size, size)).astype(np.float16) for _ in range(n)]


def _low_rank(rng: np.random.Generator, size: int = 64, rank: int = 2) -> np.ndarray:
    return rng.standard_normal((size, rank)) @ rng.standard_normal((rank, size)) / 8


# F16 matrices, as in real models: the F16 factors of a 64 x 64 delta cost as much as the
# matrix at rank 32, so a full-rank residual is stored whole


def test_stored_whole_when_a_delta_would_not_be_smaller(tmp_path):
    rng = np.random.default_rng(0)
    parent = _random_f16(rng)
    child = [(p + _low_rank(rng)).astype(np.float16) for p in parent[:3]] + _random_f16(rng, 1)
    parent_path = _small_model(tmp_path / "parent.gguf", {"attn_q": parent})
    child_path = _small_model(tmp_path / "child.gguf", {"attn_q": child})
    out = tmp_path / "child.delta.gguf"
    report = decompose(child_path, out, DecomposeOptions(target_error=0.01, matrices=("attn_q",), parent=parent_path))
    assert [r.rank for r in report.matrices] == [2, 2, 2, WHOLE]
    assert max(r.rel_error for r in report.matrices) <= 0.01
    assert report.matrices[3].stored_bytes == report.matrices[3].source_bytes
    assert report.output_bytes <= report.input_bytes
    reconstruct(out, tmp_path / "rebuilt.gguf")
    assert np.array_equal(_weights(tmp_path / "rebuilt.gguf")[matrix_name(3, "attn_q")], child[3])


def test_a_base_that_does_not_pay_is_dropped(tmp_path):
    rng = np.random.default_rng(0)
    base = rng.standard_normal((64, 64))
    shared = [(base + _low_rank(rng)).astype(np.float16) for _ in range(4)]
    source = _small_model(tmp_path / "m.gguf", {"attn_q": shared, "attn_k": _random_f16(rng)})
    report = decompose(source, tmp_path / "d.gguf", DecomposeOptions(target_error=0.01, matrices=("attn_q", "attn_k")))
    assert all(r.rank == 8 and r.rel_error <= 0.01 for r in _results(report, "attn_q"))   # 4 layers of rank 2
    assert all(r.rank == WHOLE for r in _results(report, "attn_k"))
    assert [(b.matrix, b.kept) for b in report.bases] == [("attn_q", True), ("attn_k", False)]
    assert report.output_bytes <= report.input_bytes


def test_nothing_to_gain_writes_nothing(tmp_path):
    source = _small_model(tmp_path / "f16.gguf", {"attn_q": _random_f16(np.random.default_rng(0))})
    out = tmp_path / "none.gguf"
    with pytest.raises(DeltaError, match="nothing to gain"):
        decompose(source, out, DecomposeOptions(target_error=0.01, matrices=("attn_q",)))
    assert not out.exists() and _leftovers(tmp_path) == []


def test_model_loads_a_delta_file_directly(models, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    out = tmp_path / "ft.delta.gguf"
    decompose(models["finetune"], out, DecomposeOptions(rank=FINETUNE_RANK, parent=models["parent"]))
    model = Model(out)
    cached = Path(model.path)
    assert cached.parent == tmp_path / "cache" / "pyllamaopt" / "delta" and not is_delta_file(cached)
    _same_greedy_tokens(models["finetune"], out)
    # the second load finds the rebuilt file instead of rebuilding it
    monkeypatch.setattr("pyllamaopt.delta.reconstruction.reconstruct", lambda *a, **k: pytest.fail("rebuilt twice"))
    assert Model(out).path == str(cached)


def test_a_rebuilt_model_cut_short_is_rebuilt(models, tmp_path, monkeypatch):
    """A cached rebuild that a crash or a full disk cut short is built again, not loaded (every later
    load failed with llama.cpp's "data is not within the file bounds" until the user found it)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    out = tmp_path / "ft.delta.gguf"
    decompose(models["finetune"], out, DecomposeOptions(rank=FINETUNE_RANK, parent=models["parent"]))
    cached = Path(Model(out).path)
    whole = cached.read_bytes()
    for cut in (len(whole) // 2, 0):
        cached.write_bytes(whole[:cut])
        assert Model(out).path == str(cached) and cached.read_bytes() == whole


def test_a_damaged_delta_file_is_a_delta_error(models, tmp_path):
    """A delta file whose header and tensors disagree (a tensor missing, a base index out of range)
    is a DeltaError naming the file (a KeyError before); a GGUF with alignment 0 is not readable."""
    from pyllamaopt.delta.format import copied_fields
    from pyllamaopt.delta.names import PREFIX
    from pyllamaopt.delta.source import GGUFModel
    from pyllamaopt.delta.writer import OutTensor, write_gguf

    out = tmp_path / "shared.delta.gguf"
    decompose(models["shared"], out, DecomposeOptions(rank=2, n_bases=2, matrices=("attn_q",)))
    delta = GGUFModel(out)
    fields = [f for f in copied_fields(delta)]
    kinds = {}
    kinds["missing"] = (fields, [OutTensor.copy_of(t) for t in delta.file.tensors if not t.name.startswith("base.0.")])
    bases = [(k, [7] * len(v), t, it) if k == PREFIX + "attn_q.bases" else (k, v, t, it) for k, v, t, it in fields]
    kinds["index"] = (bases, [OutTensor.copy_of(t) for t in delta.file.tensors])
    for name, (metadata, tensors) in kinds.items():
        damaged = tmp_path / f"{name}.delta.gguf"
        write_gguf(damaged, delta.architecture, metadata, tensors, alignment=delta.file.alignment)
        with pytest.raises(DeltaError, match=str(damaged)):
            reconstruct(damaged, tmp_path / f"{name}.gguf")
    aligned = [f for f in fields if f[0] != "general.alignment"] + [("general.alignment", 0, gguf.GGUFValueType.UINT32, None)]
    zero = tmp_path / "zero.gguf"
    write_gguf(zero, delta.architecture, aligned, [OutTensor.copy_of(t) for t in delta.file.tensors])
    with pytest.raises(DeltaError, match="not a power of two"):
        GGUFModel(zero)


def test_model_reports_a_delta_whose_parent_is_gone(models, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    parent = Path(shutil.copy(models["parent"], tmp_path / "parent.gguf"))
    out = tmp_path / "ft.delta.gguf"
    decompose(models["finetune"], out, DecomposeOptions(rank=FINETUNE_RANK, matrices=("attn_q",), parent=parent))
    parent.unlink()
    with pytest.raises(ModelLoadError, match=r"give its path \(pyllamaopt delta reconstruct DELTA OUT --parent PATH"):
        Model(out)
    assert not any((tmp_path / "cache" / "pyllamaopt" / "delta").iterdir())


def test_reconstruct_checks_the_parent(models, tmp_path):
    out = tmp_path / "ft.delta.gguf"
    decompose(models["finetune"], out, DecomposeOptions(rank=2, matrices=("attn_q",), parent=models["parent"]))
    with pytest.raises(DeltaError, match="is not the parent"):
        reconstruct(out, tmp_path / "r.gguf", parent=models["shared"])
    reconstruct(out, tmp_path / "r.gguf", parent=shutil.copy(models["parent"], tmp_path / "moved.gguf"))
    assert (tmp_path / "r.gguf").is_file()


def test_report_curves(models):
    curves = analyze(models["finetune"], matrices=("attn_q", "ffn_down"), ranks=(2, 6, 64), target_errors=(0.05,),
                     parent=models["parent"])
    q = curves.summary["attn_q"]
    assert q["at_rank"][6]["max"] < 1e-5 < q["at_rank"][2]["min"]
    assert q["at_rank"][64]["max"] < 1e-6            # the matrix's full rank: exact
    assert curves.summary["ffn_down"]["at_target"][0.05]["ranks"][UNTOUCHED[0]] == 0
    assert "attn_q" in curves.table()
    json.dumps(curves.to_json())


def test_randomized_svd_matches_the_exact_one(monkeypatch):
    rng = np.random.default_rng(0)
    matrix = (rng.standard_normal((300, 20)) * 2.0 ** -np.arange(20)) @ rng.standard_normal((20, 400))
    matrix = (matrix + 1e-4 * rng.standard_normal(matrix.shape)).astype(np.float32)
    exact = delta_svd.truncated_svd(matrix, 8)
    monkeypatch.setattr(delta_svd, "EXACT_SVD_MAX_DIM", 16)
    randomized = delta_svd.truncated_svd(matrix, 8)
    np.testing.assert_allclose(randomized.s, exact.s, rtol=1e-3)
    np.testing.assert_allclose(randomized.tail_sq, exact.tail_sq, rtol=1e-2, atol=1e-6 * exact.tail_sq[0])


def test_reader_reads_what_gguf_py_reads(models, tmp_path):
    q8 = gguf.quants.quantize(np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32),
                              gguf.GGMLQuantizationType.Q8_0)
    writer = gguf.GGUFWriter(str(tmp_path / "q8.gguf"), "llama")
    writer.add_tensor("q8", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    for path in (models["parent"], tmp_path / "q8.gguf"):
        ours, theirs = GGUFFile(path), gguf.GGUFReader(path)
        assert {k: f.value for k, f in ours.fields.items()} == {
            k: f.contents() for k, f in theirs.fields.items() if not k.startswith("GGUF.")}
        assert [(t.name, t.tensor_type, t.n_bytes) for t in ours.tensors] == [
            (t.name, t.tensor_type, t.n_bytes) for t in theirs.tensors]
        for a, b in zip(ours.tensors, theirs.tensors, strict=True):
            assert a.data.dtype == b.data.dtype and np.array_equal(a.data, b.data)


# bad input: a clear error, and nothing written


@pytest.mark.parametrize("case, options, match", [
    ("not gguf", DecomposeOptions(rank=4), "not a readable GGUF"),
    ("truncated", DecomposeOptions(rank=4), "not a readable GGUF|truncated"),
    ("missing", DecomposeOptions(rank=4), "no such file"),
    ("int32", DecomposeOptions(rank=4, matrices=("attn_q",)), "I32, which gguf-py cannot dequantize"),
    ("attn_q only", DecomposeOptions(rank=4), "has no tensor blk.0.attn_k.weight"),
    ("tiny", DecomposeOptions(rank=4, matrices=("attn_qkv",)), "has no tensor blk.0.attn_qkv.weight.*--matrices"),
    ("tiny", DecomposeOptions(rank=0), "positive whole number"),
    ("tiny", DecomposeOptions(rank=-3), "positive whole number"),
    ("tiny", DecomposeOptions(rank=65), "larger than attn_q .64 x 64. allows: at most 64"),
    ("tiny", DecomposeOptions(rank=33, matrices=("attn_k",)), "at most 32"),
    ("tiny", DecomposeOptions(), "either a rank"),
    ("tiny", DecomposeOptions(rank=4, target_error=0.1), "either a rank"),
    ("tiny", DecomposeOptions(target_error=0), "between 0 and 1"),
    ("tiny", DecomposeOptions(target_error=1.5), "between 0 and 1"),
    ("tiny", DecomposeOptions(rank=4, n_bases=5), "more than the model's 4 layers"),
    ("tiny", DecomposeOptions(rank=4, n_bases=0), "--bases"),
    ("tiny", DecomposeOptions(rank=4, matrices=()), "--matrices"),
    ("tiny", DecomposeOptions(rank=4, base_type="Q4_K"), "--base-type"),
    ("narrow parent", DecomposeOptions(rank=4), "in the model but 32 x 32 in the parent"),
    ("short parent", DecomposeOptions(rank=4), "the parent has 2 layers, the model 4"),
    ("bases and parent", DecomposeOptions(rank=4, n_bases=2), "--bases does not apply"),
])
def test_bad_input(models, tmp_path, case, options, match):
    source = models["parent"]
    parent = None
    if case == "not gguf":
        source = tmp_path / "x.gguf"
        source.write_text("hello, not a model\n" * 100)
    elif case == "truncated":
        source = tmp_path / "x.gguf"
        source.write_bytes(models["parent"].read_bytes()[:300_000])
    elif case == "missing":
        source = tmp_path / "nope.gguf"
    elif case == "int32":
        source = _small_model(tmp_path / "x.gguf", {"attn_q": [np.ones((64, 64), dtype=np.int32)] * 2})
    elif case == "attn_q only":
        source = _small_model(tmp_path / "x.gguf", {"attn_q": _random_f16(np.random.default_rng(0))})
    elif case == "narrow parent":
        parent = write_tiny_llama(tmp_path / "p.gguf", n_layer=N_LAYER, n_embd=32)
    elif case == "short parent":
        parent = write_tiny_llama(tmp_path / "p.gguf", n_layer=2)
    elif case == "bases and parent":
        parent = models["parent"]
    if parent is not None:
        options = dataclasses.replace(options, parent=parent)
    out = tmp_path / "out.gguf"
    with pytest.raises(DeltaError, match=match):
        decompose(source, out, options)
    assert not out.exists() and _leftovers(tmp_path) == []


def test_bad_input_for_reconstruct_and_decompose(models, tmp_path):
    with pytest.raises(DeltaError, match="not a delta file"):
        reconstruct(models["parent"], tmp_path / "r.gguf")
    out = tmp_path / "d.gguf"
    decompose(models["shared"], out, DecomposeOptions(rank=2, matrices=("attn_q",)))
    with pytest.raises(DeltaError, match="already a delta file"):
        decompose(out, tmp_path / "dd.gguf", DecomposeOptions(rank=2))
    with pytest.raises(DeltaError, match="not made against a parent"):
        reconstruct(out, tmp_path / "r.gguf", parent=models["parent"])
    with pytest.raises(DeltaError, match="would overwrite"):
        decompose(models["shared"], models["shared"], DecomposeOptions(rank=2))
    with pytest.raises(DeltaError, match="output directory"):
        decompose(models["shared"], tmp_path / "no" / "d.gguf", DecomposeOptions(rank=2))
    assert not (tmp_path / "r.gguf").exists() and not (tmp_path / "dd.gguf").exists()


@pytest.mark.parametrize("exception", [KeyboardInterrupt, OSError])
def test_interrupted_run_leaves_no_output(models, tmp_path, monkeypatch, exception):
    out = tmp_path / "d.gguf"
    decompose(models["shared"], out, DecomposeOptions(rank=2, matrices=("attn_q",)))
    real = gguf.GGUFWriter.write_tensor_data
    calls = []

    def failing(self, tensor, *args, **kwargs):
        calls.append(1)
        if len(calls) == 5:
            raise exception("interrupted")
        return real(self, tensor, *args, **kwargs)

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensor_data", failing)
    with pytest.raises(exception):
        decompose(models["shared"], tmp_path / "d2.gguf", DecomposeOptions(rank=2))
    calls.clear()
    with pytest.raises(exception):
        reconstruct(out, tmp_path / "r.gguf")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.gguf"]


def test_is_delta_file_on_anything(tmp_path, tiny_model_path):
    (tmp_path / "text").write_text("GGUF but not really")
    assert not is_delta_file(tmp_path / "text")
    assert not is_delta_file(tmp_path / "missing")
    assert not is_delta_file(tiny_model_path)


# command line


def test_cli(models, tmp_path, capsys):
    out = tmp_path / "shared.delta.gguf"
    assert main(["delta", "decompose", str(models["shared"]), str(out), "--rank", "2", "--bases", "2",
                 "--matrices", "attn_q,attn_k"]) == 0
    table = capsys.readouterr().out
    assert "attn_q" in table and "streamed per layer" in table
    report = json.loads((tmp_path / "shared.delta.report.json").read_text())
    assert {m["matrix"] for m in report["matrices"]} == {"attn_q", "attn_k"}
    assert report["totals"]["ratio"] < 1 and report["peak_rss_bytes"] > 0
    assert main(["delta", "reconstruct", str(out), str(tmp_path / "r.gguf")]) == 0
    assert main(["delta", "report", str(models["shared"]), "--ranks", "2,4", "--matrices", "attn_q",
                 "--json", str(tmp_path / "curves.json")]) == 0
    assert json.loads((tmp_path / "curves.json").read_text())["ranks"] == [2, 4]

    assert main(["delta", "decompose", str(models["shared"]), str(tmp_path / "x.gguf"), "--rank", "0"]) == 2
    assert "pyllamaopt: error: --rank must be a positive" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["delta", "decompose", str(models["shared"]), str(tmp_path / "x.gguf"), "--rank", "2",
              "--target-error", "0.1"])
    assert not (tmp_path / "x.gguf").exists()


def test_the_cli_never_writes_over_its_inputs(models, tmp_path, capsys):
    """A report path that is the model (or the output, or a directory) is refused before any work:
    `decompose --report model.gguf` wrote its JSON over the model."""
    model = tmp_path / "model.gguf"
    model.write_bytes(models["shared"].read_bytes())
    before = model.read_bytes()
    out = tmp_path / "out.delta.gguf"
    common = ["--rank", "2", "--bases", "2", "--matrices", "attn_q"]
    for args in (["delta", "decompose", str(model), str(out), "--report", str(model), *common],
                 ["delta", "decompose", str(model), str(out), "--report", str(out), *common],
                 ["delta", "report", str(model), "--ranks", "2", "--matrices", "attn_q", "--json", str(model)],
                 ["delta", "decompose", str(model), str(tmp_path), *common]):
        assert main(args) == 2, args
        assert "pyllamaopt: error:" in capsys.readouterr().err
    assert model.read_bytes() == before and not out.exists()
    # each mistake named as it is (the report over the output said "would overwrite an input")
    assert main(["delta", "decompose", str(model), str(out), "--report", str(out), *common]) == 2
    assert "--report" in capsys.readouterr().err
    assert main(["delta", "report", str(model), "--target-errors", "2"]) == 2
    assert "target errors are relative errors between 0 and 1" in capsys.readouterr().err  # (named --target-error)
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    assert main(["delta", "decompose", str(text), str(out), *common]) == 2
    err = capsys.readouterr().err
    assert "does not start with 'GGUF'" in err and "unpack_from" not in err


def test_report_plot(models, tmp_path, capsys):
    png = tmp_path / "curves.png"
    code = main(["delta", "report", str(models["shared"]), "--ranks", "2", "--matrices", "attn_q", "--plot", str(png)])
    if importlib.util.find_spec("matplotlib") is None:   # not a dependency: a clear error, before the work
        assert code == 2 and "pip install matplotlib" in capsys.readouterr().err and not png.exists()
    else:
        assert code == 0 and png.read_bytes()[:4] == b"\x89PNG"


def test_importing_pyllamaopt_does_not_import_gguf(tmp_path):
    code = "import sys, pyllamaopt, pyllamaopt.cli; sys.exit('gguf' in sys.modules)"
    # outside the checkout, whose pyllamaopt/ (without the built _core) would shadow the installed one
    assert subprocess.run([sys.executable, "-c", code], cwd=tmp_path).returncode == 0
