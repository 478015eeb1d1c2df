// methods/h2o: the host-side state of H2O chunked sparse prefill, against specification 004's
// verification metrics 1-11 (its timings are in bench-h2o.cpp, not here: a test does not time).

#include "check.h"
#include "methods/h2o.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <stdexcept>
#include <vector>

static llama_h2o_params params_of(uint32_t L, uint32_t H, uint32_t S) {
    llama_h2o_params p;
    p.local_window = L, p.heavy_budget = H, p.chunk_size = S;
    return p;
}

template <typename F> static bool throws_invalid(F f) {
    try {
        f();
    } catch (const std::invalid_argument &) {
        return true;
    } catch (const std::out_of_range &) {
        return true;
    } catch (const std::logic_error &) {
        return true;
    }
    return false;
}

// the valid (non-empty) slots of one head's memory set
static std::vector<int32_t> memory_of(const llama_h2o & h2o, uint32_t il, uint32_t head) {
    const uint32_t  m   = h2o.params().memory_size();
    const int32_t * mem = h2o.memory(il) + (size_t) head * m;
    std::vector<int32_t> out;
    for (uint32_t s = 0; s < m; ++s) {
        if (mem[s] != llama_h2o::EMPTY) {
            out.push_back(mem[s]);
        }
    }
    return out;
}

static void set_score(llama_h2o & h2o, uint32_t il, uint32_t head, uint32_t pos, float value) {
    h2o.scores(il)[(size_t) head * h2o.kv_size() + pos] = llama_h2o_fp32_to_bf16(value);
}

// Every index empty or a position below `end`, empties only at the end, valid ones strictly ascending.
static bool memory_well_formed(const llama_h2o & h2o, uint32_t end) {
    const uint32_t m = h2o.params().memory_size();
    for (uint32_t il = 0; il < h2o.n_layer(); ++il) {
        for (uint32_t h = 0; h < h2o.n_head(); ++h) {
            const int32_t * mem = h2o.memory(il) + (size_t) h * m;
            bool empty_seen = false;
            for (uint32_t s = 0; s < m; ++s) {
                if (mem[s] == llama_h2o::EMPTY) {
                    empty_seen = true;
                    continue;
                }
                if (empty_seen || mem[s] < 0 || (uint32_t) mem[s] >= end || (uint32_t) mem[s] >= h2o.kv_size() ||
                    (s > 0 && mem[s] <= mem[s - 1])) {
                    return false;
                }
            }
        }
    }
    return true;
}

