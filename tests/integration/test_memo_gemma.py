"""memo on Gemma 3 270M: a model that copies from its context (a file quoted back) generates
the same tokens, with bitwise the same logits, whether drafts of earlier output are checked in
one batch or every token takes its own decode step."""
from __future__ import annotations

import numpy as np
import pytest

from pyllamaopt import Context, OptConfig

pytestmark = pytest.mark.integration

SOURCE = "\n".join(f"def f{i}(x):\n    return x * {i} + {i % 7}\n" for i in range(12))


def generate(gemma, memo, **sampling):
    prompt = gemma.tokenize("<start_of_turn>user\nRepeat this file exactly:\n" + SOURCE +
                            "<end_of_turn>\n<start_of_turn>model\n", special=True)
    with Context(gemma, n_ctx=2048, n_threads=2, config=OptConfig(env={}, memo_enabled=memo)) as ctx:
        s = ctx.session()
        s.append(prompt)
        tokens = [t.id for t in s.generate(96, **sampling)]
        return tokens, s.logits(), s.stats


@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.7, "seed": 5}])
def test_memo_is_exact_on_gemma(gemma, sampling):
    tokens_off, logits_off, stats_off = generate(gemma, False, **sampling)
    tokens_on, logits_on, stats_on = generate(gemma, True, **sampling)
    assert tokens_on == tokens_off
    np.testing.assert_array_equal(logits_on, logits_off)
    assert stats_on.memo_tokens_skipped > len(tokens_on) // 4  # it copies: most drafts hold
    assert stats_on.forward_passes < stats_off.forward_passes
