"""context-hash through the bindings: fixed vectors against an independent reference, and
properties (incremental == one-shot, segmentation covers every token once, chain = prefix)."""
from __future__ import annotations

import struct

from hypothesis import given
from hypothesis import strategies as st

from pyllamaopt import _core

token_lists = st.lists(st.integers(min_value=0, max_value=2**31 - 1), max_size=300)


def reference_fnv1a(data: bytes, state: int = 0xCBF29CE484222325) -> int:
    for byte in data:
        state = ((state ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return state


def as_bytes(tokens: list[int]) -> bytes:
    return b"".join(struct.pack("<I", t & 0xFFFFFFFF) for t in tokens)


def test_fixed_vectors():
    # the same constants as tests/cpp/test-opt-context-hash.cpp: every platform agrees
    assert _core.hash_block([]) == 0xCBF29CE484222325
    assert _core.hash_block([0]) == 0x4D25767F9DCE13F5
    assert _core.hash_block([1, 2, 3]) == 0xFD1F0F4381EB0395
    assert _core.hash_block([262143, 2, 105]) == 0xF852E099C19E061B
    assert _core.hash_block_pos([1, 2, 3], 7) == 0xF26E7FF7C2E57CA2
    assert _core.hash_chain(0, [1, 2, 3]) == 0x973D59669A25A835


@given(token_lists)
def test_matches_reference_implementation(tokens):
    assert _core.hash_block(tokens) == reference_fnv1a(as_bytes(tokens))


@given(token_lists, st.data())
def test_incremental_equals_one_shot(tokens, data):
    cuts = sorted(data.draw(st.lists(st.integers(0, len(tokens)), max_size=10)))
    hasher = _core.Hasher()
    previous = 0
    for cut in cuts + [len(tokens)]:
        hasher.feed(tokens[previous:cut])
        previous = cut
    assert hasher.finalize() == _core.hash_block(tokens)


@given(token_lists, st.integers(1, 100))
def test_segmentation_covers_every_token_once(tokens, block_size):
    blocks = _core.segment(tokens, block_size)
    covered = [i for start, n, _, _ in blocks for i in range(start, start + n)]
    assert covered == list(range(len(tokens)))
    assert all(n == block_size for _, n, _, _ in blocks[:-1])
    chain = 0
    for start, n, block_hash, chain_hash in blocks:
        assert block_hash == _core.hash_block(tokens[start:start + n])  # partial block: its real size
        chain = _core.hash_chain(chain, tokens[start:start + n])
        assert chain_hash == chain


@given(token_lists, token_lists)
def test_chained_hash_names_the_whole_prefix(a, b):
    block_size = 16
    ha = [c for *_, c in _core.segment(a, block_size)]
    hb = [c for *_, c in _core.segment(b, block_size)]
    for i, (x, y) in enumerate(zip(ha, hb)):
        end = (i + 1) * block_size
        same_prefix = a[:end] == b[:end]
        assert (x == y) == same_prefix
