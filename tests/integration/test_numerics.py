"""Re-derives, for this build and CPU, the rules of llama.cpp's batch-shape-dependent numerics
that the exactness contract stands on (../shared/DESIGN.md, docs/exactness.md). A new
llama.cpp or new CPU flags can change them; when one of these tests fails, the canonical
schedule (cpp/engine/context.cpp, numerics_granularity) and docs/exactness.md must change.

Gemma 3 270M, final logits compared bit for bit; the rules the canonical schedule's exactness
rests on also on each other model family and with the quantized KV cache types
(families.FAMILY_KV_TYPES: other architectures, weight types, shapes and K/V types take other
kernel paths). Raw llama.cpp behaviour is probed with the "llama" schedule,
where each append is computed as one chunk.
"""
from __future__ import annotations

import contextlib

import numpy as np
import pytest

from pyllamaopt import Context, OptConfig, build_info

from families import FAMILY_KV_TYPES, kv_options, pair_id

pytestmark = pytest.mark.integration

OFF = {"dedup_enabled": False, "diff_enabled": False}
ON = {"dedup_enabled": True, "diff_enabled": True}


def numerics_prompt(model) -> list[int]:
    text = " ".join(f"Line {i}: the value of item {i} is {i * 7 % 13}." for i in range(60))
    tokens = model.tokenize(text)[:512]
    assert len(tokens) == 512
    return tokens


@pytest.fixture(scope="module")
def prompt(gemma) -> list[int]:
    return numerics_prompt(gemma)


def logits_after(model, prompt, splits=(), *, flash_attn=True, n_threads=2, cells_before=0,
                 schedule="llama", config=OFF, kv_type="f16"):
    """Logits after `prompt`, appended in pieces cut at `splits`, in a session whose KV cells
    start after `cells_before` cells held by another session."""
    with Context(model, n_ctx=2048, n_batch=1024, n_threads=n_threads, flash_attn=flash_attn,
                 schedule=schedule, config=OptConfig(env={}, **kv_options(kv_type), **config)) as ctx:
        other = ctx.session()  # kept open: its cells stay taken
        if cells_before:
            other.append(model.tokenize("word " * cells_before, add_bos=False)[:cells_before])
        session = ctx.session()
        for start, stop in zip((0, *splits), (*splits, len(prompt))):
            session.append(prompt[start:stop])
        return session.logits()


def same(a, b) -> bool:
    return bool(np.array_equal(a, b))


@pytest.mark.parametrize("flash_attn", [True, False])
def test_thread_count_never_changes_a_bit(gemma, prompt, flash_attn):
    assert same(logits_after(gemma, prompt, n_threads=1, flash_attn=flash_attn),
                logits_after(gemma, prompt, n_threads=2, flash_attn=flash_attn))


@pytest.mark.parametrize("flash_attn,equal,different", [
    # (the chunk sizes that prefill the 512 tokens)
    (True, [(64,) * 8, (128, 384), (256, 256), (448, 64), (412, 100), (64, 384, 64)],
     [(496, 16), (480, 32), (449, 63), (447, 65), (256, 248, 8)]),
    (False, [(64,) * 8, (256, 256), (492, 20), (412, 100)],
     [(508, 4), (504, 8), (496, 16), (447, 65), (449, 63)]),
])
def test_which_chunkings_change_the_logits(gemma, prompt, flash_attn, equal, different):
    """With flash attention, a chunk of fewer than 64 tokens computes its rows differently;
    without, a chunk of up to 16 (computed like decode steps, patches/0006; upstream: fewer
    than 8). Chunk boundaries must be multiples of 4 either way."""
    reference = logits_after(gemma, prompt, flash_attn=flash_attn)
    for sizes in equal + different:
        splits = tuple(np.cumsum(sizes)[:-1])
        assert same(logits_after(gemma, prompt, splits, flash_attn=flash_attn), reference) == (sizes in equal), sizes


def f32_lanes() -> int:
    """Floats in one SIMD register of this build's widest vector extension."""
    return 16 if "AVX512 = 1" in str(build_info()["system_info"]) else 8