static void test_bf16_conversion() {
    CHECK(llama_h2o_bf16_to_fp32(llama_h2o_fp32_to_bf16(1.0f)) == 1.0f);
    CHECK(llama_h2o_bf16_to_fp32(llama_h2o_fp32_to_bf16(-2.5f)) == -2.5f);
    // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: to the even one (1); just above it rounds up
    CHECK(llama_h2o_bf16_to_fp32(llama_h2o_fp32_to_bf16(1.0f + 1.0f / 256)) == 1.0f);
    CHECK(llama_h2o_bf16_to_fp32(llama_h2o_fp32_to_bf16(1.0f + 1.0f / 256 + 1.0f / 4096)) == 1.0f + 1.0f / 128);
    CHECK(std::isnan(llama_h2o_bf16_to_fp32(llama_h2o_fp32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
    CHECK(std::isinf(llama_h2o_bf16_to_fp32(llama_h2o_fp32_to_bf16(std::numeric_limits<float>::infinity()))));
}

static void test_parameters_are_checked() {
    CHECK(llama_h2o_check_params(params_of(256, 256, 1024)).empty());
    CHECK(llama_h2o_check_params(params_of(256, 256, 512)).empty());  // M = S: the target setting
    CHECK(!llama_h2o_check_params(params_of(256, 257, 512)).empty());  // M > S
    CHECK(!llama_h2o_check_params(params_of(0, 0, 512)).empty());
    CHECK(llama_h2o_check_params(params_of(256, 257, 512)).find("LLAMA_OPT_H2O_CHUNK_SIZE") != std::string::npos);
    CHECK(throws_invalid([] { llama_h2o(params_of(256, 257, 512), 1, 4, 4096); }));
    CHECK(throws_invalid([] { llama_h2o(params_of(8, 8, 32), 0, 4, 4096); }));
    CHECK(throws_invalid([] { llama_h2o(params_of(8, 8, 32), 1, 0, 4096); }));
    CHECK(throws_invalid([] { llama_h2o(params_of(8, 8, 32), 1, 4, 0); }));
}

// Metric 1: contiguous tensors in ggml's convention, strides as the specification lays them out.
static void test_layout_and_strides() {
    llama_h2o h2o(params_of(256, 256, 1024), 3, 4, 8192);
    const llama_h2o_layout s = h2o.scores_layout(), m = h2o.memory_layout();
    CHECK(s.ne[0] == 8192 && s.ne[1] == 4 && s.nb[0] == 2 && s.nb[1] == 2 * 8192);
    CHECK(m.ne[0] == 512 && m.ne[1] == 4 && m.nb[0] == sizeof(int32_t) && m.nb[1] == 512 * sizeof(int32_t));
    CHECK(s.nb[1] == s.ne[0] * s.nb[0] && m.nb[1] == m.ne[0] * m.nb[0]);  // contiguous
    CHECK(h2o.bytes() == 3 * (8192 * 4 * 2 + 512 * 4 * 4));
    // zero-initialized scores, empty memory sets
    CHECK(h2o.score(2, 3, 8191) == 0.0f && h2o.memory(2)[4 * 512 - 1] == llama_h2o::EMPTY);
    CHECK(!h2o.memory_initialized() && h2o.state().chunk_idx == 0 && h2o.state().chunk_boundaries.size() == 1);
}

// Metric 2 (the part a test can check): a score is one index computation away, head * kv_size + pos,
// a bijection onto the layer's tensor, and layers do not alias.
static void test_random_access_is_direct_indexing() {
    const uint32_t n_head = 4, kv_size = 300;
    llama_h2o h2o(params_of(8, 8, 32), 2, n_head, kv_size);
    for (uint32_t i = 0; i < n_head * kv_size; ++i) {
        h2o.scores(0)[i] = llama_h2o_fp32_to_bf16((float) i);  // i < 2^8 * 4: not all exact in BF16, compare rounded
    }
    bool all = true;
    for (uint32_t h = 0; h < n_head; ++h) {
        for (uint32_t pos = 0; pos < kv_size; ++pos) {
            const float expected = llama_h2o_bf16_to_fp32(llama_h2o_fp32_to_bf16((float) (h * kv_size + pos)));
            all &= h2o.score(0, h, pos) == expected && h2o.score(1, h, pos) == 0.0f;
        }
    }
    CHECK(all);
}

// Metric 3: memory overhead under 5 % of the KV cache for the models in question.
static void test_memory_overhead() {
    // Gemma 3 270M: 18 layers (3 full-attention ones carry H2O state), 4 query heads, 1 KV head of 256,
    // F16 K and V; a 32k-position cache
    {
        const uint32_t kv_size = 32768;
        llama_h2o h2o(params_of(256, 256, 1024), 3, 4, kv_size);
        const double kv_bytes = 18.0 * kv_size * 2 * 1 * 256 * 2;
        CHECK(h2o.bytes() / kv_bytes < 0.05);
        CHECK(std::fabs(llama_h2o_score_overhead(3, 4, 18, 1, 256) - 3.0 * 4 * 2 / (18.0 * 1024)) < 1e-12);
    }
    // the specification's 32-layer, 32-head model (head_dim 128, no GQA), H2O on every layer, 4096 positions
    {
        const uint32_t kv_size = 4096;
        llama_h2o h2o(params_of(256, 256, 1024), 32, 32, kv_size);
        const double kv_bytes = 32.0 * kv_size * 2 * 32 * 128 * 2;
        CHECK(h2o.bytes() / kv_bytes < 0.05);
        CHECK(h2o.bytes() == 32u * (32u * 4096 * 2 + 32u * 512 * 4));  // 8 MiB scores + 2 MiB indices
    }
    // the bound is a property of the shape, not a law: many query heads over one small KV head exceed it
    CHECK(llama_h2o_score_overhead(32, 64, 32, 1, 64) > 0.05);
}

// Metric 4: indices stay in bounds at N = S, N = 2S - 1 and N < L.
static void test_index_bounds_in_edge_cases() {
    const uint32_t S = 1024, L = 256, H = 256, n_head = 4;
    llama_h2o h2o(params_of(L, H, S), 2, n_head, 4096);
    std::mt19937 rng(4);
    std::uniform_real_distribution<float> u(0.0f, 2.0f);
    std::vector<float> colsum(n_head * S);
    for (float & v : colsum) v = u(rng);

    for (uint32_t il = 0; il < 2; ++il) {
        h2o.init_chunk_scores(il, 0, S, colsum.data());
        h2o.build_memory_set(il, S);  // N = S
    }
    CHECK(memory_well_formed(h2o, S));
    CHECK(memory_of(h2o, 0, 0).size() == L + H && memory_of(h2o, 1, 3).size() == L + H);
    h2o.next_chunk(S);

    for (uint32_t il = 0; il < 2; ++il) {
        std::vector<float> inter(n_head * (L + H), 0.25f);
        h2o.accumulate_memory_scores(il, inter.data());
        h2o.init_chunk_scores(il, S, S - 1, colsum.data());
        h2o.build_memory_set(il, 2 * S - 1);  // N = 2S - 1: a partial second chunk
    }
    CHECK(memory_well_formed(h2o, 2 * S - 1));
    CHECK(memory_of(h2o, 0, 2).size() == L + H);

    for (uint32_t il = 0; il < 2; ++il) {
        h2o.build_memory_set(il, 100);  // N < L: the window is all there is
    }
    CHECK(memory_well_formed(h2o, 100));
    const std::vector<int32_t> small = memory_of(h2o, 1, 1);
    CHECK(small.size() == 100 && small.front() == 0 && small.back() == 99);

    // from a fresh state, a first chunk shorter than the window
    llama_h2o fresh(params_of(L, H, S), 1, n_head, 4096);
    fresh.init_chunk_scores(0, 0, 10, colsum.data());
    fresh.build_memory_set(0, 10);
    CHECK(memory_well_formed(fresh, 10) && memory_of(fresh, 0, 0).size() == 10);
    fresh.build_memory_set(0, 0);  // nothing before position 0
    CHECK(memory_of(fresh, 0, 0).empty());

    // requests beyond the tensors are refused, not written
    CHECK(throws_invalid([&] { h2o.build_memory_set(0, 4097); }));
    CHECK(throws_invalid([&] { h2o.init_chunk_scores(0, 4000, 97, colsum.data()); }));
    CHECK(throws_invalid([&] { h2o.build_memory_set(2, 10); }));
}

// Metric 5: a chunk's scores are the column sums of its attention weights (BF16 rounding).
static void test_scores_start_as_column_sums() {
    const uint32_t S = 256, n_head = 4;
    std::mt19937 rng(5);
    std::normal_distribution<float> logit(0.0f, 2.0f);
    // causal softmax rows: query i sees keys 0..i
    std::vector<float> weights((size_t) n_head * S * S, 0.0f);
    for (uint32_t h = 0; h < n_head; ++h) {
        for (uint32_t i = 0; i < S; ++i) {
            float * row = weights.data() + ((size_t) h * S + i) * S;
            double  sum = 0;
            for (uint32_t j = 0; j <= i; ++j) {
                row[j] = std::exp(logit(rng));
                sum += row[j];
            }
            for (uint32_t j = 0; j <= i; ++j) {
                row[j] = (float) (row[j] / sum);
            }
        }
    }
    std::vector<float> colsum(n_head * S);
    llama_h2o_column_sums(weights.data(), n_head, S, S, colsum.data());

    llama_h2o h2o(params_of(32, 32, S), 1, n_head, 2 * S);
    h2o.init_chunk_scores(0, S, S, colsum.data());  // the second chunk's positions
    bool sums_ok = true, stored_ok = true, small_ok = true;
    for (uint32_t h = 0; h < n_head; ++h) {
        double total = 0;
        for (uint32_t j = 0; j < S; ++j) {
            double expected = 0;
            for (uint32_t i = 0; i < S; ++i) {
                expected += weights[((size_t) h * S + i) * S + j];
            }
            total += expected;
            sums_ok &= std::fabs(colsum[h * S + j] - expected) <= 1e-4 * std::max(1.0, expected);
            const double error = std::fabs(h2o.score(0, h, S + j) - expected);
            // BF16 keeps 8 significant bits: rounding moves a value by at most 2^-8 of it, which is
            // the specification's 1e-3 below 0.25 and more above (a column sum is 1 on average)
            stored_ok &= error <= expected / 256 + 1e-5;
            if (expected < 0.25) {
                small_ok &= error <= 1e-3;
            }
        }
        sums_ok &= std::fabs(total - S) < 1e-2;  // every row sums to 1
    }
    CHECK(sums_ok && stored_ok && small_ok);
    CHECK(h2o.score(0, 0, 0) == 0.0f && h2o.score(0, 3, S - 1) == 0.0f);  // the first chunk's positions untouched
}

// Metric 6: accumulation never decreases a score, never makes NaN or inf, refuses bad input whole.
static void test_accumulation_is_monotonic_and_finite() {
    const uint32_t S = 128, L = 32, H = 32, n_head = 4, M = L + H;
    llama_h2o h2o(params_of(L, H, S), 1, n_head, 4 * S);
    std::mt19937 rng(6);
    std::uniform_real_distribution<float> intra(0.1f, 1.0f), inter(0.05f, 0.5f);
    std::vector<float> colsum(n_head * S);
    for (float & v : colsum) v = intra(rng);

    CHECK(throws_invalid([&] { h2o.accumulate_memory_scores(0, colsum.data()); }));  // no memory set yet
    h2o.init_chunk_scores(0, 0, S, colsum.data());
    h2o.build_memory_set(0, S);

    std::vector<float> before(n_head * 4 * S);
    for (uint32_t h = 0; h < n_head; ++h)
        for (uint32_t p = 0; p < 4 * S; ++p) before[h * 4 * S + p] = h2o.score(0, h, p);
    std::vector<float> delta(n_head * M);
    for (float & v : delta) v = inter(rng);
    h2o.accumulate_memory_scores(0, delta.data());
    bool monotonic = true, finite = true, raised = true;
    for (uint32_t h = 0; h < n_head; ++h) {
        const std::vector<int32_t> mem = memory_of(h2o, 0, h);
        const std::set<int32_t>    in_memory(mem.begin(), mem.end());
        for (uint32_t p = 0; p < 4 * S; ++p) {
            const float after = h2o.score(0, h, p), old = before[h * 4 * S + p];
            monotonic &= after >= old;
            finite &= std::isfinite(after);
            raised &= in_memory.count((int32_t) p) ? after > old : after == old;  // only the memory set's tokens
        }
    }
    CHECK(monotonic && finite && raised);

    // NaN, inf or negative weights are refused and nothing changes
    for (float bad : { std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(), -0.5f }) {
        std::vector<float> poisoned = delta;
        poisoned[n_head * M - 1 - (size_t) (bad < 0)] = bad;  // a slot of the last head's memory set (it is full)
        const float probe = h2o.score(0, 0, (uint32_t) memory_of(h2o, 0, 0)[0]);
        CHECK(throws_invalid([&] { h2o.accumulate_memory_scores(0, poisoned.data()); }));
        CHECK(h2o.score(0, 0, (uint32_t) memory_of(h2o, 0, 0)[0]) == probe);
        std::vector<float> chunk = colsum;
        chunk[7] = bad;
        CHECK(throws_invalid([&] { h2o.init_chunk_scores(0, S, S, chunk.data()); }));
        CHECK(h2o.score(0, 0, S) == 0.0f);
    }
}

// The reference of metric 7: the H highest (score, then earlier position) of `candidates`.
static std::set<int32_t> top_h(const std::vector<std::pair<int32_t, float>> & candidates, uint32_t H) {
    std::vector<std::pair<int32_t, float>> sorted = candidates;
    std::sort(sorted.begin(), sorted.end(), [](const auto & a, const auto & b) {
        return a.second != b.second ? a.second > b.second : a.first < b.first;
    });
    std::set<int32_t> out;
    for (size_t i = 0; i < sorted.size() && i < H; ++i) out.insert(sorted[i].first);
    return out;
}

// Metric 7: the heavy hitters are the top H of a reference sort, in the first chunk and after it.
static void test_heavy_hitters_equal_a_reference_sort() {
    const uint32_t S = 256, L = 64, H = 48, n_head = 4;
    llama_h2o h2o(params_of(L, H, S), 1, n_head, 2 * S);
    std::mt19937 rng(7);
    std::uniform_int_distribution<int> level(0, 10);  // few levels: ties at the cut, which the order breaks
    std::vector<float> colsum(n_head * S);
    for (float & v : colsum) v = level(rng) / 8.0f;
    h2o.init_chunk_scores(0, 0, S, colsum.data());
    h2o.build_memory_set(0, S);
    bool first_ok = true;
    for (uint32_t h = 0; h < n_head; ++h) {
        std::vector<std::pair<int32_t, float>> candidates;
        for (uint32_t p = 0; p < S - L; ++p) candidates.push_back({ (int32_t) p, h2o.score(0, h, p) });
        std::set<int32_t> expected = top_h(candidates, H);
        for (uint32_t p = S - L; p < S; ++p) expected.insert((int32_t) p);
        const std::vector<int32_t> mem = memory_of(h2o, 0, h);
        first_ok &= std::set<int32_t>(mem.begin(), mem.end()) == expected && mem.size() == L + H;
    }
    CHECK(first_ok);

    // second chunk: candidates are the previous memory set (window included) and the new chunk below its window
    std::vector<std::vector<int32_t>> previous;
    for (uint32_t h = 0; h < n_head; ++h) previous.push_back(memory_of(h2o, 0, h));
    h2o.next_chunk(S);
    std::vector<float> inter(n_head * (L + H));
    for (float & v : inter) v = level(rng) / 16.0f;
    h2o.accumulate_memory_scores(0, inter.data());
    for (float & v : colsum) v = level(rng) / 8.0f;
    h2o.init_chunk_scores(0, S, S, colsum.data());
    h2o.build_memory_set(0, 2 * S);
    bool second_ok = true;
    for (uint32_t h = 0; h < n_head; ++h) {
        std::vector<std::pair<int32_t, float>> candidates;
        for (int32_t p : previous[h]) candidates.push_back({ p, h2o.score(0, h, (uint32_t) p) });
        for (uint32_t p = S; p < 2 * S - L; ++p) candidates.push_back({ (int32_t) p, h2o.score(0, h, p) });
        std::set<int32_t> expected = top_h(candidates, H);
        for (uint32_t p = 2 * S - L; p < 2 * S; ++p) expected.insert((int32_t) p);
        const std::vector<int32_t> mem = memory_of(h2o, 0, h);
        second_ok &= std::set<int32_t>(mem.begin(), mem.end()) == expected;
    }
    CHECK(second_ok);
}

static bool in_memory(const llama_h2o & h2o, uint32_t il, uint32_t head, int32_t pos) {
    const std::vector<int32_t> mem = memory_of(h2o, il, head);
    return std::find(mem.begin(), mem.end(), pos) != mem.end();
}

// Metric 8: a token of the first chunk that keeps drawing attention survives into later memory sets;
// one that stops drawing it is outscored and leaves.
static void test_a_heavy_hitter_survives_three_chunks() {
    const uint32_t S = 256, L = 64, H = 64, n_head = 2, M = L + H;
    llama_h2o h2o(params_of(L, H, S), 1, n_head, 4 * S);
    std::vector<float> intra(n_head * S, 0.5f), inter(n_head * M, 0.1f);
    h2o.init_chunk_scores(0, 0, S, intra.data());
    set_score(h2o, 0, 0, 42, 10.0f);
    h2o.build_memory_set(0, S);
    h2o.next_chunk(S);
    CHECK(in_memory(h2o, 0, 0, 42));
    for (uint32_t c = 1; c < 4; ++c) {
        h2o.accumulate_memory_scores(0, inter.data());
        for (float & v : intra) v = 1.0f + (float) c;  // new tokens outscore old ones that drew 0.1 a chunk
        h2o.init_chunk_scores(0, c * S, S, intra.data());
        h2o.build_memory_set(0, (c + 1) * S);
        h2o.next_chunk(S);
        CHECK(in_memory(h2o, 0, 0, 42));   // survived chunk c
        CHECK(!in_memory(h2o, 0, 1, 42));  // head 1 never found it heavy: outscored by newer tokens
    }
    CHECK(h2o.state().chunk_idx == 4 && h2o.state().tokens_processed == 4 * S);
    CHECK((h2o.state().chunk_boundaries == std::vector<uint32_t>{ 0, S, 2 * S, 3 * S, 4 * S }));
}

// Metric 9: each head selects on its own scores.
static void test_heads_select_independently() {
    const uint32_t S = 512, L = 64, H = 64, n_head = 8;
    llama_h2o h2o(params_of(L, H, S), 1, n_head, S);
    for (uint32_t h = 0; h < n_head; ++h)
        for (uint32_t pos = 0; pos < S; ++pos) set_score(h2o, 0, h, pos, (float) ((pos * 7 + h * 11) % 100) / 100.0f);
    h2o.build_memory_set(0, S);
    uint32_t different = 0;
    for (uint32_t h = 0; h + 1 < n_head; ++h) different += memory_of(h2o, 0, h) != memory_of(h2o, 0, h + 1);
    CHECK(different > n_head / 2);

    // changing one head's scores changes its memory set alone
    std::vector<std::vector<int32_t>> before;
    for (uint32_t h = 0; h < n_head; ++h) before.push_back(memory_of(h2o, 0, h));
    llama_h2o again(params_of(L, H, S), 1, n_head, S);
    for (uint32_t h = 0; h < n_head; ++h)
        for (uint32_t pos = 0; pos < S; ++pos)
            set_score(again, 0, h, pos, h == 3 ? (float) pos / S : (float) ((pos * 7 + h * 11) % 100) / 100.0f);
    again.build_memory_set(0, S);
    bool others_same = true;
    for (uint32_t h = 0; h < n_head; ++h) {
        if (h != 3) others_same &= memory_of(again, 0, h) == before[h];
    }
    CHECK(others_same && memory_of(again, 0, 3) != before[3]);
}

// Metric 10: indices ascending within each head (the gather reads the cache in position order).
static void test_indices_are_sorted() {
    const uint32_t S = 512, L = 100, H = 150, n_head = 4;
    llama_h2o h2o(params_of(L, H, S), 2, n_head, 3 * S);
    std::mt19937 rng(10);
    std::uniform_real_distribution<float> u(0.0f, 3.0f);
    std::vector<float> colsum(n_head * S), inter(n_head * (L + H));
    for (uint32_t c = 0; c < 3; ++c) {
        for (uint32_t il = 0; il < 2; ++il) {
            for (float & v : colsum) v = u(rng);
            for (float & v : inter) v = u(rng);
            if (c > 0) h2o.accumulate_memory_scores(il, inter.data());
            h2o.init_chunk_scores(il, c * S, S, colsum.data());
            h2o.build_memory_set(il, (c + 1) * S);
        }
        h2o.next_chunk(S);
        CHECK(memory_well_formed(h2o, (c + 1) * S));
    }
}

// Metric 11: 16 chunks of accumulation stay finite and bounded, also when every query of every
// chunk attends one token (the largest column sum a chunk can give: S).
static void test_sixteen_chunks_stay_finite() {
    const uint32_t S = 1024, L = 256, H = 256, n_head = 4, M = L + H, n_chunks = 16;
    llama_h2o h2o(params_of(L, H, S), 1, n_head, n_chunks * S);
    std::vector<float> scores(n_head * S, 0.5f), inter(n_head * M, 0.5f);
    for (uint32_t c = 0; c < n_chunks; ++c) {
        if (c > 0) {
            for (uint32_t h = 0; h < n_head; ++h) inter[h * M] = (float) S;  // all attention on the first slot
            h2o.accumulate_memory_scores(0, inter.data());
        }
        h2o.init_chunk_scores(0, c * S, S, scores.data());
        h2o.build_memory_set(0, (c + 1) * S);
        h2o.next_chunk(S);
    }
    bool bounded = true;
    for (uint32_t h = 0; h < n_head; ++h) {
        for (uint32_t p = 0; p < n_chunks * S; ++p) {
            const float s = h2o.score(0, h, p);
            bounded &= std::isfinite(s) && s >= 0.0f && s < 1e6f;
        }
    }
    CHECK(bounded);
    CHECK(in_memory(h2o, 0, 0, 0));  // the token that drew all the attention stayed
    CHECK(h2o.score(0, 0, 0) > 14 * (float) S);
    CHECK(memory_well_formed(h2o, n_chunks * S));
}

// The subset a layer attends to for a chunk: each head's own memory set, in its order (all of the
// same size), then the chunk: no head computes over another head's choices.
static void test_subset_is_each_heads_memory_set() {
    const uint32_t S = 64, L = 8, H = 8, n_head = 3, n = 5;
    llama_h2o h2o(params_of(L, H, S), 1, n_head, 4 * S);
    for (uint32_t h = 0; h < n_head; ++h)
        for (uint32_t pos = 0; pos < S; ++pos) set_score(h2o, 0, h, pos, (float) ((pos * 13 + h * 29) % 64));
    llama_h2o_subset first;
    h2o.subset(0, S, first);  // before any memory set: the chunk alone
    CHECK(first.pos.empty() && first.n_mem == 0 && first.n_keys() == S);
    h2o.build_memory_set(0, S);
    h2o.next_chunk(S);
    llama_h2o_subset sub;
    h2o.subset(0, n, sub);
    CHECK(sub.n_mem == L + H && sub.n_tokens == n && sub.n_keys() == L + H + n);
    CHECK(sub.pos.size() == (size_t) n_head * (L + H));
    bool own = true;
    for (uint32_t h = 0; h < n_head; ++h) {
        own &= std::vector<int32_t>(sub.pos.begin() + h * sub.n_mem, sub.pos.begin() + (h + 1) * sub.n_mem) ==
               memory_of(h2o, 0, h);
    }
    CHECK(own);
    CHECK(sub.pos[0] != sub.pos[sub.n_mem] || sub.pos[1] != sub.pos[sub.n_mem + 1]);  // the heads chose differently
}

// Every head's memory set of a layer has the same size after every chunk (subset() relies on it: one
// mask for all heads), strictly ascending and below the next chunk, for chunks of any length (short
// ones too, also in the middle of a prompt) and memory sets larger than what came before.
static void test_memory_sets_of_one_layer_have_one_size() {
    const uint32_t S = 32, n_head = 4, n_chunks = 8;
    bool ok = true;
    for (uint32_t L : { 1u, 4u, 16u, 31u }) {
        for (uint32_t H : { 1u, 8u, S - L }) {
            if (L + H > S) {
                continue;
            }
            std::mt19937 rng(L * 100 + H);
            std::uniform_int_distribution<uint32_t> length(1, S);
            std::uniform_real_distribution<float>   u(0.0f, 1.0f);
            llama_h2o h2o(params_of(L, H, S), 1, n_head, n_chunks * S);
            uint32_t  end = 0;
            for (uint32_t c = 0; c < n_chunks; ++c) {
                const uint32_t   n = c % 2 ? length(rng) : S;
                llama_h2o_subset sub;
                try {
                    h2o.subset(0, n, sub);
                } catch (const std::logic_error &) {
                    ok = false;
                    break;
                }
                for (uint32_t h = 0; h < n_head; ++h) {
                    const int32_t * head = sub.pos.data() + (size_t) h * sub.n_mem;
                    for (uint32_t j = 0; j < sub.n_mem; ++j) {
                        ok &= head[j] < (int32_t) end && (j == 0 || head[j] > head[j - 1]);
                    }
                }
                std::vector<float> colsum((size_t) n_head * sub.n_keys());
                for (float & v : colsum) v = u(rng);
                h2o.update_layer(0, sub, colsum.data());
                h2o.next_chunk(n);
                end += n;
            }
        }
    }
    CHECK(ok);
}

// update_layer = the column sums split into the memory set's and the chunk's, accumulated,
// initialized and the next memory set built (the steps of the specification, in one call).
static void test_update_layer_is_the_specifications_steps() {
    const uint32_t S = 128, L = 16, H = 24, n_head = 2, M = L + H;
    llama_h2o a(params_of(L, H, S), 1, n_head, 3 * S), b = a;
    std::mt19937 rng(12);
    std::uniform_real_distribution<float> u(0.0f, 2.0f);
    for (uint32_t c = 0; c < 3; ++c) {
        llama_h2o_subset sub;
        a.subset(0, S, sub);
        std::vector<float> colsum((size_t) n_head * sub.n_keys());
        for (float & v : colsum) v = u(rng);
        // by hand, on b
        std::vector<float> inter((size_t) n_head * M, 0.0f), intra((size_t) n_head * S);
        for (uint32_t h = 0; h < n_head; ++h) {
            const std::vector<int32_t> mem = memory_of(b, 0, h);
            for (size_t s = 0; s < mem.size(); ++s) {
                inter[h * M + s] = colsum[h * sub.n_keys() + s];  // key s of head h: its s-th memory slot
            }
            for (uint32_t k = 0; k < S; ++k) intra[h * S + k] = colsum[h * sub.n_keys() + sub.n_mem + k];
        }
        if (c > 0) b.accumulate_memory_scores(0, inter.data());
        b.init_chunk_scores(0, c * S, S, intra.data());
        b.build_memory_set(0, (c + 1) * S);
        b.next_chunk(S);
        a.update_layer(0, sub, colsum.data());
        a.next_chunk(S);
        bool same = true;
        for (uint32_t h = 0; h < n_head; ++h) {
            same &= memory_of(a, 0, h) == memory_of(b, 0, h);
            for (uint32_t p = 0; p < 3 * S; ++p) same &= a.score(0, h, p) == b.score(0, h, p);
        }
        CHECK(same);
    }
    // column sums of another chunk's subset (a memory set it does not hold) are refused
    llama_h2o_subset stale;
    stale.n_tokens = S;
    std::vector<float> colsum((size_t) n_head * (M + S), 1.0f);
    CHECK(throws_invalid([&] { a.update_layer(0, stale, colsum.data()); }));
    a.subset(0, S, stale);
    stale.pos[M + 1] += 1;  // the second head's set, one position off
    CHECK(throws_invalid([&] { a.update_layer(0, stale, colsum.data()); }));
}

static void test_reset() {
    llama_h2o h2o(params_of(8, 8, 32), 1, 2, 64);
    std::vector<float> colsum(2 * 32, 1.0f);
    h2o.init_chunk_scores(0, 0, 32, colsum.data());
    h2o.build_memory_set(0, 32);
    h2o.next_chunk(32);
    h2o.reset();
    CHECK(!h2o.memory_initialized() && h2o.state().chunk_idx == 0 && h2o.state().tokens_processed == 0);
    CHECK(h2o.state().chunk_boundaries == std::vector<uint32_t>{ 0 });
    CHECK(h2o.score(0, 1, 5) == 0.0f && memory_of(h2o, 0, 0).empty());
}

int main() {
    test_bf16_conversion();
    test_parameters_are_checked();
    test_layout_and_strides();
    test_random_access_is_direct_indexing();
    test_memory_overhead();
    test_index_bounds_in_edge_cases();
    test_scores_start_as_column_sums();
    test_accumulation_is_monotonic_and_finite();
    test_heavy_hitters_equal_a_reference_sort();
    test_a_heavy_hitter_survives_three_chunks();
    test_heads_select_independently();
    test_indices_are_sorted();
    test_sixteen_chunks_stay_finite();
    test_subset_is_each_heads_memory_set();
    test_memory_sets_of_one_layer_have_one_size();
    test_update_layer_is_the_specifications_steps();
    test_reset();
    return check_result("test-opt-h2o");
}
