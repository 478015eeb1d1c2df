// Flash attention's tiled prefill path with each K/V tile converted once for the query heads that
// share it (patches/0014) against upstream's loop (the switch off): every output must be bitwise
// equal, over head sizes, grouped-query ratios (heads split into several items too), query rows
// (tiles of fewer than 64 rows, a partial last tile), KV lengths that end inside a tile, causal and
// sliding-window masks (skipped tiles), a mask per head, ALiBi slopes, soft-capping, attention
// sinks, F32 and F16 K/V, and 1-3 threads. Built against the patched tree by
// tools/build_upstream.py, driven by tests/test_flash_attn_shared_kv.py.
//
//   test-flash-attn-shared-kv
//
// Prints "DIFF <case> differing=<k>" for every case whose outputs differ and "PASS: <n> cases" or
// "FAIL: ..."; exit 0 iff every case is equal.
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "check-common.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

struct fa_case {
    int64_t   d, n_head, n_head_kv, n_rows, n_kv;
    int64_t   window;          // > 0: a query sees only the `window` cells up to its own
    bool      mask_per_head;   // the mask's third dimension is n_head (else broadcast)
    float     max_bias, softcap;
    bool      sinks;
    ggml_type kv_type;

    std::string name() const {
        char buf[256];
        snprintf(buf, sizeof buf, "d=%lld heads=%lld/%lld rows=%lld n_kv=%lld window=%lld mask_per_head=%d "
                 "max_bias=%g softcap=%g sinks=%d kv=%s", (long long) d, (long long) n_head, (long long) n_head_kv,
                 (long long) n_rows, (long long) n_kv, (long long) window, mask_per_head, max_bias, softcap, sinks,
                 ggml_type_name(kv_type));
        return buf;
    }
};

void set_floats(ggml_tensor * t, const std::vector<float> & values) {
    if (t->type == GGML_TYPE_F32) {
        ggml_backend_tensor_set(t, values.data(), 0, ggml_nbytes(t));
        return;
    }
    std::vector<ggml_fp16_t> h(values.size());
    ggml_fp32_to_fp16_row(values.data(), h.data(), h.size());
    ggml_backend_tensor_set(t, h.data(), 0, ggml_nbytes(t));
}

// The attention output of one case, with the shared-KV path on or off.
std::vector<float> run(ggml_backend_t backend, const fa_case & c, uint32_t seed, bool shared) {
    std::mt19937   rng(seed);
    ggml_init_params ip  = { ggml_tensor_overhead() * 16 + ggml_graph_overhead(), nullptr, true };
    ggml_context *   ctx = ggml_init(ip);
    const int64_t    mask_heads = c.mask_per_head ? c.n_head : 1;
    ggml_tensor * q  = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, c.d, c.n_head, c.n_rows);
    ggml_tensor * k  = ggml_new_tensor_3d(ctx, c.kv_type, c.d, c.n_kv, c.n_head_kv);
    ggml_tensor * v  = ggml_new_tensor_3d(ctx, c.kv_type, c.d, c.n_kv, c.n_head_kv);
    ggml_tensor * m  = ggml_new_tensor_3d(ctx, GGML_TYPE_F16, c.n_kv, c.n_rows, mask_heads);
    ggml_tensor * s  = c.sinks ? ggml_new_tensor_1d(ctx, GGML_TYPE_F32, c.n_head) : nullptr;
    ggml_tensor * qp = ggml_permute(ctx, q, 0, 2, 1, 3);  // [d, rows, heads] as llama.cpp builds it
    ggml_tensor * out = ggml_flash_attn_ext(ctx, qp, k, v, m, 1.0f / sqrtf((float) c.d), c.max_bias, c.softcap);
    ggml_flash_attn_ext_set_prec(out, GGML_PREC_F32);
    if (s) {
        ggml_flash_attn_ext_add_sinks(out, s);
    }
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, backend);

    set_floats(q, random_floats(ggml_nelements(q), rng));
    set_floats(k, random_floats(ggml_nelements(k), rng));
    set_floats(v, random_floats(ggml_nelements(v), rng));
    if (s) {
        set_floats(s, random_floats(c.n_head, rng));
    }
    // row r is the token at position n_kv - n_rows + r; a per-head mask shifts each head's window
    std::vector<float> mask(ggml_nelements(m));
    for (int64_t h = 0; h < mask_heads; ++h) {
        for (int64_t r = 0; r < c.n_rows; ++r) {
            const int64_t pos    = c.n_kv - c.n_rows + r;
            const int64_t window = c.window > 0 ? c.window + 64 * h : 0;
            for (int64_t j = 0; j < c.n_kv; ++j) {
                const bool visible = j <= pos && (window == 0 || pos - j < window);
                mask[(h * c.n_rows + r) * c.n_kv + j] = visible ? 0.0f : -INFINITY;
            }
        }
    }
    set_floats(m, mask);

    ggml_cpu_set_flash_attn_shared_kv_tiles(shared ? 1 : 0);
    ggml_backend_graph_compute(backend, gf);
    std::vector<float> result(ggml_nelements(out));
    ggml_backend_tensor_get(out, result.data(), 0, ggml_nbytes(out));
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    return result;
}

}  // namespace

