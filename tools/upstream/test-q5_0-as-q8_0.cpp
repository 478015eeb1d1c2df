// Q5_0 weights held as Q8_0 blocks (patches/0016) against Q5_0 itself: every output of a matrix
// product must be bitwise equal, for the weight shapes of Gemma 3 270M and odd ones, batches of 1
// to 512 rows (decode steps, pyllamaopt's exact small batches, prefill), 1-3 threads, with
// pyllamaopt's kernel settings and upstream's. Also checks that the switch decides where
// llama.cpp would place such a weight (the widened buffer only when on). Built against the patched
// tree by tools/build_upstream.py, driven by tests/test_q5_0_as_q8_0.py.
//
//   test-q5_0-as-q8_0
//
// Prints "DIFF <case> differing=<k>" for every check whose outputs differ, then "PASS: ..." or
// "FAIL: ..."; exit 0 iff every check is equal.
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "check-common.h"

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr int kRowInvariantBatch = 16;  // pyllamaopt's LLAMA_OPT_ROW_INVARIANT_BATCH

// out = W x with W (Q5_0, k x n) in `buft`, for n_rows rows of x
std::vector<float> run(ggml_backend_t backend, ggml_backend_buffer_type_t buft, const std::vector<uint8_t> & q5,
                       const std::vector<float> & x, int64_t k, int64_t n, int64_t n_rows) {
    ggml_init_params ip  = { ggml_tensor_overhead() * 8 + ggml_graph_overhead(), nullptr, true };
    ggml_context *   wctx = ggml_init(ip);
    ggml_tensor *    w    = ggml_new_tensor_2d(wctx, GGML_TYPE_Q5_0, k, n);
    ggml_backend_buffer_t wbuf = ggml_backend_alloc_ctx_tensors_from_buft(wctx, buft);
    ggml_backend_tensor_set(w, q5.data(), 0, q5.size());

    ggml_context * ctx = ggml_init(ip);
    ggml_tensor *  in  = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, n_rows);
    ggml_tensor *  out = ggml_mul_mat(ctx, w, in);
    ggml_cgraph *  gf  = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, backend);
    ggml_backend_tensor_set(in, x.data(), 0, ggml_nbytes(in));
    ggml_backend_graph_compute(backend, gf);
    std::vector<float> result(n * n_rows);
    ggml_backend_tensor_get(out, result.data(), 0, ggml_nbytes(out));
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    ggml_backend_buffer_free(wbuf);
    ggml_free(wctx);
    return result;
}

}  // namespace

int main() {
    log_warnings_only();
    ggml_backend_t backend = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, nullptr);
    ggml_backend_buffer_type_t plain = ggml_backend_get_default_buffer_type(backend);

    // where llama.cpp would put a Q5_0 weight: the widened buffer only with the switch on
    ggml_init_params ip    = { ggml_tensor_overhead(), nullptr, true };
    ggml_context *   pctx  = ggml_init(ip);
    ggml_tensor *    probe = ggml_new_tensor_2d(pctx, GGML_TYPE_Q5_0, 640, 1024);
    ggml_cpu_set_q5_0_widened(0);
    const ggml_backend_buffer_type_t off = weight_placement(backend, probe);
    ggml_cpu_set_q5_0_widened(1);
    const ggml_backend_buffer_type_t widened = weight_placement(backend, probe);
    ggml_free(pctx);
    printf("switch off: %s; on: %s\n", ggml_backend_buft_name(off), ggml_backend_buft_name(widened));
    if (off != plain || strcmp(ggml_backend_buft_name(widened), "CPU_Q5_0_AS_Q8_0") != 0) {
        printf("FAIL: the switch does not decide where a Q5_0 weight goes\n");
        return 1;
    }

    struct shape { int64_t k, n; };
    const shape shapes[] = { { 640, 1024 }, { 640, 256 }, { 640, 2048 }, { 1024, 640 }, { 96, 7 } };
    std::mt19937 rng(42);
    int failures = 0, checks = 0;
    for (const shape & s : shapes) {
        const std::vector<float> values = random_floats(s.k * s.n, rng, 0.05f);
        std::vector<uint8_t>     q5(ggml_row_size(GGML_TYPE_Q5_0, s.k) * s.n);
        ggml_quantize_chunk(GGML_TYPE_Q5_0, values.data(), q5.data(), 0, s.n, s.k, nullptr);
        for (int64_t n_rows : { 1, 2, 3, 5, 8, 16, 17, 32, 100, 512 }) {
            const std::vector<float> x = random_floats(s.k * n_rows, rng, 1.0f);
            for (int invariant : { kRowInvariantBatch, 0 }) {
                ggml_cpu_set_row_invariant_batch(invariant);
                for (int n_threads : { 1, 2, 3 }) {
                    ggml_backend_cpu_set_n_threads(backend, n_threads);
                    const std::vector<float> a = run(backend, plain, q5, x, s.k, s.n, n_rows);
                    const std::vector<float> b = run(backend, widened, q5, x, s.k, s.n, n_rows);
                    int differing = 0;
                    for (size_t j = 0; j < a.size(); ++j) {
                        differing += memcmp(&a[j], &b[j], sizeof(float)) != 0;
                    }
                    if (differing) {
                        printf("DIFF k=%lld n=%lld rows=%lld row_invariant_batch=%d threads=%d differing=%d of %zu\n",
                               (long long) s.k, (long long) s.n, (long long) n_rows, invariant, n_threads, differing,
                               a.size());
                        ++failures;
                    }
                    ++checks;
                }
            }
        }
    }
    ggml_backend_free(backend);
    printf("%s: %d of %d checks with differing outputs\n", failures ? "FAIL" : "PASS", failures, checks);
    return failures ? 1 : 0;
}
