// Micro-benchmarks of methods/h2o (specification 004's three, plus the costs docs/h2o.md weighs):
//
//   bench-h2o [repeats]      (built with the C++ units: cmake -S tests/cpp -B build-tests && cmake --build build-tests)
//
// 1. allocation of the score and index tensors (target < 100 ms);
// 2. one layer's memory-set construction (target < 1 ms);
// 3. one score update of a layer's memory set (target < 10 us);
// and what the design note compares: a random score lookup, the column sums of one chunk's
// materialized attention weights, and scoring one chunk on the host from Q and K
// (llama_opt_attn_accumulate, as cpp/methods/attn-score does) instead of in the graph.
// Medians of `repeats` runs; a program, not a test: the machine's load moves these numbers.

#include "methods/h2o.h"
#include "methods/attn-score.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <vector>

using bench_clock = std::chrono::steady_clock;

// median seconds of `repeats` calls of f
static double median_s(int repeats, const std::function<void()> & f) {
    std::vector<double> t;
    for (int r = 0; r < repeats; ++r) {
        const auto start = bench_clock::now();
        f();
        t.push_back(std::chrono::duration<double>(bench_clock::now() - start).count());
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

struct model_shape {
    const char * name;
    uint32_t     n_layer_h2o;  // full-attention layers (H2O's)
    uint32_t     n_head;
    uint32_t     n_head_kv;
    uint32_t     head_dim;
};

static void row(const char * what, const char * shape, double value, const char * unit, const char * target) {
    printf("| %-44s | %-22s | %10.3f %-3s | %-8s |\n", what, shape, value, unit, target);
}

// A state after `n_chunks` chunks, the next chunk's scores set, ready to build its memory set.
static llama_h2o state_after(const llama_h2o_params & p, const model_shape & m, uint32_t kv_size, uint32_t n_chunks,
                             std::mt19937 & rng) {
    llama_h2o h2o(p, 1, m.n_head, kv_size);
    std::uniform_real_distribution<float> u(0.0f, 2.0f);
    std::vector<float> colsum((size_t) m.n_head * p.chunk_size), inter((size_t) m.n_head * p.memory_size());
    for (uint32_t c = 0; c <= n_chunks; ++c) {
        for (float & v : colsum) v = u(rng);
        for (float & v : inter) v = u(rng);
        if (c > 0) h2o.accumulate_memory_scores(0, inter.data());
        h2o.init_chunk_scores(0, c * p.chunk_size, p.chunk_size, colsum.data());
        if (c == n_chunks) break;
        h2o.build_memory_set(0, (c + 1) * p.chunk_size);
        h2o.next_chunk(p.chunk_size);
    }
    return h2o;
}

int main(int argc, char ** argv) {
    const int repeats = argc > 1 ? std::max(1, atoi(argv[1])) : 21;
    llama_h2o_params p;  // L = H = 256, S = 512: the setting
    p.local_window = 256, p.heavy_budget = 256, p.chunk_size = 512;
    const uint32_t M = p.memory_size(), S = p.chunk_size;
    const model_shape shapes[] = {
        { "Gemma 3 270M (3 layers)", 3, 4, 1, 256 },
        { "spec: 32 layers x 32 heads", 32, 32, 32, 128 },
    };
    std::mt19937 rng(1);

    printf("L = %u, H = %u, S = %u; medians of %d runs\n\n", p.local_window, p.heavy_budget, S, repeats);
    printf("| %-44s | %-22s | %14s | %-8s |\n", "what", "shape", "time", "target");
    printf("|%s|%s|%s|%s|\n", std::string(46, '-').c_str(), std::string(24, '-').c_str(), std::string(16, '-').c_str(),
           std::string(10, '-').c_str());

    for (const model_shape & m : shapes) {
        for (uint32_t kv_size : { 16384u, 131072u }) {
            char what[64];
            snprintf(what, sizeof(what), "1. allocate every layer's tensors, %uk", kv_size / 1024);
            const double t = median_s(repeats, [&] { llama_h2o h2o(p, m.n_layer_h2o, m.n_head, kv_size); });
            row(what, m.name, t * 1e3, "ms", "< 100 ms");
        }
    }
    for (const model_shape & m : shapes) {
        llama_h2o  base = state_after(p, m, 32 * S, 30, rng);  // the 31st chunk of a 16k prompt
        llama_h2o  h2o  = base;
        std::vector<double> builds;  // each from the same state, the copy untimed
        for (int r = 0; r < repeats; ++r) {
            h2o               = base;
            const auto start  = bench_clock::now();
            h2o.build_memory_set(0, 31 * S);
            builds.push_back(std::chrono::duration<double>(bench_clock::now() - start).count());
        }
        std::sort(builds.begin(), builds.end());
        row("2. build one layer's memory set (chunk 31)", m.name, builds[builds.size() / 2] * 1e6, "us", "< 1 ms");

        h2o.build_memory_set(0, 31 * S);
        std::vector<float> inter((size_t) m.n_head * M, 0.001f);
        const int calls = 1000;
        const double tu = median_s(repeats, [&] {
            for (int i = 0; i < calls; ++i) h2o.accumulate_memory_scores(0, inter.data());
        });
        row("3. update one layer's memory-set scores", m.name, tu / calls * 1e6, "us", "< 10 us");

        std::uniform_int_distribution<uint32_t> head(0, m.n_head - 1), pos(0, 32 * S - 1);
        std::vector<uint32_t> heads(100000), positions(100000);
        for (size_t i = 0; i < heads.size(); ++i) heads[i] = head(rng), positions[i] = pos(rng);
        float sink = 0;
        const double ta = median_s(repeats, [&] {
            for (size_t i = 0; i < heads.size(); ++i) sink += h2o.score(0, heads[i], positions[i]);
        });
        row("random score lookup", m.name, ta / heads.size() * 1e9, "ns", "< 1 us");
        if (sink < 0) printf("%f\n", sink);  // keeps the loop
    }

    // Where the column sums come from (docs/h2o.md): one chunk of one layer, Gemma 3 270M's shape.
    {
        const model_shape & m = shapes[0];
        const uint32_t n_key = M + S;
        std::vector<float> weights((size_t) m.n_head * S * n_key, 1.0f / n_key), colsum((size_t) m.n_head * n_key);
        const double tc = median_s(repeats, [&] { llama_h2o_column_sums(weights.data(), m.n_head, S, n_key, colsum.data()); });
        row("column sums of materialized weights (1 layer)", m.name, tc * 1e3, "ms", "-");

        llama_opt_attn_shape shape;
        shape.n_head = m.n_head, shape.n_head_kv = m.n_head_kv, shape.head_dim = m.head_dim, shape.scale = 0.0625f;
        std::normal_distribution<float> n01(0.0f, 1.0f);
        std::vector<float> q((size_t) S * m.n_head * m.head_dim), k((size_t) n_key * m.n_head_kv * m.head_dim);
        for (float & v : q) v = n01(rng);
        for (float & v : k) v = n01(rng);
        std::vector<llama_pos> q_pos(S), k_pos(n_key);
        for (uint32_t i = 0; i < S; ++i) q_pos[i] = (llama_pos) (M + i);
        for (uint32_t j = 0; j < n_key; ++j) k_pos[j] = (llama_pos) j;
        std::vector<float> scores(n_key);
        const int few = std::max(1, repeats / 4);
        const double th = median_s(few, [&] {
            llama_opt_attn_accumulate(shape, q.data(), q_pos.data(), S, k.data(), k_pos.data(), n_key, scores.data());
        });
        row("host scoring from Q, K (1 layer, 1 thread)", m.name, th * 1e3, "ms", "-");
        const double flops = 2.0 * S * n_key * m.n_head * m.head_dim;
        printf("\nhost scoring: %.2f GFLOP/s on the Q.K products alone (%.0f MFLOP a chunk and layer)\n",
               flops / th * 1e-9, flops * 1e-6);
    }
    return 0;
}
