"""Quantized KV caches on Gemma 3 270M (kv_type, issue 46): the bytes a token takes, in the cache
and on disk; the type is in effect (the logits change); the disk tier never restores an entry of
another type, and an f16 entry's identity is that of the builds before kv_type; the methods that
read K rows as F16 refuse a quantized cache. K and V of different types ("K/V",
kv_type_k / kv_type_v) take the bytes of each, are in effect and are entries of their own.
Reuse being exact relative to the same type is tested
by the exactness tests on (family, KV type) pairs (families.FAMILY_KV_TYPES, every pair with
PYLLAMAOPT_TESTS_EVERY_KV_PAIR=1: test_reuse_gemma.py,
test_persist_gemma.py, test_memo_gemma.py, test_numerics.py) and test_swa_view_gemma.py."""
from __future__ import annotations

import numpy as np
import pytest

from pyllamaopt import ConfigError, Context, OptConfig

from families import kv_options
from test_reuse_gemma import SYSTEM, TURNS

pytestmark = pytest.mark.integration

GGML_TYPES = {"f16": 1, "q8_0": 8, "q4_0": 2}
BYTES_PER_32_VALUES = {"f16": 64, "q8_0": 34, "q4_0": 18}  # a block of 32 values and its scale


def one_saved_entry(gemma, config, tmp_path, check_context) -> None:
    """A context of `config` (check_context(ctx) first) saves 256 tokens: one entry, of about 256 ×
    the context's bytes per token."""
    with Context(gemma, n_ctx=1024, n_threads=2, config=config) as ctx:
        check_context(ctx)
        s = ctx.session()
        s.append(gemma.tokenize(SYSTEM)[:256])
        assert s.save() == 256
        s.close()
    entries = list(tmp_path.glob("*.llkv"))
    assert len(entries) == 1 and entries[0].stat().st_size < 256 * ctx.kv_bytes_per_token * 1.1


@pytest.mark.parametrize("kv_type", ["q8_0", "q4_0"])
def test_a_quantized_cache_takes_its_types_bytes_in_memory_and_on_disk(gemma, tmp_path, kv_type):
    config = OptConfig(env={}, kv_type=kv_type, persist_enabled=True, persist_dir=str(tmp_path))

    def check_context(ctx):
        assert ctx.kv_type == kv_type
        assert ctx.kv_bytes_per_token * BYTES_PER_32_VALUES["f16"] == \
            gemma.kv_bytes_per_token * BYTES_PER_32_VALUES[kv_type]
        layout = ctx.persist_layout
        assert layout["k_type"] == layout["v_type"] == GGML_TYPES[kv_type]
        assert layout["bytes_per_token"] == ctx.kv_bytes_per_token  # the rows llama.cpp stores, as they are

    one_saved_entry(gemma, config, tmp_path, check_context)


def test_the_type_is_in_effect(gemma):
    prompt = gemma.tokenize(SYSTEM)[:512]
    logits = {}
    for kv_type in ("f16", "q8_0", "q4_0"):
        with Context(gemma, n_ctx=2048, n_threads=2, config=OptConfig(env={}, kv_type=kv_type)) as ctx:
            s = ctx.session()
            s.append(prompt)
            logits[kv_type] = s.logits()
    assert not np.array_equal(logits["q8_0"], logits["f16"])
    assert not np.array_equal(logits["q4_0"], logits["q8_0"])
    assert logits["q8_0"].argmax() == logits["f16"].argmax()


@pytest.mark.parametrize("saved,restored", [("q8_0", "f16"), ("f16", "q8_0"), ("q8_0", "q4_0"), ("q8_0/q4_0", "q8_0"),
                                            ("q8_0/q4_0", "q4_0/q8_0"), ("f16/q8_0", "f16"), ("q4_0", "f16/q4_0")])
