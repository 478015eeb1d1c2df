"""The operation profile (cpp/engine/op-profile.h, Context(profile=...)): a diagnostic that sees
every node of ggml's graph through the eval callback, times it or examines its output, and
changes no bit of what the model computes."""
from __future__ import annotations

import numpy as np
import pytest

from pyllamaopt import Context, InvalidArgumentError, OptConfig


def run(model, tokens, profile, flash_attn=True):
    """One prompt and a few one-token steps (memo off: its draft batches would repeat rows too)."""
    with Context(model, n_ctx=512, n_batch=64, n_threads=1, flash_attn=flash_attn,
                 config=OptConfig(env={}, memo_enabled=False), profile=profile) as ctx:
        session = ctx.session()
        session.append(tokens)
        logits = session.logits().copy()
        generated = [t.id for t in session.generate(6)]
        return logits, generated, ctx.op_profile(), ctx.stats.forward_passes


def group(profile, op, name="", weight=""):
    return next(g for g in profile if g["op"] == op and g["name"].startswith(name) and g["weight"] == weight)


def test_the_profile_changes_no_bit(tiny_model):
    tokens = tiny_model.tokenize("the capital of france is paris and the code will return a value " * 6)
    plain_logits, plain_tokens, nothing, _ = run(tiny_model, tokens, None)
    assert nothing == []
    for profile in ("time", "facts"):
        logits, generated, _, _ = run(tiny_model, tokens, profile)
        assert np.array_equal(logits, plain_logits), profile
        assert generated == plain_tokens, profile


def test_time_mode_times_every_node_by_weight(tiny_model):
    tokens = tiny_model.tokenize("the capital of france is paris " * 8)
    _, _, profile, passes = run(tiny_model, tokens, "time")
    q = group(profile, "MUL_MAT", weight="blk.*.attn_q.weight")
    assert q["calls"] == tiny_model.n_layer * passes  # one per layer per forward pass
    assert q["ns"] > 0 and q["cpu_ns"] > 0 and q["elements"] > 0
    assert group(profile, "GET_ROWS", weight="token_embd.weight")["calls"] == passes
    assert all(g["rows"] == 0 for g in profile)  # facts are the other mode's


def test_facts_mode_finds_repeated_rows_and_the_one_hot_first_softmax_row(tiny_model):
    word = tiny_model.tokenize("paris", add_bos=False)[0]
    tokens = [tiny_model.bos_token] + [word] * 15  # one ubatch of 16
    _, _, profile, _ = run(tiny_model, tokens, "facts", flash_attn=False)
    embedding = group(profile, "GET_ROWS", weight="token_embd.weight")
    assert embedding["rows_dup"] == 14  # the repeated token's row, after its first occurrence
    layer_norm = group(profile, "MUL", name="attn_norm")
    assert layer_norm["rows_dup"] == 14  # only layer 0 sees the repeats: attention mixes positions in
    assert group(profile, "MUL_MAT", weight="blk.*.ffn_down.weight")["rows_dup"] == 0
    softmax = group(profile, "SOFT_MAX")
    # the first position attends to itself alone: one row per head and layer is exactly one-hot
    assert softmax["onehot_rows"] >= tiny_model.n_head * tiny_model.n_layer
    assert sum(g["rows_zero"] for g in profile) == 0


def test_facts_mode_counts_rows_seen_in_an_earlier_graph(tiny_model):
    tokens = tiny_model.tokenize("the capital of france is paris " * 4)
    with Context(tiny_model, n_ctx=512, n_batch=64, n_threads=1, config=OptConfig(env={}, dedup_enabled=False),
                 profile="facts") as ctx:
        for _ in range(2):  # the same prompt twice, from scratch: every row of the second pass was seen
            session = ctx.session()
            session.append(tokens)
            session.close()
        norm = group(ctx.op_profile(), "MUL", name="ffn_norm")
        assert norm["rows_seen"] == norm["rows"] // 2 > 0
        ctx.reset_op_profile()
        assert ctx.op_profile() == []


def test_bad_profile_requests_are_typed_errors(tiny_model):
    with pytest.raises(InvalidArgumentError, match="profile must be"):
        Context(tiny_model, n_ctx=256, n_batch=64, profile="fast")
    with pytest.raises(InvalidArgumentError, match="attn_prune_enabled"):
        Context(tiny_model, n_ctx=256, n_batch=64, profile="time",
                config=OptConfig(env={}, attn_prune_enabled=True))
