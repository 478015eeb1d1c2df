"""patches/0013 on Gemma 3 270M: in a canonical context the sliding-window layers attend over a view
of the KV cache that starts at the first cell a token of the batch can see (rounded down to 256
cells), not at cell 0, since llama.cpp's attention reads the mask of every cell it is given. Tested:
the views are that long (the K views in the operation profile), and every result is the same bits
as with llama.cpp's whole-cache view (`_set_swa_view(False)`), with flash attention and without,
and with the quantized KV cache types: prefill far beyond the window, another session's cells in
the cache, a shared prefix, decode steps."""
from __future__ import annotations

import random
import re

import numpy as np
import pytest

from pyllamaopt import Context, OptConfig

from families import kv_options

pytestmark = pytest.mark.integration


def random_tokens(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1000, 200000) for _ in range(n)]


def k_view_elements(ctx: Context) -> dict[int, int]:
    """Per layer, the K view's elements summed over the graphs the context computed."""
    elements = {}
    for row in ctx.op_profile():
        match = re.fullmatch(r"cache_k_l(\d+) \(view\) \(permuted\)", row["name"])
        if match:
            elements[int(match[1])] = row["elements"]
    return elements


def test_sliding_window_layers_read_only_the_cells_of_their_window(gemma):
    prompt = [gemma.bos_token] + random_tokens(1535, seed=1)  # three 512-token chunks
    elements = {}
    for on in (True, False):
        with Context(gemma, n_ctx=2048, n_batch=512, n_threads=1, profile="time") as ctx:
            ctx._core._set_swa_view(on)
            ctx.session().append(prompt)
            elements[on] = k_view_elements(ctx)
    assert len(elements[False]) == 18
    # whole cache: the chunks see 512, 1024 and 1536 cells; the third chunk's window (positions
    # 1024-1535, 512 back) starts at cell 512
    per_cell = elements[False][0] // (512 + 1024 + 1536)
    assert all(n == per_cell * 3072 for n in elements[False].values())
    swa_layers = {layer for layer, n in elements[True].items() if n == per_cell * (512 + 1024 + 1024)}
    full_layers = {layer for layer, n in elements[True].items() if n == per_cell * 3072}
    assert full_layers == {5, 11, 17}  # Gemma 3: every sixth layer attends to everything
    assert swa_layers == set(range(18)) - full_layers


def run(gemma, on: bool, flash_attn: bool, kv_type: str) -> list:
    """Logits after each step, and the generated tokens, of sessions that exercise the view."""
    out = []
    with Context(gemma, n_ctx=8192, n_threads=2, flash_attn=flash_attn,
                 config=OptConfig(env={}, **kv_options(kv_type))) as ctx:
        ctx._core._set_swa_view(on)
        other = ctx.session()  # its cells lie below the others'
        other.append([gemma.bos_token] + random_tokens(700, seed=2))
        long = ctx.session()
        history = [gemma.bos_token] + random_tokens(2999, seed=3)
        long.append(history[:1900])
        out.append(long.logits().copy())
        long.append(history[1900:])
        out.append(long.logits().copy())
        out.append([t.id for t in long.generate(48)])
        sharing = ctx.session()  # takes the long history's blocks, then diverges
        sharing.append(history[:2560] + random_tokens(200, seed=4))
        out.append(sharing.logits().copy())
        out.append([t.id for t in sharing.generate(16)])
        assert sharing.stats.dedup_tokens_saved >= 2048
    return out


# a quantized cache (kv_type) takes flash attention's one-row path over the view (docs/exactness.md)
@pytest.mark.parametrize("flash_attn,kv_type", [(True, "f16"), (False, "f16"), (True, "q8_0"), (True, "q4_0"),
                                               (True, "q8_0/q4_0")])
def test_the_window_view_gives_the_whole_cache_views_bits(gemma, flash_attn, kv_type):
    on, off = run(gemma, True, flash_attn, kv_type), run(gemma, False, flash_attn, kv_type)
    for got, expected in zip(on, off):
        if isinstance(got, np.ndarray):
            np.testing.assert_array_equal(got, expected)
        else:
            assert got == expected