def test_the_disk_tier_never_restores_another_types_entry(gemma, tmp_path, saved, restored):
    prompt = gemma.tokenize(SYSTEM)[:320]

    def run(kv_type, persist):
        config = OptConfig(env={}, persist_enabled=persist, persist_dir=str(tmp_path), **kv_options(kv_type))
        with Context(gemma, n_ctx=2048, n_threads=2, config=config) as ctx:
            s = ctx.session()
            s.append(prompt)
            stats = s.stats
            if persist:
                assert s.save() == len(prompt)
            return s.logits(), stats

    run(saved, persist=True)
    logits, stats = run(restored, persist=True)
    assert stats.persist_tokens_restored == 0 and stats.persist_misses_incompatible == 1
    assert stats.tokens_prefilled == len(prompt)
    np.testing.assert_array_equal(logits, run(restored, persist=False)[0])
    assert len(list(tmp_path.glob("*.llkv"))) == 2  # side by side, one per type
    for kv_type in (saved, restored):  # each type's entry restores into its own type
        assert run(kv_type, persist=True)[1].persist_tokens_restored >= len(prompt) - 64


def test_the_rotation_setting_is_in_a_quantized_entrys_identity_only(gemma, tmp_path, monkeypatch):
    """llama.cpp rotates a quantized K and V (a Hadamard transform) before storing them unless
    LLAMA_ATTN_ROT_DISABLE=1: the stored rows differ, so a quantized entry's compat hash records
    which. An f16 entry's identity takes nothing of kv_type: entries written before kv_type existed
    restore (checked against main's build: docs/persist-format.md)."""
    def compat_hash(kv_type):
        config = OptConfig(env={}, kv_type=kv_type, persist_enabled=True, persist_dir=str(tmp_path))
        with Context(gemma, n_ctx=256, n_threads=2, config=config) as ctx:
            return ctx.persist_layout["compat_hash"]

    rotated = {kv_type: compat_hash(kv_type) for kv_type in ("f16", "q8_0", "q4_0")}
    monkeypatch.setenv("LLAMA_ATTN_ROT_DISABLE", "1")
    plain = {kv_type: compat_hash(kv_type) for kv_type in ("f16", "q8_0", "q4_0")}
    assert plain["f16"] == rotated["f16"]
    assert plain["q8_0"] != rotated["q8_0"] and plain["q4_0"] != rotated["q4_0"]
    assert len(set(rotated.values())) == 3  # each type's entries are files of their own


@pytest.mark.parametrize("option", [{"attn_prune_enabled": True}, {"spec_prefill_enabled": True}, {"h2o_enabled": True}])
def test_attention_scores_refuse_a_quantized_cache(gemma, option):
    with pytest.raises(ConfigError, match="read the KV cache's K rows as F16: use kv_type='f16'"):
        Context(gemma, n_ctx=1024, n_threads=2, config=OptConfig(env={}, kv_type="q8_0", **option))


def test_shifted_reuse_refuses_q4_0_and_takes_q8_0(gemma):
    """Tier-2 shifted reuse moves K rows and rotates them as llama.cpp's K-shift does (dequantize,
    rotate, quantize): with q8_0 it stays close (test_reuse_gemma.py), with q4_0 it measured a
    KL of 0.11 on that test's edit, so the context refuses it."""
    with pytest.raises(ConfigError, match="diff_reuse_shifted with kv_type='q4_0' is refused.*use kv_type='q8_0'"):
        Context(gemma, n_ctx=1024, n_threads=2, config=OptConfig(env={}, kv_type="q4_0", diff_reuse_shifted=True))
    Context(gemma, n_ctx=1024, n_threads=2, config=OptConfig(env={}, kv_type="q8_0", diff_reuse_shifted=True)).close()


@pytest.mark.parametrize("kv_type", ["q8_0/q4_0", "f16/q8_0"])
def test_k_and_v_of_different_types_take_each_types_bytes_in_memory_and_on_disk(gemma, tmp_path, kv_type):
    k, v = kv_type.split("/")
    config = OptConfig(env={}, persist_enabled=True, persist_dir=str(tmp_path), **kv_options(kv_type))

    def check_context(ctx):
        assert (ctx.kv_type, ctx.kv_type_k, ctx.kv_type_v) == (kv_type, k, v)
        # Gemma 3 270M: K and V heads of 256 values each, so each is half of F16's bytes per token
        assert ctx.kv_bytes_per_token * 2 * BYTES_PER_32_VALUES["f16"] == \
            gemma.kv_bytes_per_token * (BYTES_PER_32_VALUES[k] + BYTES_PER_32_VALUES[v])
        layout = ctx.persist_layout
        assert (layout["k_type"], layout["v_type"]) == (GGML_TYPES[k], GGML_TYPES[v])
        assert layout["bytes_per_token"] == ctx.kv_bytes_per_token

    one_saved_entry(gemma, config, tmp_path, check_context)