@pytest.mark.parametrize("flash_attn,aligned,misaligned", [
    (True, [64, 128, 512], [1, 16, 32, 96]),   # flash attention: cells must start 64-aligned
    # without: aligned to the vector width is enough (AVX-512: 16 cells, AVX2: 8); the
    # placement's 16 covers both
    (False, sorted({f32_lanes(), 16, 32, 48, 64}), [1, 4] + ([8] if f32_lanes() > 8 else [])),
])
def test_cache_position_of_a_session_matters_unless_aligned(gemma, prompt, flash_attn, aligned, misaligned):
    reference = logits_after(gemma, prompt, flash_attn=flash_attn)
    for cells_before in aligned + misaligned:
        equal = same(logits_after(gemma, prompt, flash_attn=flash_attn, cells_before=cells_before), reference)
        assert equal == (cells_before in aligned), f"{cells_before} cells before"


# (family, KV cache type) pairs with flash attention on and, for f16, off (a quantized V needs it)
FAMILY_KV_FLASH = [pytest.param(pair, flash_attn, id=f"{pair_id(pair)}-{'fa' if flash_attn else 'no-fa'}")
                   for pair in FAMILY_KV_TYPES for flash_attn in (True, False) if flash_attn or pair[1] == "f16"]


@pytest.mark.parametrize(("family_kv_path", "flash_attn"), FAMILY_KV_FLASH, indirect=["family_kv_path"])
def test_the_canonical_schedule_is_independent_of_history_and_placement(family_kv_model, flash_attn):
    """patches/0001 and the canonical schedule: however the history was appended and wherever
    other sessions' cells are, the logits are those of one llama.cpp chunk."""
    model, kv_type = family_kv_model
    prompt = numerics_prompt(model)
    reference = logits_after(model, prompt, flash_attn=flash_attn, kv_type=kv_type)
    for splits, cells_before in [((), 0), ((), 33), ((500,), 1), ((10, 20, 300, 510), 100), ((64, 128), 16)]:
        for config in (OFF, ON):
            assert same(logits_after(model, prompt, splits, flash_attn=flash_attn, cells_before=cells_before,
                                     schedule="canonical", config=config, kv_type=kv_type),
                        reference), (splits, cells_before, config)


def ggml_setting(name: str, value: int):
    """One of our ggml-cpu settings (patches/0003, 0006) set to `value` for a test."""
    import ctypes

    from pyllamaopt import _core

    lib = ctypes.CDLL(_core.__file__)
    saved = getattr(lib, f"ggml_cpu_get_{name}")()
    getattr(lib, f"ggml_cpu_set_{name}")(value)
    yield
    getattr(lib, f"ggml_cpu_set_{name}")(saved)


@pytest.fixture()
def upstream_decode_attention():
    """ggml's own split of a decode step's KV (patches/0003 off) for the duration of a test."""
    yield from ggml_setting("flash_attn_kv_tile", 0)


@pytest.fixture()
def upstream_q4_1_batches():
    """ggml's own path for Q4_1 batches beyond 16 rows (patches/0020 off): one vec_dot per output."""
    yield from ggml_setting("q4_1_rows", 0)


@pytest.fixture()
def upstream_small_batches():
    """ggml's own kernels for batches of 2-16 rows (patches/0006 off) for the duration of a test."""
    yield from ggml_setting("row_invariant_batch", 0)


def test_q4_1_batches_by_the_multi_row_kernel_give_upstreams_bits(smollm2_path, request):
    """patches/0020: SmolLM2's Q4_1 matrix products in batches beyond 16 rows unpack each weight
    block once for 16 rows (on in pyllamaopt) and give the bits of upstream's vec_dot per output:
    a prompt appended in three pieces, each one chunk, and in the canonical schedule's chunks."""
    from pyllamaopt import Model

    model = Model(smollm2_path, progress=False)
    prompt = numerics_prompt(model)

    def results() -> list:
        return [logits_after(model, prompt, (100, 300), schedule=schedule) for schedule in ("llama", "canonical")]

    ours = results()
    request.getfixturevalue("upstream_q4_1_batches")
    for got, expected in zip(ours, results()):
        assert same(got, expected)


def test_shared_kv_tiles_give_the_bits_of_upstreams_prefill_loop(gemma):
    """patches/0014 (flash attention's K/V tiles converted once for Gemma's four query heads) on a
    prompt of three chunks past the sliding window, with another session's cells below it."""
    text = " ".join(f"Row {i}: item {i * 31 % 97} costs {i * 7 % 13} units." for i in range(160))
    prompt = gemma.tokenize(text)[:1500]
    assert len(prompt) == 1500
    shared = logits_after(gemma, prompt, (600, 1100), cells_before=70, schedule="canonical")
    with contextlib.contextmanager(ggml_setting)("flash_attn_shared_kv_tiles", 0):
        upstream = logits_after(gemma, prompt, (600, 1100), cells_before=70, schedule="canonical")
    assert same(shared, upstream)


