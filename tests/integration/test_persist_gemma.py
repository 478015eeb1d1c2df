"""The persistent KV cache on each model family and KV cache type (families.FAMILY_KV_TYPES;
Gemma 3's sliding-window layers included): a context saved by one Context is restored by another
one on a freshly loaded model, in full and as a prefix of a longer prompt, with bitwise the logits
and the greedy tokens of computing it from scratch with the same KV cache type."""
from __future__ import annotations

import numpy as np
import pytest

from pyllamaopt import Context, Model, OptConfig

from families import kv_options
from test_reuse_gemma import SYSTEM, TURNS, scratch

pytestmark = pytest.mark.integration


def test_restored_context_equals_computing_it(family_kv_path, tmp_path):
    path, kv_type = family_kv_path
    config = OptConfig(env={}, persist_enabled=True, persist_dir=str(tmp_path), **kv_options(kv_type))
    saver = Model(path, progress=False)
    stored = saver.tokenize(SYSTEM + "".join(TURNS))
    assert len(stored) > 1024  # beyond Gemma's sliding window
    with Context(saver, n_ctx=4096, n_threads=2, config=config) as ctx:
        # the formula (kv/kv-codec's memory_bytes) against the rows llama.cpp stores, as the disk tier measures them
        assert ctx.kv_bytes_per_token == ctx.persist_layout["bytes_per_token"]
        s = ctx.session()
        s.append(stored)
        assert s.save() == len(stored) // 64 * 64

    restarted = Model(path, progress=False)  # as after a restart: the model is hashed again
    longer = stored[:len(stored) - 200] + restarted.tokenize("User: And now the tests for mul, please.\nAgent:")
    for prompt in (stored, longer):
        expected_logits, expected_tokens = scratch(restarted, prompt, kv_type)
        with Context(restarted, n_ctx=4096, n_threads=2, config=config) as ctx:
            s = ctx.session()
            s.append(prompt)
            assert s.stats.persist_tokens_restored >= (len(stored) - 200 - 64) // 64 * 64 - 64
            assert s.stats.tokens_prefilled < 300
            np.testing.assert_array_equal(s.logits(), expected_logits)
            assert [t.id for t in s.generate(16)] == expected_tokens
