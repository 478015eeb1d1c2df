// Time per batch of 1..16 rows, side by side in one run, of three kernel choices:
//   upstream   ggml_cpu_set_row_invariant_batch(0): upstream picks kernels by batch size (not exact)
//   one-row    patches/0006: every row of a batch of <= 16 by the one-row kernels, row by row
//   multi-row  patches/0009: the same bits, by kernels that read each weight block once for all rows
// for the matrix products of Gemma 3 270M (per weight type) and for one whole llama_decode of -m's model
// with every row's logits after a context of --context tokens. Driven by benchmarks/row_kernels.py.
//
// --prefill N,M,...: stage 2 of issue 22 instead: prompt processing of N tokens (512-token ubatches)
// with upstream's kernels against every row of every ubatch computed like a one-token decode step
// (the row-invariant batch at any size, with the multi-row kernels; flash attention per query row).
//
//   bench-row-kernels -m model.gguf [--threads 2] [--context 1000] [--reps 7] [--skip-ops] [--skip-decode]
//                     [--prefill 512,4096]
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "llama.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr int kRowInvariantBatch = 16;  // pyllamaopt's LLAMA_OPT_ROW_INVARIANT_BATCH
constexpr int kFaKvTile          = 64;  // pyllamaopt's LLAMA_OPT_FA_KV_TILE
const int     kRows[]            = { 1, 2, 4, 8, 16 };

struct mode {
    const char * name;
    int          invariant_batch;
    int          kernels;
};
const mode kModes[] = { { "upstream", 0, 1 }, { "one-row", kRowInvariantBatch, 0 }, { "multi-row", kRowInvariantBatch, 1 } };
constexpr int kNumModes = 3;

void set_mode(const mode & m) {
    ggml_cpu_set_row_invariant_batch(m.invariant_batch);
    ggml_cpu_set_row_invariant_kernels(m.kernels);
}

double now_ms() {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// runs `step` reps times in each mode, modes interleaved; median ms per mode
std::vector<double> time_modes(int reps, const std::function<void()> & step) {
    std::vector<std::vector<double>> ms(kNumModes);
    for (int r = 0; r < reps + 1; ++r) {
        for (int m = 0; m < kNumModes; ++m) {
            set_mode(kModes[m]);
            const double t0 = now_ms();
            step();
            if (r > 0) {  // the first round warms caches and allocations
                ms[m].push_back(now_ms() - t0);
            }
        }
    }
    std::vector<double> result;
    for (auto & v : ms) {
        result.push_back(median(v));
    }
    return result;
}

void print_header(const char * what) {
    printf("\n%s\n| rows | upstream ms | one-row ms | multi-row ms | one-row / upstream | multi-row / upstream | multi-row / one-row |\n"
           "|---|---|---|---|---|---|---|\n", what);
}

void print_row(int rows, const std::vector<double> & ms) {
    printf("| %d | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f |\n", rows, ms[0], ms[1], ms[2], ms[1] / ms[0], ms[2] / ms[0],
           ms[2] / ms[1]);
    fflush(stdout);
}

ggml_backend_buffer_type_t repack_buft(ggml_backend_t backend) {
    ggml_backend_dev_t dev = ggml_backend_get_device(backend);
    auto get_extra = (ggml_backend_dev_get_extra_bufts_t) ggml_backend_reg_get_proc_address(
        ggml_backend_dev_backend_reg(dev), "ggml_backend_dev_get_extra_bufts");
    for (ggml_backend_buffer_type_t * b = get_extra ? get_extra(dev) : nullptr; b && *b; ++b) {
        if (strcmp(ggml_backend_buft_name(*b), "CPU_REPACK") == 0) {
            return *b;
        }
    }
    return nullptr;
}

void bench_ops(int n_threads, int reps) {
    struct shape {
        ggml_type    type;
        int64_t      k, n;
        const char * what;
    };
    const shape shapes[] = {
        { GGML_TYPE_Q8_0, 640, 262144, "output layer (token_embd)" },
        { GGML_TYPE_Q5_0, 640, 2048, "ffn_gate / ffn_up" },
        { GGML_TYPE_Q5_0, 640, 1024, "attn_q" },
        { GGML_TYPE_Q4_K, 1024, 640, "attn_output (repacked)" },
        { GGML_TYPE_Q4_K, 2048, 640, "ffn_down, half the layers (repacked)" },
        { GGML_TYPE_Q6_K, 2048, 640, "ffn_down, the other half" },
    };
    ggml_backend_t backend = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, nullptr);
    ggml_backend_cpu_set_n_threads(backend, n_threads);
    std::mt19937                          rng(7);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (const shape & s : shapes) {
        ggml_init_params ip   = { ggml_tensor_overhead(), nullptr, true };
        ggml_context *   wctx = ggml_init(ip);
        ggml_tensor *    w    = ggml_new_tensor_2d(wctx, s.type, s.k, s.n);
        ggml_backend_buffer_type_t buft =
            s.type == GGML_TYPE_Q4_K && repack_buft(backend) ? repack_buft(backend) : ggml_backend_get_default_buffer_type(backend);
        ggml_backend_buffer_t wbuf = ggml_backend_alloc_ctx_tensors_from_buft(wctx, buft);
        {
            std::vector<float> values(s.k * s.n);
            for (float & v : values) {
                v = dist(rng) * 0.05f;
            }
            std::vector<uint8_t> data(ggml_nbytes(w));
            ggml_quantize_chunk(s.type, values.data(), data.data(), 0, s.n, s.k, nullptr);
            ggml_backend_tensor_set(w, data.data(), 0, data.size());
        }
        char title[160];
        snprintf(title, sizeof title, "mul_mat %s %lld x %lld: %s, %d threads", ggml_type_name(s.type), (long long) s.k,
                 (long long) s.n, s.what, n_threads);
        print_header(title);
        for (int rows : kRows) {
            ggml_init_params gp  = { ggml_tensor_overhead() * 4 + ggml_graph_overhead(), nullptr, true };
            ggml_context *   ctx = ggml_init(gp);
            ggml_tensor *    x   = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, s.k, rows);
            ggml_tensor *    out = ggml_mul_mat(ctx, w, x);
            ggml_cgraph *    gf  = ggml_new_graph(ctx);
            ggml_build_forward_expand(gf, out);
            ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, backend);
            std::vector<float>    xv(s.k * rows);
            for (float & v : xv) {
                v = dist(rng);
            }
            ggml_backend_tensor_set(x, xv.data(), 0, ggml_nbytes(x));
            print_row(rows, time_modes(reps, [&] { ggml_backend_graph_compute(backend, gf); }));
            ggml_backend_buffer_free(buf);
            ggml_free(ctx);
        }
        ggml_backend_buffer_free(wbuf);
        ggml_free(wctx);
    }
    ggml_backend_free(backend);
}