def test_k_and_v_types_are_each_in_effect(gemma):
    """A pair's logits are neither its K type's nor its V type's: both parts are stored as set."""
    prompt = gemma.tokenize(SYSTEM)[:512]
    logits = {}
    for kv_type in ("f16", "q8_0", "q4_0", "q8_0/q4_0", "f16/q8_0"):
        with Context(gemma, n_ctx=2048, n_threads=2, config=OptConfig(env={}, **kv_options(kv_type))) as ctx:
            s = ctx.session()
            s.append(prompt)
            logits[kv_type] = s.logits()
    for pair in ("q8_0/q4_0", "f16/q8_0"):
        for one in pair.split("/"):
            assert not np.array_equal(logits[pair], logits[one]), (pair, one)
        assert logits[pair].argmax() == logits["f16"].argmax()


def test_a_pairs_identity_is_its_types_however_they_were_set(gemma, tmp_path):
    """kv_type_k / kv_type_v equal to each other give kv_type's entries (files written before they
    existed restore); a pair's entries are files of their own, K's type first."""
    def compat_hash(**options):
        config = OptConfig(env={}, persist_enabled=True, persist_dir=str(tmp_path), **options)
        with Context(gemma, n_ctx=256, n_threads=2, config=config) as ctx:
            return ctx.persist_layout["compat_hash"]

    assert compat_hash(kv_type_k="q8_0", kv_type_v="q8_0") == compat_hash(kv_type="q8_0")
    assert compat_hash(kv_type="f16", kv_type_k="f16") == compat_hash()
    assert compat_hash(kv_type="q4_0", kv_type_k="q8_0") == compat_hash(kv_type_k="q8_0", kv_type_v="q4_0")
    pairs = {compat_hash(**kv_options(kv_type)) for kv_type in ("q8_0", "q4_0", "q8_0/q4_0", "q4_0/q8_0", "f16/q8_0")}
    assert len(pairs) == 5


@pytest.mark.parametrize("options,setting", [({"kv_type_v": "q8_0"}, "kv_type_v"),
                                             ({"kv_type_k": "q4_0", "kv_type_v": "f16"}, "kv_type_k")])
def test_attention_scores_refuse_a_quantized_k_or_v_naming_its_setting(gemma, options, setting):
    with pytest.raises(ConfigError, match=f"read the KV cache's K rows as F16: use {setting}='f16'") as caught:
        Context(gemma, n_ctx=1024, n_threads=2, config=OptConfig(env={}, attn_prune_enabled=True, **options))
    assert caught.value.variable == setting


def test_shifted_reuse_refuses_a_q4_0_k_only(gemma):
    """llama.cpp's K-shift quantizes a moved K again; V rows move as they are stored: a q4_0 V is taken
    (its quality: test_reuse_gemma.py's Tier-2 test with q8_0/q4_0)."""
    with pytest.raises(ConfigError, match="diff_reuse_shifted with kv_type_k='q4_0' is refused.*use kv_type_k='q8_0'"):
        Context(gemma, n_ctx=1024, n_threads=2,
                config=OptConfig(env={}, kv_type_k="q4_0", kv_type_v="q8_0", diff_reuse_shifted=True))
    for options in ({"kv_type_k": "q8_0", "kv_type_v": "q4_0"}, {"kv_type": "q4_0", "kv_type_k": "f16"}):
        Context(gemma, n_ctx=1024, n_threads=2, config=OptConfig(env={}, diff_reuse_shifted=True, **options)).close()