int main() {
    log_warnings_only();
    ggml_backend_t backend = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, nullptr);

    std::vector<fa_case> cases;
    // Gemma 3 270M and SmolLM2 135M as they run, then the variants
    for (int64_t n_rows : { 64, 65, 100, 130, 512 }) {
        for (int64_t extra : { 0, 300, 1000 }) {
            cases.push_back({ 256, 4, 1, n_rows, n_rows + extra, 0, false, 0.0f, 0.0f, false, GGML_TYPE_F16 });
            cases.push_back({ 256, 4, 1, n_rows, n_rows + extra, 512, false, 0.0f, 0.0f, false, GGML_TYPE_F16 });
            cases.push_back({ 64, 9, 3, n_rows, n_rows + extra, 0, false, 0.0f, 0.0f, false, GGML_TYPE_F16 });
        }
    }
    cases.push_back({ 128, 8, 8, 200, 777, 0, false, 0.0f, 0.0f, false, GGML_TYPE_F16 });    // no sharing
    cases.push_back({ 128, 16, 2, 150, 600, 0, false, 0.0f, 0.0f, false, GGML_TYPE_F16 });   // 8 heads a KV head
    cases.push_back({ 256, 32, 1, 96, 500, 0, false, 0.0f, 0.0f, false, GGML_TYPE_F16 });    // split in 4 items
    cases.push_back({ 64, 8, 2, 140, 700, 200, true, 0.0f, 0.0f, false, GGML_TYPE_F16 });    // a mask per head
    cases.push_back({ 64, 8, 2, 140, 700, 0, false, 8.0f, 0.0f, false, GGML_TYPE_F16 });     // ALiBi
    cases.push_back({ 64, 6, 2, 140, 700, 0, false, 8.0f, 0.0f, false, GGML_TYPE_F16 });     // ALiBi, 6 heads
    cases.push_back({ 128, 8, 2, 140, 700, 0, false, 0.0f, 30.0f, false, GGML_TYPE_F16 });   // soft-capping
    cases.push_back({ 64, 8, 2, 140, 700, 100, false, 0.0f, 0.0f, true, GGML_TYPE_F16 });    // sinks
    cases.push_back({ 64, 4, 1, 140, 700, 0, false, 0.0f, 0.0f, false, GGML_TYPE_F32 });     // F32 K/V

    int failures = 0, checks = 0;
    for (size_t i = 0; i < cases.size(); ++i) {
        for (int n_threads : { 1, 2, 3 }) {
            ggml_backend_cpu_set_n_threads(backend, n_threads);
            const uint32_t           seed     = 1000 + (uint32_t) i;
            const std::vector<float> shared   = run(backend, cases[i], seed, true);
            const std::vector<float> upstream = run(backend, cases[i], seed, false);
            int differing = 0;
            for (size_t j = 0; j < shared.size(); ++j) {
                differing += memcmp(&shared[j], &upstream[j], sizeof(float)) != 0;
            }
            if (differing) {
                printf("DIFF %s threads=%d differing=%d of %zu\n", cases[i].name().c_str(), n_threads, differing,
                       shared.size());
                ++failures;
            }
            ++checks;
        }
    }
    ggml_backend_free(backend);
    printf("%s: %d of %d (case, threads) checks with differing outputs\n", failures ? "FAIL" : "PASS", failures, checks);
    return failures ? 1 : 0;
}
