// Batch invariance of ggml's CPU kernels, in the style of llama.cpp's test-backend-ops: every
// output row of a batch must be bitwise equal to the same row computed alone (a batch of one),
// for the weight types of the default model and for flash attention against the one-row decode
// path. Built against the patched tree by tools/build_upstream.py, driven by
// tests/test_row_invariance.py.
//
//   test-row-invariance [--upstream] [--quick] [--one-row-kernels] [--table]
//
// Default: ggml_cpu_set_row_invariant_batch(512) (patches/0006) with the multi-row kernels of
// patches/0009 (--one-row-kernels: without them, row by row), the flash-attention KV tile of
// patches/0003, Q5_0 weights held as Q8_0 (patches/0016) and Q4_1's multi-row vec_dot (patches/0020); exit 0 iff every row of every case equals its one-row result. --upstream: the
// row-invariant batch at 0 (upstream's kernel choice by batch size; Q5_0 as Q5_0), to show that the test
// fails where upstream's kernels change the bits. Each differing (case, batch) is printed as
// "DIFF <case> rows=<n> differing=<k> max_abs=<x>". --table: the row-kernel table of patches/0019 instead:
// for every weight type and 1..16 rows, both paths (the cell's bit set and cleared) give the rows'
// one-row bits; two caller threads computing at once with opposite tables both keep them (each
// graph's threads take the path of its caller's table); the times are taken for that cell only.
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "check-common.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr int kFaKvTile = 64;  // pyllamaopt's LLAMA_OPT_FA_KV_TILE

struct options {
    bool upstream        = false;
    bool quick           = false;
    bool one_row_kernels = false;
    bool table           = false;
};

// The CPU backend, and the buffer type llama.cpp gives each weight.
struct cpu_backend {
    ggml_backend_t backend = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, nullptr);

    ~cpu_backend() { ggml_backend_free(backend); }

    ggml_backend_buffer_type_t weight_buft(ggml_tensor * w) const { return weight_placement(backend, w); }
};

struct compare_result {
    int differing = 0;
    float max_abs = 0.0f;
};

compare_result compare_rows(const float * batch, const float * alone, int64_t row_len, int64_t n_rows) {
    compare_result r;
    for (int64_t i = 0; i < n_rows; ++i) {
        const float * a = batch + i * row_len;
        const float * b = alone + i * row_len;
        if (memcmp(a, b, row_len * sizeof(float)) != 0) {
            ++r.differing;
            for (int64_t j = 0; j < row_len; ++j) {
                r.max_abs = std::fmax(r.max_abs, std::fabs(a[j] - b[j]));
            }
        }
    }
    return r;
}

// out = W x for the first n_rows rows of `x` (K floats each), in one graph of n_rows rows.
struct mul_mat_case {
    ggml_type             type;
    int64_t               k, n;
    ggml_context *        wctx = nullptr;
    ggml_backend_buffer_t wbuf = nullptr;
    ggml_tensor *         w    = nullptr;

    mul_mat_case(cpu_backend & cpu, ggml_type type, int64_t k, int64_t n, std::mt19937 & rng) : type(type), k(k), n(n) {
        ggml_init_params ip = { ggml_tensor_overhead() * 2, nullptr, true };
        wctx = ggml_init(ip);
        w    = ggml_new_tensor_2d(wctx, type, k, n);
        wbuf = ggml_backend_alloc_ctx_tensors_from_buft(wctx, cpu.weight_buft(w));
        const std::vector<float> values = random_floats(k * n, rng, 0.05f);
        std::vector<uint8_t>     data(ggml_nbytes(w));
        if (type == GGML_TYPE_F32) {
            memcpy(data.data(), values.data(), data.size());
        } else if (type == GGML_TYPE_F16) {
            ggml_fp32_to_fp16_row(values.data(), (ggml_fp16_t *) data.data(), k * n);
        } else {
            ggml_quantize_chunk(type, values.data(), data.data(), 0, n, k, nullptr);
        }
        ggml_backend_tensor_set(w, data.data(), 0, data.size());
    }
    ~mul_mat_case() {
        ggml_backend_buffer_free(wbuf);
        ggml_free(wctx);
    }

    std::string name() const {
        return std::string("mul_mat ") + ggml_type_name(type) + " k=" + std::to_string(k) + " n=" + std::to_string(n);
    }
    int64_t row_len() const { return n; }