struct gemma {
    llama_model *    model = nullptr;
    llama_context *  ctx   = nullptr;
    std::vector<int> tokens;  // random ids, as llama-bench uses
    std::string      name;    // for the tables' titles: general.name and the file's name

    gemma(const char * path, int n_threads, int n_ctx, bool swa_view = false) {
        model = llama_model_load_from_file(path, llama_model_default_params());
        if (!model) {
            fprintf(stderr, "cannot load %s\n", path);
            exit(1);
        }
        const char * slash = strrchr(path, '/');
        const char * file  = slash ? slash + 1 : path;
        char         general_name[128];
        name = llama_model_meta_val_str(model, "general.name", general_name, sizeof general_name) > 0 ?
                   std::string(general_name) + " (" + file + ")" :
                   std::string(file);
        llama_context_params cp = llama_context_default_params();
        cp.n_ctx                = n_ctx;
        cp.n_batch = cp.n_ubatch = 512;
        cp.n_threads = cp.n_threads_batch = n_threads;
        cp.flash_attn_type                = LLAMA_FLASH_ATTN_TYPE_ENABLED;
        ctx                               = llama_init_from_model(model, cp);
        if (!ctx) {
            fprintf(stderr, "cannot create a context\n");
            exit(1);
        }
        // as pyllamaopt runs: sliding-window layers given only their window's cells (patches/0013)
        llama_memory_set_swa_view(llama_get_memory(ctx), swa_view);
        const int    n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
        std::mt19937 rng(11);
        tokens.resize(n_ctx);
        for (int & t : tokens) {
            t = 1000 + (int) (rng() % (uint32_t) (n_vocab - 2000));
        }
    }
    ~gemma() {
        llama_free(ctx);
        llama_model_free(model);
    }

    // tokens [first, first + n) at their positions, in batches of 512, logits of every row or none
    void decode(int first, int n, bool logits) {
        for (int i = first; i < first + n; i += 512) {
            const int   m     = std::min(512, first + n - i);
            llama_batch batch = llama_batch_init(m, 0, 1);
            for (int j = 0; j < m; ++j) {
                batch.token[j]     = tokens[i + j];
                batch.pos[j]       = i + j;
                batch.n_seq_id[j]  = 1;
                batch.seq_id[j][0] = 0;
                batch.logits[j]    = logits;
            }
            batch.n_tokens = m;
            if (llama_decode(ctx, batch) != 0) {
                fprintf(stderr, "llama_decode failed\n");
                exit(1);
            }
            llama_batch_free(batch);
        }
        llama_synchronize(ctx);
    }
};

