"""kv-cache-diff through the bindings, against difflib as the reference diff."""
from __future__ import annotations

import difflib

from hypothesis import given, settings
from hypothesis import strategies as st

from pyllamaopt import _core

tokens = st.lists(st.integers(0, 40), max_size=400)  # a small alphabet: many accidental matches


def apply(prev, curr, spans):
    """Rebuild curr from prev and the spans, checking that they tile both histories."""
    out, p, c = [], 0, 0
    for op, ps, pl, cs, cl in spans:
        assert (ps, cs) == (p, c)
        if op == "keep":
            assert pl == cl and prev[ps:ps + pl] == curr[cs:cs + cl]
            out += prev[ps:ps + pl]
        else:
            assert (op == "insert") == (pl == 0) and (op == "delete") == (cl == 0)
            out += curr[cs:cs + cl]
        p, c = p + pl, c + cl
    assert (p, c) == (len(prev), len(curr))
    return out


@given(tokens, tokens, st.integers(1, 16))
def test_spans_rebuild_the_new_history(prev, curr, block_size):
    assert apply(prev, curr, _core.DiffEngine(block_size).compute(prev, curr)) == curr


@given(tokens, st.data())
@settings(max_examples=300)
def test_one_edit_keeps_everything_else_like_difflib(prev, data):
    at = data.draw(st.integers(0, len(prev)))
    removed = data.draw(st.integers(0, len(prev) - at))
    inserted = data.draw(st.lists(st.integers(100, 140), max_size=30))  # never equal to what it replaces
    curr = prev[:at] + inserted + prev[at + removed:]
    spans = _core.DiffEngine(8).compute(prev, curr)
    kept = sum(pl for op, _, pl, _, _ in spans if op == "keep")
    reference = sum(b.size for b in difflib.SequenceMatcher(None, prev, curr, autojunk=False).get_matching_blocks())
    assert kept == len(prev) - removed  # optimal
    assert kept >= reference            # difflib is not always optimal: [0,0,0] -> [0,100,0,0] keeps 2


@given(st.lists(st.integers(0, 10**6), min_size=200, max_size=2000), st.data())
@settings(max_examples=100)
def test_several_edits_keep_most_of_what_difflib_keeps(prev, data):
    curr = list(prev)
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(curr)))
        removed = data.draw(st.integers(0, min(20, len(curr) - at)))
        curr[at:at + removed] = data.draw(st.lists(st.integers(0, 10**6), max_size=20))
    spans = _core.DiffEngine(16).compute(prev, curr)
    assert apply(prev, curr, spans) == curr
    kept = sum(pl for op, _, pl, _, _ in spans if op == "keep")
    reference = sum(b.size for b in difflib.SequenceMatcher(None, prev, curr, autojunk=False).get_matching_blocks())
    assert kept >= reference - 4 * 2 * 16  # at most two blocks lost around each edit


@given(st.lists(st.integers(0, 10**6), min_size=100, max_size=600), st.data())
@settings(max_examples=100)
def test_a_passage_quoted_again_further_on_keeps_what_difflib_keeps(passage, data):
    """A workspace file edited near the start while its new version is already quoted further on
    (read back by a tool): a block after the edit matches the quote too, and the match must not
    jump there and lose the rest of the file and what follows it."""
    at = data.draw(st.integers(0, len(passage)))
    edited = list(passage)
    edited[at:at + data.draw(st.integers(0, 10))] = data.draw(st.lists(st.integers(10**6 + 1, 2 * 10**6),
                                                                        min_size=1, max_size=20))
    other = st.lists(st.integers(0, 10**6), min_size=1, max_size=300)
    head, middle, tail = data.draw(other), data.draw(other), data.draw(other)
    prev = head + passage + middle + edited + tail
    curr = head + edited + middle + edited + tail + [2 * 10**6 + 1]  # a new message: no common suffix
    spans = _core.DiffEngine(16).compute(prev, curr)
    assert apply(prev, curr, spans) == curr
    kept = sum(pl for op, _, pl, _, _ in spans if op == "keep")
    reference = sum(b.size for b in difflib.SequenceMatcher(None, prev, curr, autojunk=False).get_matching_blocks())
    assert kept >= reference - 2 * 16


def test_the_common_case_is_linear():
    engine = _core.DiffEngine(64)
    for n in (10_000, 100_000):
        prev = list(range(n))
        engine.compute(prev, prev + [1, 2, 3])
        assert engine.last_work <= 2 * n
        edited = list(prev)
        edited[n // 3] = -5
        engine.compute(prev, edited)
        assert engine.last_work <= 2 * n
