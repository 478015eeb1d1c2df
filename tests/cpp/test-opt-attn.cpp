// methods/attn-score: host-side attention scores (001), the pruner's block statistics (000 §4.1)
// and the tool-result relevance scorer (000 §4.2).

#include "check.h"
#include "methods/attn-score.h"

#include <cmath>
#include <vector>

static bool near(float a, float b, float tol = 1e-3f) { return std::fabs(a - b) <= tol; }

// 001's toy example: 4 query heads, 2 KV heads, 3 keys, head_dim 2, one query at the last position
static void test_scores_of_the_specification_example() {
    llama_opt_attn_shape shape;
    shape.n_head = 4, shape.n_head_kv = 2, shape.head_dim = 2, shape.scale = 1.0f / std::sqrt(2.0f);
    const std::vector<float> k = { 1, 0, 1, 2,  0, 1, 0, 2,  1, 1, 2, 2 };  // [s][g][d]
    const std::vector<float> q = { 1, 0,  0, 1,  1, 1,  2, 1 };             // [h][d]
    const std::vector<llama_pos> k_pos = { 0, 1, 2 }, q_pos = { 2 };
    std::vector<float> scores(3, 0.0f);
    llama_opt_attn_accumulate(shape, q.data(), q_pos.data(), 1, k.data(), k_pos.data(), 3, scores.data());
    CHECK(near(scores[0], 0.401f) && near(scores[1], 0.401f) && near(scores[2], 0.768f));
}

static void test_causal_mask_and_mean_over_queries() {
    llama_opt_attn_shape shape;
    shape.n_head = 1, shape.n_head_kv = 1, shape.head_dim = 1, shape.scale = 1.0f;
    const std::vector<float> k = { 0, 0 }, q = { 0, 0 };
    const std::vector<llama_pos> k_pos = { 0, 1 }, q_pos = { 0, 1 };
    std::vector<float> scores(2, 0.0f);
    // query 0 sees key 0 only (1.0); query 1 sees both (0.5 each): means 0.75 and 0.25
    llama_opt_attn_accumulate(shape, q.data(), q_pos.data(), 2, k.data(), k_pos.data(), 2, scores.data());
    CHECK(near(scores[0], 0.75f) && near(scores[1], 0.25f));
}

static void test_pooling() {
    CHECK((llama_opt_attn_pool({ 1, 2, 3 }, 1) == std::vector<float>{ 1, 2, 3 }));
    const std::vector<float> p = llama_opt_attn_pool({ 0, 3, 0, 0 }, 3);
    CHECK(near(p[0], 1.5f) && near(p[1], 1.0f) && near(p[2], 1.0f) && near(p[3], 0.0f));
}

// 001's worked example end to end: importance [0.401, 0.401, 0.768], keep 1/2 -> tokens 0 and 2
static void test_speculative_prefill_of_the_specification_example() {
    llama_opt_attn_shape shape;
    shape.n_head = 4, shape.n_head_kv = 2, shape.head_dim = 2, shape.scale = 1.0f / std::sqrt(2.0f);
    const std::vector<float> k = { 1, 0, 1, 2,  0, 1, 0, 2,  1, 1, 2, 2 };  // [s][g][d]
    const std::vector<float> q = { 1, 0,  0, 1,  1, 1,  2, 1 };             // [h][d]
    const std::vector<float> importance = llama_opt_spec_importance(shape, { { q.data(), k.data() } }, 3, 1, 0, 1);
    CHECK(importance.size() == 3 && near(importance[0], 0.401f) && near(importance[1], 0.401f) &&
          near(importance[2], 0.768f));
    CHECK((llama_opt_spec_keep(importance, 0.5f) == std::vector<uint32_t>{ 0, 2 }));
    // two layers: the same one twice has the same mean; last1 of (zeros, example) is the example
    const std::vector<float> q0(q.size(), 0.0f);
    const auto twice = llama_opt_spec_importance(shape, { { q.data(), k.data() }, { q.data(), k.data() } }, 3, 1, 0, 1);
    CHECK(near(twice[0], 0.401f) && near(twice[2], 0.768f));
    const auto last1 = llama_opt_spec_importance(shape, { { q0.data(), k.data() }, { q.data(), k.data() } }, 3, 1, 1, 1);
    CHECK(near(last1[2], 0.768f));
    // all layers: zero queries attend uniformly (1/3), the mean with the example's
    const auto all = llama_opt_spec_importance(shape, { { q0.data(), k.data() }, { q.data(), k.data() } }, 3, 1, 0, 1);
    CHECK(near(all[2], (0.768f + 1.0f / 3) / 2));
    // pooled over 3: the means of the neighbours
    const auto pooled = llama_opt_spec_importance(shape, { { q.data(), k.data() } }, 3, 1, 0, 3);
    CHECK(near(pooled[0], (0.401f + 0.401f) / 2) && near(pooled[1], (0.401f + 0.401f + 0.768f) / 3));
    // a window of 2 queries: a zero query at position 1 sees keys 0 and 1 only (1/2 each), the
    // example's at position 2 all three; the mean of the two
    std::vector<float> q2(q0);
    q2.insert(q2.end(), q.begin(), q.end());
    const auto window = llama_opt_spec_importance(shape, { { q2.data(), k.data() } }, 3, 2, 0, 1);
    CHECK(near(window[0], (0.5f + 0.401f) / 2) && near(window[1], (0.5f + 0.401f) / 2) && near(window[2], 0.768f / 2));
}