int bench_prefill(const char * model_path, int n_threads, const std::vector<int> & sizes, int reps) {
    const int n_max = *std::max_element(sizes.begin(), sizes.end());
    gemma     g(model_path, n_threads, n_max + 64);
    printf("\nprefill of %s, 512-token ubatches, %d threads: upstream kernels vs every row like a decode step\n"
           "| tokens | upstream tok/s | every row like decode tok/s | time ratio (row-invariant / upstream) |\n|---|---|---|---|\n",
           g.name.c_str(), n_threads);
    const mode invariant_all = { "row-invariant at any size", 1 << 30, 1 };
    for (int n : sizes) {
        std::vector<double> ms[2];
        for (int r = 0; r < reps + 1; ++r) {
            for (int m = 0; m < 2; ++m) {
                set_mode(m == 0 ? kModes[0] : invariant_all);
                llama_memory_clear(llama_get_memory(g.ctx), true);
                const double t0 = now_ms();
                g.decode(0, n, false);
                if (r > 0) {
                    ms[m].push_back(now_ms() - t0);
                }
            }
        }
        const double up = median(ms[0]), inv = median(ms[1]);
        printf("| %d | %.1f | %.1f | %.3f |\n", n, n / up * 1000.0, n / inv * 1000.0, inv / up);
        fflush(stdout);
    }
    return 0;
}

int bench_decode(const char * model_path, int n_threads, int n_context, int reps, bool swa_view) {
    gemma g(model_path, n_threads, n_context + 64, swa_view);
    set_mode(kModes[0]);
    g.decode(0, n_context, false);  // the context, in upstream's prefill
    char title[512];
    snprintf(title, sizeof title, "llama_decode of %s, every row's logits, after %d tokens, %d threads%s",
             g.name.c_str(), n_context, n_threads, swa_view ? ", sliding-window view" : "");
    print_header(title);
    for (int rows : kRows) {
        print_row(rows, time_modes(reps, [&] {
            g.decode(n_context, rows, true);
            llama_memory_seq_rm(llama_get_memory(g.ctx), 0, n_context, -1);
        }));
    }
    return 0;
}

}  // namespace

int main(int argc, char ** argv) {
    const char * model_path = nullptr;
    int          n_threads = 2, n_context = 1000, reps = 7;
    bool         ops = true, decode = true, swa_view = false;
    std::vector<int> prefill;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "-m" && i + 1 < argc) {
            model_path = argv[++i];
        } else if (a == "--threads" && i + 1 < argc) {
            n_threads = atoi(argv[++i]);
        } else if (a == "--context" && i + 1 < argc) {
            n_context = atoi(argv[++i]);
        } else if (a == "--reps" && i + 1 < argc) {
            reps = atoi(argv[++i]);
        } else if (a == "--skip-ops") {
            ops = false;
        } else if (a == "--swa-view") {
            swa_view = true;
        } else if (a == "--skip-decode") {
            decode = false;
        } else if (a == "--prefill" && i + 1 < argc) {
            for (const char * p = argv[++i]; *p; ) {
                prefill.push_back(atoi(p));
                while (*p && *p != ',') {
                    ++p;
                }
                p += *p == ',';
            }
        } else {
            fprintf(stderr, "usage: %s -m model.gguf [--threads N] [--context N] [--reps N] [--skip-ops] [--skip-decode] [--swa-view] [--prefill N,M]\n", argv[0]);
            return 2;
        }
    }
    llama_log_set([](ggml_log_level level, const char * text, void *) {
        if (level >= GGML_LOG_LEVEL_WARN) {
            fputs(text, stderr);
        }
    }, nullptr);
    llama_backend_init();
    ggml_cpu_set_flash_attn_kv_tile(kFaKvTile);  // pyllamaopt's attention tiles in every mode (patches/0003)
    printf("median of %d interleaved runs per mode; modes: upstream = row-invariant batch 0, one-row = patches/0006, "
           "multi-row = patches/0009 (both exact)\n", reps);
    if (!prefill.empty()) {
        return model_path ? bench_prefill(model_path, n_threads, prefill, reps) : 2;
    }
    if (ops) {
        bench_ops(n_threads, reps);
    }
    if (decode && model_path) {
        return bench_decode(model_path, n_threads, n_context, reps, swa_view);
    }
    return 0;
}
