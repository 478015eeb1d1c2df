"""The persistent KV cache on Gemma 3 270M (sliding-window layers included): a context saved by
one Context is restored by another one on a freshly loaded model, in full and as a prefix of a
longer prompt, with bitwise the logits and the greedy tokens of computing it from scratch."""
from __future__ import annotations

import numpy as np
import pytest

from pyllamaopt import Context, Model, OptConfig

from test_reuse_gemma import SYSTEM, TURNS

pytestmark = pytest.mark.integration


def scratch(model, tokens, kv_type):
    config = OptConfig(env={}, dedup_enabled=False, diff_enabled=False, kv_type=kv_type)
    with Context(model, n_ctx=4096, n_threads=2, config=config) as ctx:
        s = ctx.session()
        s.append(tokens)
        return s.logits(), [t.id for t in s.generate(16)]


def test_restored_context_equals_computing_it(gemma_path, tmp_path, kv_type):
    config = OptConfig(env={}, persist_enabled=True, persist_dir=str(tmp_path), kv_type=kv_type)
    saver = Model(gemma_path, progress=False)
    stored = saver.tokenize(SYSTEM + "".join(TURNS))
    assert len(stored) > 1024  # beyond the sliding window
    with Context(saver, n_ctx=4096, n_threads=2, config=config) as ctx:
        s = ctx.session()
        s.append(stored)
        assert s.save() == len(stored) // 64 * 64

    restarted = Model(gemma_path, progress=False)  # as after a restart: the model is hashed again
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