    std::vector<float> run(cpu_backend & cpu, const float * x, int64_t n_rows) const {
        ggml_init_params ip  = { ggml_tensor_overhead() * 8 + ggml_graph_overhead(), nullptr, true };
        ggml_context *   ctx = ggml_init(ip);
        ggml_tensor *    in  = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, n_rows);
        ggml_tensor *    out = ggml_mul_mat(ctx, w, in);
        ggml_cgraph *    gf  = ggml_new_graph(ctx);
        ggml_build_forward_expand(gf, out);
        ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, cpu.backend);
        ggml_backend_tensor_set(in, x, 0, ggml_nbytes(in));
        ggml_backend_graph_compute(cpu.backend, gf);
        std::vector<float> result(n * n_rows);
        ggml_backend_tensor_get(out, result.data(), 0, ggml_nbytes(out));
        ggml_backend_buffer_free(buf);
        ggml_free(ctx);
        return result;
    }
};

// Flash attention as Gemma 3 270M runs it (head size 256, 4 query heads, 1 KV head) or SmolLM2
// (64, 9 query heads on 3 KV heads), F16 KV cache, causal mask: query rows at consecutive
// positions ending at the last KV cell.
struct flash_attn_case {
    int64_t            d, n_head, n_head_kv, n_kv;
    std::vector<float> k, v;  // [n_head_kv][n_kv][d]

    flash_attn_case(int64_t d, int64_t n_head, int64_t n_head_kv, int64_t n_kv, std::mt19937 & rng) :
        d(d), n_head(n_head), n_head_kv(n_head_kv), n_kv(n_kv) {
        k = random_floats(n_head_kv * n_kv * d, rng, 1.0f);
        v = random_floats(n_head_kv * n_kv * d, rng, 1.0f);
    }

    std::string name() const {
        return "flash_attn_ext d=" + std::to_string(d) + " heads=" + std::to_string(n_head) + "/" +
               std::to_string(n_head_kv) + " n_kv=" + std::to_string(n_kv);
    }
    int64_t row_len() const { return d * n_head; }

    // rows `first .. first+n_rows` of a batch whose last row sits at position n_kv - 1 (x holds
    // the queries of all `total` rows, [total][n_head][d])
    std::vector<float> run(cpu_backend & cpu, const float * q_all, int64_t total, int64_t first, int64_t n_rows) const {
        ggml_init_params ip  = { ggml_tensor_overhead() * 16 + ggml_graph_overhead(), nullptr, true };
        ggml_context *   ctx = ggml_init(ip);
        ggml_tensor *    q   = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, d, n_head, n_rows);
        ggml_tensor *    kt  = ggml_new_tensor_3d(ctx, GGML_TYPE_F16, d, n_kv, n_head_kv);
        ggml_tensor *    vt  = ggml_new_tensor_3d(ctx, GGML_TYPE_F16, d, n_kv, n_head_kv);
        ggml_tensor *    m   = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, n_kv, n_rows);
        ggml_tensor *    qp  = ggml_permute(ctx, q, 0, 2, 1, 3);  // [d, rows, heads] as llama.cpp builds it
        ggml_tensor *    out = ggml_flash_attn_ext(ctx, qp, kt, vt, m, 1.0f / sqrtf((float) d), 0.0f, 0.0f);
        ggml_flash_attn_ext_set_prec(out, GGML_PREC_F32);
        ggml_cgraph * gf = ggml_new_graph(ctx);
        ggml_build_forward_expand(gf, out);
        ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, cpu.backend);

        ggml_backend_tensor_set(q, q_all + first * n_head * d, 0, ggml_nbytes(q));
        std::vector<ggml_fp16_t> h(k.size());
        ggml_fp32_to_fp16_row(k.data(), h.data(), h.size());
        ggml_backend_tensor_set(kt, h.data(), 0, ggml_nbytes(kt));
        ggml_fp32_to_fp16_row(v.data(), h.data(), h.size());
        ggml_backend_tensor_set(vt, h.data(), 0, ggml_nbytes(vt));
        std::vector<float> mask(n_kv * n_rows);
        for (int64_t r = 0; r < n_rows; ++r) {
            const int64_t pos = n_kv - total + first + r;  // the row's own cell; later cells are masked
            for (int64_t j = 0; j < n_kv; ++j) {
                mask[r * n_kv + j] = j <= pos ? 0.0f : -INFINITY;
            }
        }
        std::vector<ggml_fp16_t> mh(mask.size());
        ggml_fp32_to_fp16_row(mask.data(), mh.data(), mh.size());
        ggml_backend_tensor_set(m, mh.data(), 0, ggml_nbytes(m));

        ggml_backend_graph_compute(cpu.backend, gf);
        std::vector<float> result(row_len() * n_rows);
        ggml_backend_tensor_get(out, result.data(), 0, ggml_nbytes(out));
        ggml_backend_buffer_free(buf);
        ggml_free(ctx);
        return result;
    }
};

