// What the check programs of tools/upstream share.
#pragma once

#include "ggml-backend.h"
#include "ggml.h"

#include <cstdio>
#include <random>
#include <vector>

inline std::vector<float> random_floats(size_t n, std::mt19937 & rng, float scale = 1.0f) {
    std::normal_distribution<float> dist(0.0f, scale);
    std::vector<float>              v(n);
    for (float & x : v) {
        x = dist(rng);
    }
    return v;
}

// ggml's log: warnings and errors only
inline void log_warnings_only() {
    ggml_log_set([](ggml_log_level level, const char * text, void *) {
        if (level >= GGML_LOG_LEVEL_WARN) {
            fputs(text, stderr);
        }
    }, nullptr);
}

// The buffer type llama.cpp gives a weight (llama-model.cpp, weight_buft_supported): the first of
// the CPU backend's extra buffer types that takes the weight's matrix product (repacked Q4_K on
// AVX2, Q5_0 held as Q8_0 with patches/0016 on; none in a build without SIMD), else the default.
inline ggml_backend_buffer_type_t weight_placement(ggml_backend_t backend, ggml_tensor * w) {
    ggml_backend_dev_t dev       = ggml_backend_get_device(backend);
    auto               get_extra = (ggml_backend_dev_get_extra_bufts_t) ggml_backend_reg_get_proc_address(
        ggml_backend_dev_backend_reg(dev), "ggml_backend_dev_get_extra_bufts");
    ggml_init_params           ip     = { ggml_tensor_overhead() * 2, nullptr, true };
    ggml_context *             ctx    = ggml_init(ip);
    ggml_tensor *              op     = ggml_mul_mat(ctx, w, ggml_new_tensor_2d(ctx, GGML_TYPE_F32, w->ne[0], 1));
    ggml_backend_buffer_type_t chosen = ggml_backend_get_default_buffer_type(backend);
    for (ggml_backend_buffer_type_t * b = get_extra ? get_extra(dev) : nullptr; b && *b; ++b) {
        ggml_backend_buffer_t dummy = ggml_backend_buft_alloc_buffer(*b, 0);
        w->buffer                   = dummy;
        const bool takes            = ggml_backend_dev_supports_op(dev, op);
        w->buffer                   = nullptr;
        ggml_backend_buffer_free(dummy);
        if (takes) {
            chosen = *b;
            break;
        }
    }
    ggml_free(ctx);
    return chosen;
}
