"""memo on Gemma 3 270M (and its exactness on each model family and KV cache type,
families.FAMILY_KV_TYPES): a model that copies from its context (a file quoted back) generates the
same tokens, with bitwise the same logits, whether drafts of earlier output are checked in one
batch or every token takes its own decode step. Every draft found is checked (memo_gate off: the
gate follows timings, and these tests count what drafting does), but in the test of the gate's cut
drafts."""
from __future__ import annotations

import numpy as np
import pytest

from pyllamaopt import Context, OptConfig

from families import greedy_everywhere_seeded_on_f16, kv_options

pytestmark = pytest.mark.integration

SOURCE = "\n".join(f"def f{i}(x):\n    return x * {i} + {i % 7}\n" for i in range(12))


TURN_MARKUP = {  # (before a user's message, after it up to the model's answer)
    "gemma": ("<start_of_turn>user\n", "<end_of_turn>\n<start_of_turn>model\n"),
    "chatml": ("<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n"),  # SmolLM2, Qwen2.5
}


def copy_prompt(model):
    before, after = TURN_MARKUP["chatml" if "<|im_start|>" in (model.chat_template or "") else "gemma"]
    return model.tokenize(before + "Repeat this file exactly:\n" + SOURCE + after, special=True)


def generate(model, memo, kv_type="f16", gate=False, **sampling):
    prompt = copy_prompt(model)
    config = OptConfig(env={}, memo_enabled=memo, memo_gate=gate, **kv_options(kv_type))
    with Context(model, n_ctx=2048, n_threads=2, config=config) as ctx:
        s = ctx.session()
        s.append(prompt)
        tokens = [t.id for t in s.generate(96, **sampling)]
        return tokens, s.logits(), s.stats, ctx.row_kernels()


@pytest.mark.parametrize(("family_kv_path", "sampling"), greedy_everywhere_seeded_on_f16({"temperature": 0.7, "seed": 5}),
                         indirect=["family_kv_path"])
def test_memo_is_exact(family_kv_model, sampling):
    model, kv_type = family_kv_model
    tokens_off, logits_off, stats_off, _ = generate(model, False, kv_type, **sampling)
    tokens_on, logits_on, stats_on, row_kernels = generate(model, True, kv_type, **sampling)
    assert tokens_on == tokens_off
    np.testing.assert_array_equal(logits_on, logits_off)
    # every drafted token confirmed saves its decode step, and some were
    assert stats_off.forward_passes - stats_on.forward_passes == stats_on.memo_tokens_skipped > 0
    if model.architecture == "gemma3":
        # Gemma copies the file: most drafts hold. (How much another model's sample copies depends on
        # the CPU's SIMD numerics: SmolLM2 at temperature 0.7 copies on an AVX-512 machine, and
        # writes prose with 18 of 96 tokens confirmed from drafts on an AVX2-only one.)
        assert stats_on.memo_tokens_skipped > len(tokens_on) // 4
    # the checks took both paths of a small batch (row_kernels 2, the default, tries each in turn)
    assert any(c["rows"] > 1 and c["multi_samples"] and c["one_samples"] for c in row_kernels), row_kernels


def test_drafts_the_gate_cuts_are_exact(family_model):
    """The gate (on by default) checks a prefix of each draft, as long as its rows pay on this
    machine, or none: whatever it cuts, the tokens and logits are plain decoding's. Its first draft
    is always checked (priced by its priors once a step is timed)."""
    tokens_off, logits_off, _, _ = generate(family_model, False)
    tokens_on, logits_on, stats_on, _ = generate(family_model, True, gate=True)
    assert tokens_on == tokens_off
    np.testing.assert_array_equal(logits_on, logits_off)
    assert stats_on.memo_hits >= 1


def generate_beside_a_cached_sequence(gemma, n_ctx, memo, stop):
    """A closed session's 448 tokens stay cached (7 blocks at cells 0-447); the copying session's
    prompt and 95 generated tokens then fill the 768 cells of a 768-token context. The output ends
    at a stop string, not at max_tokens: drafts stop at max_tokens (the turn's last token), so only
    an output that ends otherwise has drafts reaching past the cells its tokens use."""
    prompt = copy_prompt(gemma)
    with Context(gemma, n_ctx=n_ctx, n_threads=2, config=OptConfig(env={}, memo_enabled=memo, memo_gate=False)) as ctx:
        cached = ctx.session()
        cached.append(gemma.tokenize("word " * 500)[:448])
        cached.close()
        s = ctx.session()
        s.append(prompt)
        tokens = [t.id for t in s.generate(None, stop=[stop])]
        return tokens, s.stats, ctx.stats.dedup_sequences_evicted


def test_a_draft_never_evicts_other_sequences(gemma):
    """A draft's rows need cells beyond the next token's; with none free the step goes on as a
    plain decode step instead of evicting the cached sequence a plain step would not need."""
    with Context(gemma, n_ctx=2048, n_threads=2, config=OptConfig(env={}, memo_enabled=False)) as ctx:
        s = ctx.session()
        s.append(copy_prompt(gemma))
        text = s.generate_text(95)
    stop = text[-12:]  # the output's first 95 tokens end with it, and it occurs nowhere before
    assert text.find(stop) == len(text) - 12
    tokens_off, _, evicted_off = generate_beside_a_cached_sequence(gemma, 768, False, stop)
    tokens_on, stats_on, evicted_on = generate_beside_a_cached_sequence(gemma, 768, True, stop)
    _, stats_roomy, _ = generate_beside_a_cached_sequence(gemma, 1024, True, stop)
    assert len(tokens_on) == len(tokens_off) == 95
    assert tokens_on == tokens_off
    assert evicted_on == evicted_off == 0
    assert stats_roomy.memo_hits == stats_roomy.memo_lookups  # with room every draft is checked
    assert stats_on.memo_hits < stats_on.memo_lookups  # near the full end some could not be


def test_drafts_stop_at_the_end_of_the_context(gemma):
    """Drafts are cut to the positions left: generation fills a 256-token context and stops
    there, as without the memo."""
    prompt = copy_prompt(gemma)
    runs = []
    for memo in (False, True):
        with Context(gemma, n_ctx=256, n_threads=2, config=OptConfig(env={}, memo_enabled=memo, memo_gate=False)) as ctx:
            s = ctx.session()
            s.append(prompt)
            runs.append(([t.id for t in s.generate(60)], len(s.tokens), s.stats.memo_tokens_skipped))
    (tokens_off, n_off, _), (tokens_on, n_on, skipped_on) = runs
    assert tokens_on == tokens_off and n_on == n_off == 256
    assert skipped_on > 0