DECODE_SPLIT = (511,)  # the last token alone: one query over 512+ cells, the decode path
OTHER_CELLS = (64, 640, 1472)


def test_a_decode_step_does_not_depend_on_other_sessions_cells(family_kv_model):
    """patches/0003: the KV is reduced in fixed 64-cell tiles, whatever the cache holds (a
    quantized K: one row over the cells in order, docs/exactness.md)."""
    model, kv_type = family_kv_model
    prompt = numerics_prompt(model)
    reference = logits_after(model, prompt, DECODE_SPLIT, kv_type=kv_type)
    for cells_before in OTHER_CELLS:
        assert same(logits_after(model, prompt, DECODE_SPLIT, cells_before=cells_before, kv_type=kv_type),
                    reference), cells_before


def test_upstream_decode_attention_depends_on_other_sessions_cells(gemma, prompt, upstream_decode_attention):
    """Why patches/0003 exists: upstream splits the KV at n_kv / n_threads."""
    reference = logits_after(gemma, prompt, DECODE_SPLIT)
    assert not all(same(logits_after(gemma, prompt, DECODE_SPLIT, cells_before=n), reference) for n in OTHER_CELLS)


ROW_INVARIANT_BATCH = 16  # LLAMA_OPT_ROW_INVARIANT_BATCH


def steps_and_batch(model, prompt, n_rows, flash_attn=True, kv_type="f16"):
    """The logits after the prompt's last n_rows tokens decoded one by one, and in one batch."""
    head = len(prompt) - n_rows
    return (logits_after(model, prompt, tuple(range(head, len(prompt))), flash_attn=flash_attn, kv_type=kv_type),
            logits_after(model, prompt, (head,), flash_attn=flash_attn, kv_type=kv_type))


@pytest.mark.parametrize(("family_kv_path", "flash_attn"), FAMILY_KV_FLASH, indirect=["family_kv_path"])
@pytest.mark.parametrize("n_rows", [2, 3, 7, 8, 9, 16])
def test_a_small_batch_computes_each_row_like_a_decode_step(family_kv_model, n_rows, flash_attn):
    """patches/0006: what lets the memo check a draft in one batch exactly (and what makes a
    grammar's forced tokens computable in one batch with the next step)."""
    model, kv_type = family_kv_model
    steps, batch = steps_and_batch(model, numerics_prompt(model), n_rows, flash_attn, kv_type)
    assert same(steps, batch)


FAMILY_F16 = [pytest.param(pair, id=pair_id(pair)) for pair in FAMILY_KV_TYPES if pair[1] == "f16"]


@pytest.mark.parametrize("family_kv_path", FAMILY_F16, indirect=True)
@pytest.mark.parametrize("n_rows", [2, 3, 16])
def test_row_by_row_and_multi_row_kernels_give_the_same_bits(family_kv_model, n_rows):
    """patches/0019: methods/row-kernels picks, per weight type and row count, the path that is
    faster as the context runs, so decode steps and a small batch must give the same bits whichever
    path each took: row by row (row_kernels 0) or multi-row (1), tinyBLAS of one row included."""
    model, kv_type = family_kv_model
    prompt = numerics_prompt(model)
    head = len(prompt) - n_rows
    steps, batch = ({kernels: logits_after(model, prompt, splits, kv_type=kv_type, config={**OFF, "row_kernels": kernels})
                     for kernels in (0, 1)}
                    for splits in (tuple(range(head, len(prompt))), (head,)))
    assert same(steps[0], steps[1])
    assert same(batch[0], batch[1])
    assert same(steps[0], batch[1])


@pytest.mark.parametrize("n_rows", [2, 8, ROW_INVARIANT_BATCH + 1])
def test_larger_batches_and_upstream_small_batches_differ_from_decode_steps(gemma, prompt, n_rows, upstream_small_batches):
    """Why patches/0006 exists: upstream's batched kernels (tinyBLAS, the tiled K-quant kernel
    from 8 rows, repacked gemm from 4, multi-query attention) give other bits than one row."""
    steps, batch = steps_and_batch(gemma, prompt, n_rows)
    assert not same(steps, batch)


def test_batches_over_the_invariant_size_differ_from_decode_steps(gemma, prompt):
    steps, batch = steps_and_batch(gemma, prompt, ROW_INVARIANT_BATCH + 1)
    assert not same(steps, batch)