int report(const std::string & name, int64_t n_rows, int n_threads, const compare_result & r) {
    if (r.differing == 0) {
        return 0;
    }
    printf("DIFF %s threads=%d rows=%lld differing=%d max_abs=%g\n", name.c_str(), n_threads, (long long) n_rows,
           r.differing, r.max_abs);
    return 1;
}

std::vector<int64_t> batch_sizes(const options & opt) {
    std::vector<int64_t> sizes;
    if (opt.table) {
        for (int64_t b = 1; b <= GGML_CPU_ROW_KERNEL_MAX_ROWS; ++b) {
            sizes.push_back(b);
        }
        return sizes;
    }
    for (int64_t b = 2; b <= (opt.quick ? 17 : 64); ++b) {
        sizes.push_back(b);
    }
    sizes.push_back(128);
    if (!opt.quick) {
        sizes.push_back(512);
    }
    return sizes;
}

// The caller's table: every cell multi-row (all set) or row by row (all clear), but bit `rows` of
// `type`'s mask flipped when `flip`.
std::vector<uint32_t> kernel_table(bool multi, ggml_type type, int64_t rows, bool flip) {
    std::vector<uint32_t> masks(GGML_TYPE_COUNT, multi ? UINT32_MAX : 0u);
    if (flip) {
        masks[type] ^= 1u << rows;
    }
    return masks;
}

// --table, one matrix: each row count's batch under four tables (all multi-row or all row by row, with
// that cell's bit flipped or not) equals the rows computed alone row by row; a timed run adds time and
// the weight's elements to that (type, rows) cell only.
int table_checks(cpu_backend & cpu, const mul_mat_case & mm, const std::vector<float> & x, const std::vector<float> & alone,
                 int & checks) {
    int failures = 0;
    for (int n_threads : { 2, 3 }) {
        ggml_backend_cpu_set_n_threads(cpu.backend, n_threads);
        for (int64_t rows = 1; rows <= GGML_CPU_ROW_KERNEL_MAX_ROWS; ++rows) {
            for (int variant = 0; variant < 4; ++variant) {
                const std::vector<uint32_t> masks = kernel_table(variant & 1, mm.type, rows, variant & 2);
                ggml_cpu_set_row_invariant_kernel_table(masks.data(), 0);
                const std::vector<float> batch = mm.run(cpu, x.data(), rows);
                failures += report(mm.name() + " table=" + std::to_string(variant), rows, n_threads,
                                   compare_rows(batch.data(), alone.data(), mm.n, rows));
                ++checks;
            }
        }
    }
    uint64_t ns[GGML_TYPE_COUNT][GGML_CPU_ROW_KERNEL_MAX_ROWS + 1]   = {};
    uint64_t work[GGML_TYPE_COUNT][GGML_CPU_ROW_KERNEL_MAX_ROWS + 1] = {};
    ggml_cpu_take_row_invariant_kernel_times(ns, work);  // untimed runs: nothing
    for (int t = 0; t < GGML_TYPE_COUNT; ++t) {
        for (int r = 0; r <= GGML_CPU_ROW_KERNEL_MAX_ROWS; ++r) {
            if (ns[t][r] || work[t][r]) {
                printf("DIFF %s untimed runs timed: type %s rows %d\n", mm.name().c_str(), ggml_type_name((ggml_type) t), r);
                ++failures;
            }
        }
    }
    ggml_cpu_set_row_invariant_kernel_table(nullptr, 1);
    mm.run(cpu, x.data(), 5);
    ggml_cpu_set_row_invariant_kernel_table(nullptr, 0);
    ggml_cpu_take_row_invariant_kernel_times(ns, work);
    // timed only where this build has a multi-row kernel for the type (the driver checks which)
    const bool timed = work[mm.type][5] > 0;
    printf("timed %s rows 5: %s\n", mm.name().c_str(), timed ? "yes" : "no");
    for (int t = 0; t < GGML_TYPE_COUNT; ++t) {
        for (int r = 0; r <= GGML_CPU_ROW_KERNEL_MAX_ROWS; ++r) {
            const bool cell = timed && t == mm.type && r == 5;
            if ((ns[t][r] > 0) != cell || work[t][r] != (cell ? (uint64_t) (mm.k * mm.n) : 0)) {
                printf("DIFF %s times: type %s rows %d ns %llu work %llu\n", mm.name().c_str(),
                       ggml_type_name((ggml_type) t), r, (unsigned long long) ns[t][r], (unsigned long long) work[t][r]);
                ++failures;
            }
        }
    }
    ++checks;
    return failures;
}