static void test_speculative_prefill_keeps_the_top_fraction_and_the_last_token() {
    const std::vector<float> s = { 0.9f, 0.1f, 0.8f, 0.2f, 0.7f, 0.3f, 0.6f, 0.4f, 0.5f, 0.0f };
    CHECK((llama_opt_spec_keep(s, 0.3f) == std::vector<uint32_t>{ 0, 2, 9 }));  // ceil(3.0) = 3: two best + last
    CHECK((llama_opt_spec_keep(s, 0.31f) == std::vector<uint32_t>{ 0, 2, 4, 9 }));
    CHECK((llama_opt_spec_keep(s, 0.0f) == std::vector<uint32_t>{ 9 }));          // at least the last token
    CHECK(llama_opt_spec_keep(s, 1.0f).size() == 10);
    CHECK(llama_opt_spec_keep(std::vector<float>(700, 0.0f), 0.3f).size() == 210);  // 0.3f · 700 = 210.0000083
    CHECK((llama_opt_spec_keep({ 0.5f, 0.5f, 0.5f, 0.1f }, 0.5f) == std::vector<uint32_t>{ 0, 3 }));  // ties: earlier
    CHECK((llama_opt_spec_keep({ 0.1f, 0.9f }, 0.5f) == std::vector<uint32_t>{ 1 }));  // the last is also the best
    CHECK(llama_opt_spec_keep({}, 0.5f).empty());
    // a window: its tokens always kept, the rest of the budget by importance
    CHECK((llama_opt_spec_keep(s, 0.3f, 2) == std::vector<uint32_t>{ 0, 8, 9 }));
    CHECK((llama_opt_spec_keep(s, 0.3f, 5) == std::vector<uint32_t>{ 7, 8, 9 }));  // wider than the budget: its last
    CHECK(llama_opt_spec_keep(s, 1.0f, 20).size() == 10);
}

static void test_pruner_window_budget_and_guards() {
    llama_opt_attn_pruner pruner(0.01f, 2);
    pruner.update({ 0.5f, 0.001f, 0.2f, 0.002f, 0.3f });
    CHECK(pruner.eviction_candidates(1, 5, SIZE_MAX).empty());  // dead for one turn only
    pruner.update({ 0.5f, 0.001f, 0.2f, 0.002f, 0.3f });
    CHECK((pruner.eviction_candidates(1, 5, SIZE_MAX) == std::vector<uint32_t>{ 1, 3 }));
    CHECK((pruner.eviction_candidates(1, 3, SIZE_MAX) == std::vector<uint32_t>{ 1 }));  // block 3 guarded
    // a budget of 1 block in [1, 5): the dead ones, then the weakest of the rest
    CHECK((pruner.eviction_candidates(1, 5, 1) == std::vector<uint32_t>{ 1, 3, 2 }));
    pruner.set_evicted(1, true);
    pruner.update({ 0.5f, 0.9f, 0.2f, 0.5f, 0.3f });  // an evicted block's statistics do not change
    CHECK(pruner.blocks()[1].evicted && pruner.blocks()[1].consecutive_dead == 2);
    CHECK(pruner.blocks()[3].consecutive_dead == 0);  // attended again
    CHECK(pruner.eviction_candidates(1, 5, SIZE_MAX).empty());
    pruner.set_evicted(1, false);
    CHECK(!pruner.blocks()[1].evicted && pruner.blocks()[1].consecutive_dead == 0);
    pruner.truncate(2);
    CHECK(pruner.blocks().size() == 2);
}

static void test_sparse_scorer_keeps_the_relevant_span_and_the_edges() {
    llama_opt_sparse_params params;
    params.threshold = 0.5f, params.span = 4, params.keep_edges = 2;
    const llama_opt_sparse_scorer scorer(params, { 99 });
    // 16 tokens: filler 1..3 repeated, the span [8, 12) holds the query's tokens 40 and 41
    std::vector<llama_token> tool = { 1, 2, 3, 1, 2, 3, 1, 2, 40, 41, 3, 1, 2, 3, 1, 2 };
    const std::vector<llama_token> query = { 7, 40, 41 };
    const auto spans = scorer.score(tool.data(), (uint32_t) tool.size(), query.data(), (uint32_t) query.size());
    CHECK(spans.size() == 4 && spans[2].score >= 0.8f && spans[0].score < 0.5f);
    const auto drops = scorer.drops(spans, (uint32_t) tool.size());
    // spans 0, 1 and 3 fall below the threshold; the first and last 2 tokens stay
    CHECK(drops.size() == 2);
    CHECK(drops[0].start == 2 && drops[0].length == 6);
    CHECK(drops[1].start == 12 && drops[1].length == 2);
    // a structural cue (token 99) lifts a span
    tool[1] = 99;
    const auto cued = scorer.score(tool.data(), (uint32_t) tool.size(), query.data(), (uint32_t) query.size());
    CHECK(cued[0].score > spans[0].score);
}

static void test_sparse_budget_drops_the_weakest_first() {
    llama_opt_sparse_params params;
    params.threshold = 0.0f, params.span = 4, params.keep_edges = 0, params.budget = 0.5f;
    const llama_opt_sparse_scorer scorer(params);
    const std::vector<llama_opt_relevance_span> spans = {
        { 0, 4, 0.9f }, { 4, 4, 0.1f }, { 8, 4, 0.5f }, { 12, 4, 0.2f } };
    const auto drops = scorer.drops(spans, 16);
    CHECK(drops.size() == 2 && drops[0].start == 4 && drops[0].length == 4 && drops[1].start == 12);
}

int main() {
    test_scores_of_the_specification_example();
    test_causal_mask_and_mean_over_queries();
    test_pooling();
    test_speculative_prefill_of_the_specification_example();
    test_speculative_prefill_keeps_the_top_fraction_and_the_last_token();
    test_pruner_window_budget_and_guards();
    test_sparse_scorer_keeps_the_relevant_span_and_the_edges();
    test_sparse_budget_drops_the_weakest_first();
    return check_result("test-opt-attn");
}