// --table, two callers at once, each with its own backend of 2 threads, their tables opposite and
// swapped every round: every batch keeps the rows' bits (a thread reading another caller's table, or
// one switch for all, would split an op between the two paths and leave outputs uncomputed).
int concurrent_table_checks(const mul_mat_case & mm, const std::vector<float> & x, const std::vector<float> & alone,
                            int & checks) {
    int failures[2] = {};
    auto caller = [&](int who) {
        cpu_backend cpu;
        ggml_backend_cpu_set_n_threads(cpu.backend, 2);
        for (int round = 0; round < 200; ++round) {
            const int64_t rows = 2 + round % (GGML_CPU_ROW_KERNEL_MAX_ROWS - 1);
            const std::vector<uint32_t> masks = kernel_table((round + who) % 2, mm.type, rows, false);
            ggml_cpu_set_row_invariant_kernel_table(masks.data(), 0);
            const std::vector<float> batch = mm.run(cpu, x.data(), rows);
            failures[who] += report(mm.name() + " concurrent caller " + std::to_string(who), rows, 2,
                                    compare_rows(batch.data(), alone.data(), mm.n, rows));
        }
    };
    std::thread other(caller, 1);
    caller(0);
    other.join();
    checks += 400;
    return failures[0] + failures[1];
}

}  // namespace

int main(int argc, char ** argv) {
    options opt;
    for (int i = 1; i < argc; ++i) {
        if (strcmp(argv[i], "--upstream") == 0) {
            opt.upstream = true;
        } else if (strcmp(argv[i], "--quick") == 0) {
            opt.quick = true;
        } else if (strcmp(argv[i], "--one-row-kernels") == 0) {
            opt.one_row_kernels = true;
        } else if (strcmp(argv[i], "--table") == 0) {
            opt.table = true;
        } else {
            fprintf(stderr, "usage: %s [--upstream] [--quick] [--one-row-kernels] [--table]\n", argv[0]);
            return 2;
        }
    }
    log_warnings_only();
    ggml_cpu_set_flash_attn_kv_tile(kFaKvTile);
    const std::vector<int64_t> sizes    = batch_sizes(opt);
    const int64_t              max_rows = sizes.back();
    ggml_cpu_set_row_invariant_batch(opt.upstream ? 0 : (int) max_rows);
    ggml_cpu_set_row_invariant_kernels(opt.one_row_kernels ? 0 : 1);
    ggml_cpu_set_q5_0_widened(opt.upstream ? 0 : 1);  // Q5_0 weights as pyllamaopt holds them (patches/0016)
    ggml_cpu_set_q4_1_rows(opt.upstream ? 0 : 1);      // as pyllamaopt sets it (patches/0020)

    cpu_backend  cpu;
    std::mt19937 rng(1234);
    int          failures = 0, checks = 0;

    struct shape {
        ggml_type type;
        int64_t   k, n;
    };
    // Gemma 3 270M's matrices: attn_q / ffn_gate (640 -> 1024 / 2048), ffn_down (2048 -> 640),
    // attn_output (1024 -> 640); K-quants need K % 256 == 0; SmolLM2's Q4_1 ffn_gate (576 -> 1536)
    const std::vector<shape> shapes = {
        { GGML_TYPE_Q8_0, 640, 1024 }, { GGML_TYPE_Q8_0, 2048, 640 }, { GGML_TYPE_Q5_0, 640, 2048 },
        { GGML_TYPE_Q5_0, 2048, 640 }, { GGML_TYPE_Q4_K, 1024, 640 }, { GGML_TYPE_Q4_K, 2048, 640 },
        { GGML_TYPE_Q6_K, 2048, 640 }, { GGML_TYPE_F32, 640, 256 },   { GGML_TYPE_F16, 640, 256 },
        { GGML_TYPE_Q4_0, 640, 1024 },  // repacked (8x8) on AVX2, as llama.cpp places it: no multi-row gemv
        { GGML_TYPE_Q4_1, 576, 1536 },
    };
    const std::vector<float> x = random_floats(max_rows * 2048, rng, 1.0f);
    for (const shape & s : shapes) {
        mul_mat_case       mm(cpu, s.type, s.k, s.n, rng);
        std::vector<float> alone(max_rows * s.n);
        ggml_backend_cpu_set_n_threads(cpu.backend, 1);
        const std::vector<uint32_t> row_by_row = kernel_table(false, s.type, 0, false);
        ggml_cpu_set_row_invariant_kernel_table(opt.table ? row_by_row.data() : nullptr, 0);
        for (int64_t r = 0; r < max_rows; ++r) {
            const std::vector<float> one = mm.run(cpu, x.data() + r * s.k, 1);
            memcpy(alone.data() + r * s.n, one.data(), s.n * sizeof(float));
        }
        if (opt.table) {
            const int case_failures = table_checks(cpu, mm, x, alone, checks) +
                (s.type == GGML_TYPE_Q8_0 || s.type == GGML_TYPE_Q5_0 ? concurrent_table_checks(mm, x, alone, checks) : 0);
            printf("%s %s table\n", case_failures ? "FAIL" : "ok  ", mm.name().c_str());
            failures += case_failures;
            continue;
        }
        int case_failures = 0;
        for (int n_threads : { 2, 3 }) {
            ggml_backend_cpu_set_n_threads(cpu.backend, n_threads);
            for (int64_t rows : sizes) {
                const std::vector<float> batch = mm.run(cpu, x.data(), rows);
                case_failures += report(mm.name(), rows, n_threads, compare_rows(batch.data(), alone.data(), s.n, rows));
                ++checks;
            }
        }
        printf("%s %s\n", case_failures ? "FAIL" : "ok  ", mm.name().c_str());
        failures += case_failures;
    }

    // KV lengths of 1..12 tiles, not multiples of the tile, so the rows' last cells cross tiles
    struct fa_shape {
        int64_t d, n_head, n_head_kv, n_kv;
    };
    std::vector<fa_shape> fa_shapes = { { 256, 4, 1, 100 }, { 256, 4, 1, 300 }, { 256, 4, 1, 700 }, { 64, 9, 3, 300 } };
    if (opt.table) {
        fa_shapes.clear();  // attention takes no weights: the table does not apply
    }
    for (const fa_shape & shape : fa_shapes) {
        flash_attn_case          fa(shape.d, shape.n_head, shape.n_head_kv, shape.n_kv, rng);
        const int64_t            n_kv  = shape.n_kv;
        const int64_t            total = std::min<int64_t>(opt.quick ? 17 : 64, n_kv);
        const std::vector<float> q     = random_floats(total * fa.row_len(), rng, 1.0f);
        std::vector<float>       alone(total * fa.row_len());
        ggml_backend_cpu_set_n_threads(cpu.backend, 1);
        for (int64_t r = 0; r < total; ++r) {
            const std::vector<float> one = fa.run(cpu, q.data(), total, r, 1);
            memcpy(alone.data() + r * fa.row_len(), one.data(), fa.row_len() * sizeof(float));
        }
        int case_failures = 0;
        for (int n_threads : { 2, 3 }) {
            ggml_backend_cpu_set_n_threads(cpu.backend, n_threads);
            // a batch of the last `rows` rows (a memo check ends at the newest cell)
            for (int64_t rows = 2; rows <= total; ++rows) {
                const int64_t            first = total - rows;
                const std::vector<float> batch = fa.run(cpu, q.data(), total, first, rows);
                case_failures += report(fa.name(), rows, n_threads,
                                        compare_rows(batch.data(), alone.data() + first * fa.row_len(), fa.row_len(), rows));
                ++checks;
            }
        }
        printf("%s %s\n", case_failures ? "FAIL" : "ok  ", fa.name().c_str());
        failures += case_failures;
    }

    printf("%s: %d of %d (case, batch, threads) checks with differing rows (%s kernels)\n",
           failures ? "FAIL" : "PASS", failures, checks,
           opt.upstream ? "upstream" : opt.one_row_kernels ? "one-row" : opt.table ? "table-chosen" : "row-invariant multi-row");
    return failures ? 1 : 0;
}
